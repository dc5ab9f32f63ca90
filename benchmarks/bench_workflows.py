"""What a batch costs against plain jobs, with real worker processes on PostgreSQL or MariaDB/MySQL.

Each run, the median of ``--runs``:

- ``enqueue``: ``--members`` jobs as plain ``bulk_enqueue`` calls of ``--chunk``, against the
  same jobs as the members of one batch (``Batch.open()``, ``add()`` of ``--chunk`` members
  per transaction, ``close()``): jobs stored per second;
- ``drain``: those jobs (the job table vacuumed first) drained by ``--processes`` worker processes
  (``jobguard_worker --concurrency 4``), started on a paused queue and timed from its resume
  to the last ack (the batch: to its ``on_complete`` callback's ack), plain against batch
  members: the completion overhead per member, in seconds and in CPU (the workers' and, on
  PostgreSQL, the server processes' of this database: a busy host inflates it far less);
- ``lock waits``: while the batch drains, the connections waiting on a lock are sampled every
  20 ms (``pg_stat_activity`` and ``pg_locks``; on MariaDB/MySQL ``information_schema.innodb_trx``):
  those whose statement touches the batch's rows (``jobguard_workflowcounter``,
  ``jobguard_workflow``), and any.

    python benchmarks/bench_workflows.py --url postgres://postgres@127.0.0.1:5432/jg_wf_bench
    python benchmarks/bench_workflows.py --url mysql://root@127.0.0.1:3306/jg_wf_bench

The database is created and migrated if missing, and emptied before each run. Prints a table.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: A drain's worker processes; they poll often, as they start on a paused queue.
WORKER = [sys.executable, "-m", "django", "jobguard_worker", "--concurrency", "4", "--poll-interval", "0.05"]
#: The lock sampler's connection, left out of the server CPU a drain is charged.
SAMPLER_NAME = "bench-lock-sampler"
#: The statement text of a lock wait "on the batch's rows".
WORKFLOW_TABLES = ("jobguard_workflowcounter", "jobguard_workflow ")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        "--pg-url",
        dest="url",
        default="postgres://postgres@127.0.0.1:5432/jg_wf_bench",
        help="the database: postgres://... or mysql://... (created if missing)",
    )
    parser.add_argument(
        "--members", type=int, default=100_000, help="jobs of the batch (and of the plain run)"
    )
    parser.add_argument("--chunk", type=int, default=1_000, help="members per add() / bulk_enqueue() call")
    parser.add_argument("--processes", type=int, default=4, help="worker processes draining")
    parser.add_argument("--runs", type=int, default=3, help="runs of each (the median is reported)")
    parser.add_argument(
        "--no-drain",
        action="store_true",
        help="measure the enqueue only (a large --members on a small machine)",
    )
    return parser.parse_args()


def setup(args: argparse.Namespace) -> dict[str, str]:
    from benchmarks._database import setup_django

    return setup_django(args.url)


def is_mysql(url: str) -> bool:
    return url.split(":", 1)[0] in ("mysql", "mariadb")


def vacuum() -> None:
    """VACUUM ANALYZE the job table: both drains start from a table without dead row versions.
    ANALYZE TABLE on MariaDB/MySQL (InnoDB purges old row versions by itself)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("ANALYZE TABLE jobguard_job")
            cursor.fetchall()
        else:
            cursor.execute("VACUUM ANALYZE jobguard_job")


