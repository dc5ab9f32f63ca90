"""A soak on one database: workers, enqueuers and pruning at once; what deadlocks reach anyone?

    .venv/bin/python benchmarks/bench_soak.py mysql://root@127.0.0.1:3306/jg_soak
    .venv/bin/python benchmarks/bench_soak.py mysql://root@127.0.0.1:3306/jg_soak --jobs 20000

``--processes`` worker processes of ``--threads`` threads each drain ``--jobs`` jobs while
``--enqueuers`` processes are still enqueueing them (a quarter under idempotency keys, a
quarter ``atomic=True``, a quarter locked per job) and a pruner deletes finished rows in bulk
every few seconds: the three classes of InnoDB deadlock that job tables are known for (an
insert against a claim's gap lock, a shared-to-exclusive upgrade on a key, bulk deletes beside
inserts and claims). At the end it prints what reached a caller or a worker log as a failure
(tracebacks naming a deadlock or a lock-wait timeout), the statements the store retried itself
(``statement_retried``, also the ``jobguard_store_statement_retries_total`` metric), and the
jobs' final states. The database must exist (utf8mb4 on MariaDB/MySQL); its job tables are
emptied first.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEADLOCK = re.compile(r"Deadlock found|Lock wait timeout|\b1213\b|\b1205\b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="mysql:// or postgres:// URL of an existing database")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--enqueuers", type=int, default=2)
    parser.add_argument("--prune-every", type=float, default=3.0, help="seconds between prune passes")
    parser.add_argument(
        "--enqueue-child", nargs=2, type=int, metavar=("START", "COUNT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()

    os.environ["BENCH_DATABASE_URL"] = args.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.jobguard_settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    if args.enqueue_child:
        enqueue(*args.enqueue_child)
        return
    soak(args)


def enqueue(start: int, count: int) -> None:
    """One enqueuer: ``count`` jobs one by one, each kind in turn (a caller's view of deadlocks)."""
    from benchmarks.jobguard_app.tasks import noop, noop_atomic, noop_locked

    for i in range(start, start + count):
        kind = i % 4
        if kind == 0:
            noop.enqueue(i)
        elif kind == 1:
            noop.using(idempotency_key=f"soak:{i}").enqueue(i)
        elif kind == 2:
            noop_atomic.enqueue(i)
        else:
            noop_locked.enqueue(i)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _logging_settings(log_dir: Path) -> Path:
    """A settings module that logs the package at INFO, so statement retries are counted."""
    module = log_dir / "soak_settings.py"
    module.write_text(
        "from benchmarks.jobguard_settings import *  # noqa: F403\n"
        "LOGGING = {'version': 1, 'disable_existing_loggers': False,\n"
        " 'handlers': {'console': {'class': 'logging.StreamHandler'}},\n"
        " 'loggers': {'django_jobguard': {'handlers': ['console'], 'level': 'INFO'}}}\n"
    )
    return module


def soak(args: argparse.Namespace) -> None:
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Count

    from django_jobguard.models import IdempotencyKey, Job

    call_command("migrate", verbosity=0)
    IdempotencyKey.objects.all().delete()
    Job.objects.all().delete()

    log_dir = Path(tempfile.mkdtemp(prefix="jg-soak-"))
    _logging_settings(log_dir)
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(log_dir), env["PYTHONPATH"]])
    env["DJANGO_SETTINGS_MODULE"] = "soak_settings"

    def spawn(name: str, command: list[str]) -> subprocess.Popen[bytes]:
        out = (log_dir / f"{name}.log").open("wb")
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    django_cmd = [sys.executable, "-m", "django"]
    started = time.perf_counter()
    workers = [
        spawn(f"worker{n}", [*django_cmd, "jobguard_worker", "--concurrency", str(args.threads)])
        for n in range(args.processes)
    ]
    share = args.jobs // args.enqueuers
    enqueuers = [
        spawn(
            f"enqueuer{n}",
            [sys.executable, str(Path(__file__)), args.url, "--enqueue-child", str(n * share), str(share)],
        )
        for n in range(args.enqueuers)
    ]
    total = share * args.enqueuers
    prunes = 0
    try:
        next_prune = time.monotonic() + args.prune_every
        deadline = time.monotonic() + max(600.0, total / 20)
        while time.monotonic() < deadline:
            done = Job.objects.filter(status="succeeded").count()
            pruned_away = total - Job.objects.count() if all(p.poll() is not None for p in enqueuers) else 0
            if done + pruned_away >= total and all(p.poll() is not None for p in enqueuers):
                break
            if time.monotonic() >= next_prune:
                # Finished rows deleted in bulk while inserts and claims go on.
                subprocess.run(
                    [*django_cmd, "jobguard_prune", "--jobs-older-than", "1", "--batch-size", "500"],
                    cwd=ROOT,
                    env=env,
                    stdout=(log_dir / f"prune{prunes}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                    check=False,
                )
                prunes += 1
                next_prune = time.monotonic() + args.prune_every
            time.sleep(0.5)
        elapsed = time.perf_counter() - started
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers + enqueuers:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()

    logs = {path.name: path.read_text(errors="replace") for path in sorted(log_dir.glob("*.log"))}
    surfaced = {name: len(DEADLOCK.findall(text)) for name, text in logs.items() if "Traceback" in text}
    retried = sum(text.count("statement_retried") for text in logs.values())
    by_reason = {
        reason: sum(text.count(f"reason={reason}") for text in logs.values())
        for reason in ("deadlock", "lock_wait_timeout")
    }
    enqueuer_failures = [p.returncode for p in enqueuers if p.returncode]
    states = dict(Job.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    left = Job.objects.exclude(status="succeeded").count()

    print(
        f"{connection.vendor} {connection.get_database_version()}: {args.processes} processes x "
        f"{args.threads} threads, {args.enqueuers} enqueuers, {total:,} jobs, {prunes} prune passes"
    )
    rows = [
        ("wall time, s", f"{elapsed:,.1f}"),
        ("jobs/s (enqueued and drained at once)", f"{total / elapsed:,.0f}"),
        (
            "deadlocks or lock-wait timeouts reaching a caller or a log as a failure",
            str(sum(surfaced.values())),
        ),
        ("enqueuer processes that failed", str(len(enqueuer_failures))),
        ("statements the store retried itself", str(retried)),
        ("  of them after a deadlock", str(by_reason["deadlock"])),
        ("  of them after a lock-wait timeout", str(by_reason["lock_wait_timeout"])),
        ("jobs not succeeded at the end (rows left)", str(left)),
        (
            "job rows by status at the end (after pruning)",
            ", ".join(f"{k} {v}" for k, v in sorted(states.items())),
        ),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"| {'figure':<{width}} | value |")
    print(f"| {'-' * width} | ----- |")
    for name, value in rows:
        print(f"| {name:<{width}} | {value} |")
    print(f"logs: {log_dir}")
    if surfaced or enqueuer_failures or left:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
