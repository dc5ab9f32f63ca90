"""Enqueue rate, drain rate and pickup latency of django-jobguard on one database, medians of runs.

For the databases the main harness (``bench_peers.py``, PostgreSQL-only) does not drive: MariaDB and
MySQL, and PostgreSQL beside them for a figure from the same machine and method.

    .venv/bin/python benchmarks/bench_by_database.py mysql://root@127.0.0.1:3306/jg_bench_maria
    .venv/bin/python benchmarks/bench_by_database.py postgres://postgres@127.0.0.1:5432/jg_bench --runs 5
    .venv/bin/python benchmarks/bench_by_database.py mysql://root@127.0.0.1:3306/jg_bench_maria --wakeup redis://127.0.0.1:6379/5

The database must exist (utf8mb4 on MariaDB/MySQL); its job table is emptied between rounds.
Per round: ``--jobs`` no-op jobs enqueued one by one (enqueue rate), then drained by 2
``jobguard_worker --burst --concurrency 2`` processes (drain rate, first start to last exit),
then ``--pickups`` jobs enqueued one at a time for one idle worker with the default
``POLL_INTERVAL`` (enqueue-to-start, from the database clock); ``--wakeup REDIS_URL`` sets
``JOBGUARD["WAKEUP_CACHE"]`` so enqueues wake that worker through Redis pub/sub. Prints a table
of medians with min-max.

``--system dtdb`` measures the same for django-tasks with the django-tasks-db back end, the
Django peer that also keeps its tasks in the project's database: it runs in
``benchmarks/.venv-peers`` (created by ``bench_peers.py``'s installer; mysqlclient is added for a
mysql:// URL), with 2 ``db_worker --batch`` processes (one task at a time each) for the drain
and one idle ``db_worker`` for the pickups (its default 1 s poll).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="postgres:// or mysql:// URL of an existing database")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--pickups", type=int, default=20)
    parser.add_argument("--wakeup", metavar="REDIS_URL", help="wake idle workers through this Redis")
    parser.add_argument("--system", choices=("jobguard", "dtdb"), default="jobguard")
    args = parser.parse_args()
    if args.system == "dtdb" and not os.environ.get("BENCH_IN_PEERS_VENV"):
        raise SystemExit(_in_peers_venv(args.url))
    if args.wakeup:
        os.environ["BENCH_REDIS_URL"] = args.wakeup
        os.environ["BENCH_JOBGUARD"] = json.dumps({"WAKEUP_CACHE": "redis"})

    os.environ["BENCH_DATABASE_URL"] = args.url
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS[args.system]
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    one_round = {"jobguard": jobguard_round, "dtdb": dtdb_round}[args.system]
    rounds = [one_round(args.jobs, args.pickups) for _ in range(args.runs)]
    drained_by = "2 processes x 2 threads" if args.system == "jobguard" else "2 processes"
    rows = [
        ("enqueue() one by one, jobs/s", [r["enqueue"] for r in rounds]),
        (f"drain, {drained_by}, jobs/s", [r["drain"] for r in rounds]),
        ("enqueue to start, idle worker, p50 ms", [r["p50"] for r in rounds]),
        ("enqueue to start, idle worker, p95 ms", [r["p95"] for r in rounds]),
    ]
    from django.db import connection

    wakeup = "NOTIFY" if connection.vendor == "postgresql" else "no wake-up"
    if args.wakeup:
        wakeup = "Redis wake-ups"
    if args.system == "dtdb":
        import django_tasks_db

        wakeup = f"django-tasks-db {getattr(django_tasks_db, '__version__', '')}".rstrip()
    version = connection.get_database_version()
    print(f"{connection.vendor} {version}, {args.runs} runs, {args.jobs} jobs, {wakeup}")
    print(f"| {'figure':<42} | {'median':>9} | {'min-max':>19} |")
    print(f"| {'-' * 42} | {'-' * 9} | {'-' * 19} |")
    for name, values in rows:
        spread = f"{min(values):,.0f}-{max(values):,.0f}"
        print(f"| {name:<42} | {statistics.median(values):>9,.0f} | {spread:>19} |")


SETTINGS = {"jobguard": "benchmarks.jobguard_settings", "dtdb": "benchmarks.peers.dtdb_settings"}


def _in_peers_venv(url: str) -> int:
    """Run this command again with benchmarks/.venv-peers's Python (django-tasks-db lives there)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_peers import ensure_peers_venv

    python = ensure_peers_venv(skip_install=False)
    if url.startswith(("mysql", "mariadb")):
        subprocess.run([python, "-m", "pip", "-q", "install", "mysqlclient"], check=True)
    env = {**_env(), "BENCH_IN_PEERS_VENV": "1"}
    return subprocess.run([python, __file__, *sys.argv[1:]], env=env, check=False).returncode


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _worker(*extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "django", "jobguard_worker", "--concurrency", "2", *extra]
    quiet = subprocess.DEVNULL
    return subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=quiet, stderr=quiet)