def empty() -> None:
    from django.db import connection

    tables = (
        "jobguard_job",
        "jobguard_workflowcallback",
        "jobguard_workflowcounter",
        "jobguard_workflow",
        "jobguard_jobdependency",
    )
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            # TRUNCATE refuses a table other tables' foreign keys point at; these are all emptied.
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            for table in tables:
                cursor.execute(f"TRUNCATE TABLE {table}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
        else:
            cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
    vacuum()


def enqueue_plain(members: int, chunk: int) -> float:
    from django.db import transaction

    from benchmarks.jobguard_app.tasks import noop

    began = time.perf_counter()
    for start in range(0, members, chunk):
        with transaction.atomic():
            noop.bulk_enqueue(((), {"i": i}) for i in range(start, min(start + chunk, members)))
    return members / (time.perf_counter() - began)


def enqueue_batch(members: int, chunk: int) -> tuple[float, int]:
    from benchmarks.jobguard_app.tasks import noop
    from django_jobguard import Batch

    began = time.perf_counter()
    batch = Batch(on_complete=noop.s(-1), name="bench").open()
    for start in range(0, members, chunk):
        batch.add([noop.s(i) for i in range(start, min(start + chunk, members))])
    batch.close()
    assert batch.id is not None
    return members / (time.perf_counter() - began), batch.id


class LockSampler(threading.Thread):
    """Samples, every 20 ms, backends of this database waiting on a lock (its own connection)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.samples = 0
        self.on_workflow_rows = 0  # samples with a backend waiting, its statement on the batch's rows
        self.any_wait = 0  # samples with any backend waiting on a lock
        self.examples: list[str] = []

    def run(self) -> None:
        if is_mysql(self.url):
            self._run_mysql()
            return
        import psycopg

        from benchmarks._common import conninfo

        with psycopg.connect(conninfo(self.url), autocommit=True, application_name=SAMPLER_NAME) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT a.pid, a.query, l.locktype, l.relation::regclass::text "
                    "FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted "
                    "WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'"
                ).fetchall()
                self.record(rows)

    def _run_mysql(self) -> None:
        from django.db import connections

        # A connection of its own (this thread's), to the benchmark's database.
        with connections["default"].cursor() as cursor:
            while not self.stop.is_set():
                cursor.execute(
                    "SELECT trx_mysql_thread_id, trx_query, '', '' FROM information_schema.innodb_trx "
                    "WHERE trx_state = 'LOCK WAIT'"
                )
                self.record(cursor.fetchall())
        connections.close_all()

    def record(self, rows: Any) -> None:
        """Count a sample: ``(pid, statement, lock type, relation)`` of each waiting connection."""
        self.samples += 1
        if rows:
            self.any_wait += 1
            if any(
                any(table in (query or "") for table in WORKFLOW_TABLES)
                or (relation or "").startswith("jobguard_workflow")
                for _, query, _, relation in rows
            ):
                self.on_workflow_rows += 1
                if len(self.examples) < 3:
                    self.examples.append(str(rows[0][1])[:160])
        time.sleep(0.02)


def _cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds of each process still alive (``/proc/<pid>/stat``)."""
    seconds: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return seconds


def _backends(url: str) -> list[int]:
    """The PostgreSQL server processes serving the benchmark's database (none on MariaDB/MySQL,
    whose one server process serves every database)."""
    if is_mysql(url):
        return []
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND application_name <> %s",
            [SAMPLER_NAME],
        )
        return [pid for (pid,) in cursor.fetchall()]


def drain(
    env: dict[str, str], processes: int, done: Any, url: str
) -> tuple[float, float, float, LockSampler]:
    """Drain the jobs with real workers: the seconds, the workers' and the server's CPU seconds,
    and the lock sampler.

    The workers start on a paused queue and are timed from its resume, so their start-up
    counts in neither figure. The CPU is the workers' and, on PostgreSQL, the server
    processes' of this database: other work on the host does not inflate it, as it does
    the seconds.
    """
    from django_jobguard.models import WorkerBeat
    from django_jobguard.operations import queues

    ids = [f"bench-wf-{n}" for n in range(processes)]
    logging.getLogger("django_jobguard").setLevel(logging.WARNING)  # not a line per pause and resume
    queues.pause("default", actor="bench", reason="workers starting")
    workers = [
        subprocess.Popen(
            [*WORKER, "--worker-id", worker_id],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        for worker_id in ids
    ]
    sampler = LockSampler(url)
    try:
        deadline = time.monotonic() + 300
        while WorkerBeat.objects.filter(worker_id__in=ids).count() < processes:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start within 5 minutes")
            time.sleep(0.05)
        WorkerBeat.objects.filter(worker_id__in=ids).delete()  # the next drain waits for its own
        pids = [worker.pid for worker in workers]
        before = _cpu_seconds([*pids, *_backends(url)])
        sampler.start()
        began = time.perf_counter()
        queues.resume("default", actor="bench")
        deadline = time.monotonic() + 3600
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError("the drain did not finish within an hour")
            time.sleep(0.05)
        elapsed = time.perf_counter() - began
        # A connection opened during the drain counts from zero (executor threads connect at
        # their first job); the workers keep theirs open until they stop.
        after = _cpu_seconds([*pids, *_backends(url)])
        used = {pid: seconds - before.get(pid, 0.0) for pid, seconds in after.items()}
        cpu_workers = sum(used.get(pid, 0.0) for pid in pids)
        cpu_server = sum(seconds for pid, seconds in used.items() if pid not in pids)
    finally:
        sampler.stop.set()
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=120)
        if sampler.is_alive():
            sampler.join(timeout=5)
    return elapsed, cpu_workers, cpu_server, sampler