def _db_worker(*extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "django", "db_worker", "--queue-name", "default", "--verbosity", "0"]
    command += ["--no-startup-delay", *extra]
    quiet = subprocess.DEVNULL
    return subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=quiet, stderr=quiet)


def dtdb_round(jobs: int, pickups: int) -> dict[str, float]:
    """One round of django-tasks-db: the same three measures as :func:`jobguard_round`."""
    from django.db.models import F
    from django_tasks_db.models import DBTaskResult

    from benchmarks.peers.dtdb_tasks import noop

    DBTaskResult.objects.all().delete()
    started = time.perf_counter()
    for i in range(jobs):
        noop.enqueue(i)
    enqueue_rate = jobs / (time.perf_counter() - started)

    started = time.perf_counter()
    procs = [_db_worker("--batch"), _db_worker("--batch")]
    for proc in procs:
        proc.wait(timeout=1200)
    drain_rate = jobs / (time.perf_counter() - started)
    if DBTaskResult.objects.filter(status="SUCCESSFUL").count() != jobs:
        raise SystemExit("the drain left tasks behind")

    DBTaskResult.objects.all().delete()
    idle = _db_worker()
    try:
        noop.enqueue(-1)
        _wait(lambda: DBTaskResult.objects.filter(status="SUCCESSFUL").exists(), "the worker to start")
        first = set(DBTaskResult.objects.values_list("id", flat=True))
        for i in range(pickups):
            result = noop.enqueue(i)
            _wait(DBTaskResult.objects.filter(id=result.id, started_at__isnull=False).exists, "a pickup")
            time.sleep(0.05 + (i % 7) * 0.1)
        waits = [
            row.total_seconds() * 1000
            for row in DBTaskResult.objects.exclude(id__in=first)
            .annotate(wait=F("started_at") - F("enqueued_at"))
            .values_list("wait", flat=True)
        ]
    finally:
        idle.send_signal(signal.SIGTERM)
        idle.wait(timeout=60)
    waits.sort()
    return {
        "enqueue": enqueue_rate,
        "drain": drain_rate,
        "p50": statistics.median(waits),
        "p95": waits[min(len(waits) - 1, round(0.95 * (len(waits) - 1)))],
    }


def jobguard_round(jobs: int, pickups: int) -> dict[str, float]:
    from django.db.models import F

    from benchmarks.jobguard_app.tasks import noop
    from django_jobguard.models import Job

    Job.objects.all().delete()
    started = time.perf_counter()
    for i in range(jobs):
        noop.enqueue(i)
    enqueue_rate = jobs / (time.perf_counter() - started)

    started = time.perf_counter()
    procs = [_worker("--burst"), _worker("--burst")]
    for proc in procs:
        proc.wait(timeout=600)
    drain_rate = jobs / (time.perf_counter() - started)
    if Job.objects.filter(status="succeeded").count() != jobs:
        raise SystemExit("the drain left jobs behind")

    Job.objects.all().delete()
    idle = _worker()
    try:
        noop.enqueue(-1)  # the worker is up once it ran this one
        _wait(lambda: Job.objects.filter(status="succeeded").exists(), "the worker to start")
        for i in range(pickups):
            job = noop.enqueue(i)
            started_job = Job.objects.filter(pk=job.pk, started_at__isnull=False)
            _wait(started_job.exists, "a pickup")
            # Between enqueues, a pause that does not line up with the poll.
            time.sleep(0.05 + (i % 7) * 0.1)
        waits = [
            row.total_seconds() * 1000
            for row in Job.objects.exclude(args=[-1])
            .annotate(wait=F("started_at") - F("enqueued_at"))
            .values_list("wait", flat=True)
        ]
    finally:
        idle.send_signal(signal.SIGTERM)
        idle.wait(timeout=60)
    waits.sort()
    return {
        "enqueue": enqueue_rate,
        "drain": drain_rate,
        "p50": statistics.median(waits),
        "p95": waits[min(len(waits) - 1, round(0.95 * (len(waits) - 1)))],
    }


def _wait(predicate, what: str, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


if __name__ == "__main__":
    main()