def main() -> None:
    args = parse_args()
    env = setup(args)
    from django_jobguard.models import Job, Workflow

    def all_succeeded() -> bool:
        return not Job.objects.exclude(status="succeeded").exists()

    results: dict[str, list[float]] = {
        "plain_enqueue": [],
        "batch_enqueue": [],
        "plain_drain": [],
        "batch_drain": [],
        "plain_cpu": [],
        "batch_cpu": [],
        "plain_worker_cpu": [],
        "batch_worker_cpu": [],
        "samples": [],
        "waits_workflow": [],
        "waits_any": [],
    }
    examples: list[str] = []
    for run in range(args.runs):
        empty()
        results["plain_enqueue"].append(enqueue_plain(args.members, args.chunk))
        if not args.no_drain:
            vacuum()
            seconds, cpu_workers, cpu_server, _ = drain(env, args.processes, all_succeeded, args.url)
            results["plain_drain"].append(seconds)
            results["plain_cpu"].append(cpu_workers + cpu_server)
            results["plain_worker_cpu"].append(cpu_workers)

        empty()
        rate, batch_id = enqueue_batch(args.members, args.chunk)
        results["batch_enqueue"].append(rate)
        if args.no_drain:
            print(f"run {run + 1}: enqueue plain {results['plain_enqueue'][-1]:,.0f}/s, batch {rate:,.0f}/s")
            continue

        vacuum()

        def batch_done(batch_id: int = batch_id) -> bool:
            return Workflow.objects.filter(pk=batch_id, state="finished").exists() and all_succeeded()

        seconds, cpu_workers, cpu_server, sampler = drain(env, args.processes, batch_done, args.url)
        cpu = cpu_workers + cpu_server
        results["batch_drain"].append(seconds)
        results["batch_cpu"].append(cpu)
        results["batch_worker_cpu"].append(cpu_workers)
        results["samples"].append(sampler.samples)
        results["waits_workflow"].append(sampler.on_workflow_rows)
        results["waits_any"].append(sampler.any_wait)
        examples += sampler.examples
        print(
            f"run {run + 1}: plain {results['plain_drain'][-1]:.1f} s {results['plain_cpu'][-1]:.1f} s CPU, "
            f"batch {seconds:.1f} s {cpu:.1f} s CPU, "
            f"lock-wait samples {sampler.on_workflow_rows} on the batch's rows / {sampler.any_wait} any "
            f"of {sampler.samples}",
            flush=True,
        )

    def median(name: str) -> float:
        return statistics.median(results[name])

    rows = [
        (
            "enqueue, plain bulk_enqueue",
            f"{args.members:,} jobs, calls of {args.chunk:,}",
            f"{median('plain_enqueue'):,.0f} jobs/s",
            "",
        ),
        (
            "enqueue, batch add()",
            f"{args.members:,} members, add() of {args.chunk:,}",
            f"{median('batch_enqueue'):,.0f} jobs/s",
            f"{100 * median('batch_enqueue') / median('plain_enqueue'):.0f} % of plain",
        ),
    ]
    if not args.no_drain:
        overhead = 100 * (median("batch_drain") - median("plain_drain")) / median("plain_drain")
        # Each run drains plain jobs and the batch back to back: their ratio moves less with a
        # host's load than the two medians taken apart.
        ratios = [b / p for p, b in zip(results["plain_drain"], results["batch_drain"], strict=True)]
        paired = 100 * (statistics.median(ratios) - 1)
        rows += [
            (
                "drain, plain jobs",
                f"{args.processes} processes x 4",
                f"{args.members / median('plain_drain'):,.0f} jobs/s ({median('plain_drain'):.1f} s)",
                "",
            ),
            (
                "drain, batch members",
                f"{args.processes} processes x 4, + on_complete",
                f"{(args.members + 1) / median('batch_drain'):,.0f} jobs/s ({median('batch_drain'):.1f} s)",
                f"{overhead:+.1f} % time per member (paired by run: {paired:+.1f} %)",
            ),
            (
                "CPU per job, plain / member",
                "workers" + ("" if is_mysql(args.url) else " + PostgreSQL"),
                f"{1e6 * median('plain_cpu') / args.members:,.0f} / "
                f"{1e6 * median('batch_cpu') / (args.members + 1):,.0f} us",
                f"{100 * (median('batch_cpu') / median('plain_cpu') - 1):+.1f} % CPU per member",
            ),
        ]
        if not is_mysql(args.url):  # there the row above is the workers' alone already
            rows.append(
                (
                    "CPU per job, workers alone",
                    "the worker processes",
                    f"{1e6 * median('plain_worker_cpu') / args.members:,.0f} / "
                    f"{1e6 * median('batch_worker_cpu') / (args.members + 1):,.0f} us",
                    f"{100 * (median('batch_worker_cpu') / median('plain_worker_cpu') - 1):+.1f} % "
                    "CPU per member",
                )
            )
        rows += [
            (
                "lock waits on the batch's rows",
                "samples every 20 ms while it drains",
                f"{median('waits_workflow'):.0f} of {median('samples'):.0f} samples",
                f"any lock: {median('waits_any'):.0f}",
            ),
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print(f"\nmedians of {args.runs} runs")
    print("  ".join(h.ljust(w) for h, w in zip(("run", "size", "result", "vs"), widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    if examples:
        print("\nstatements seen waiting:", *sorted(set(examples))[:3], sep="\n  ")


if __name__ == "__main__":
    main()
