"""What waiting on a result costs: ``Job.wait()`` and ``Job.await_result()`` on PostgreSQL.

Three parts, each repeated ``--runs`` times (figures are medians over the runs):

- **latency**: one waiter enqueues a job (a handler of ``--handler-ms``, so the waiter is
  waiting when the ack commits) and waits on it, ``--jobs`` times in a row, a worker process
  running beside it. Latency is the waiter's return (``time.time()``) minus the job's
  ``finished_at`` (the ack statement's ``statement_timestamp()``, the same host's clock): from
  the worker's ack to the waiter holding the result. ``notify``: woken by the settlement's
  NOTIFY (migration 0027); ``poll``: the same waits with the listener off (5 ms growing to
  250 ms), for comparison.
- **many waiters**: ``--waiters`` coroutines in one process each ``await job.await_result()``
  on a job of its own; once every one has flagged its row, the database sessions this process
  holds and its RSS are read, then ``--workers`` worker processes run the jobs, and the time
  until the last coroutine has its result is taken. Each run is a process of its own (this
  script again, ``--many-child``), so its RSS and peak are not a previous run's.
- **ack cost**: what the trigger costs a settlement nobody waits on: single-row updates of
  queued jobs to succeeded, in autocommit, with the trigger on and off (interleaved), per
  statement, p50.

    .venv/bin/python benchmarks/bench_wait.py
    .venv/bin/python benchmarks/bench_wait.py --pg-url postgres://postgres@127.0.0.1:5432/jg_wait --runs 5
    .venv/bin/python benchmarks/bench_wait.py --parts latency --jobs 500

The database (``--pg-url``) is created if missing and emptied before each run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._database import empty, load, log, setup_django  # noqa: E402

TABLES = ["jobguard_job"]
TRIGGER = "jobguard_job_settled_notify"


def rss_mib() -> tuple[float, float]:
    """This process's resident set now and at its peak, in MiB (``/proc/self/status``)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def start_workers(env: dict[str, str], count: int, concurrency: int) -> list[subprocess.Popen[bytes]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "jobguard_worker", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(count)
    ]
    return procs


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def sessions() -> int:
    """Client sessions on the benchmark's database (no worker runs while this is read)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend'"
        )
        return int(cursor.fetchone()[0])


# -- latency -----------------------------------------------------------------------------------


def latency_run(args: argparse.Namespace, env: dict[str, str], mode: str) -> tuple[list[float], list[float]]:
    """Latencies in ms of each wait, from the ack statement and from the NOTIFY heard."""
    from django.db import connection

    from benchmarks.jobguard_app.tasks_wait import sleeps
    from django_jobguard.models import Job
    from django_jobguard.results import waiting
    from django_jobguard.store import settled
    from django_jobguard.store.listener import listen_connection

    # The settlement's NOTIFY, heard on a connection of the benchmark's own: about when the
    # worker's commit became visible (PostgreSQL delivers it after the commit).
    heard: dict[int, float] = {}
    stop = threading.Event()
    listening = threading.Event()

    def listen() -> None:
        conn = listen_connection("default", settled.SETTLED_CHANNEL)
        listening.set()
        while not stop.is_set():
            for note in conn.notifies(timeout=0.2):
                heard[int(note.payload)] = time.time()
        conn.close()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    listening.wait(30)
    original = waiting.settle_listener
    if mode == "poll":
        waiting.settle_listener = lambda alias: None  # type: ignore[assignment]
    empty(TABLES)
    procs = start_workers(env, 1, 2)
    try:
        # Warm up: the worker started and LISTENing, this process's LISTEN open.
        for i in range(5):
            sleeps.enqueue(-i, ms=args.handler_ms).wait(timeout=120)
        from_ack, from_commit = [], []
        for i in range(args.jobs):
            job = sleeps.enqueue(i, ms=args.handler_ms)
            if mode == "poll":
                settled.mark_waited("default", job.pk)  # so its settlement is heard, as above
            job.wait(timeout=60)
            returned = time.time()
            finished = Job.objects.filter(pk=job.pk).values_list("finished_at", flat=True).get()
            from_ack.append((returned - finished.timestamp()) * 1000)
            deadline = time.monotonic() + 5
            while job.pk not in heard and time.monotonic() < deadline:
                time.sleep(0.001)
            if job.pk in heard:
                from_commit.append((returned - heard[job.pk]) * 1000)
        return from_ack, from_commit
    finally:
        waiting.settle_listener = original  # type: ignore[assignment]
        stop_workers(procs)
        stop.set()
        listener.join(5)
        connection.close()


# -- many waiters ------------------------------------------------------------------------------


def many_run(args: argparse.Namespace, env: dict[str, str]) -> dict[str, float]:
    from asgiref.sync import sync_to_async
    from django.db import connection, connections

    from benchmarks.jobguard_app.tasks import noop
    from django_jobguard.models import Job
    from django_jobguard.store import settled, wakeup

    empty(TABLES)
    ids = [job.pk for job in noop.bulk_enqueue(((i,), {}) for i in range(args.waiters))]
    # Scheduled a day ahead, so no worker takes them before every waiter waits.
    Job.objects.filter(pk__in=ids).update(
        run_after=datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
    )
    jobs = list(Job.objects.filter(pk__in=ids).order_by("pk").only("id", "task_name"))
    connection.close()  # the waiters' reads go through sync_to_async's one thread
    # The enqueue's coalesced NOTIFY went from a thread with a connection of its own, closed
    # once idle: not the waiters', so not counted.
    time.sleep(wakeup.IDLE_CLOSE_SECONDS + 1)
    listener = settled.settle_listener("default")
    assert listener is not None
    figures: dict[str, float] = {}

    async def main() -> None:
        rss_before = rss_mib()[0]
        started = time.perf_counter()
        waits = [asyncio.ensure_future(job.await_result(timeout=600)) for job in jobs]

        def flagged() -> int:
            return Job.objects.filter(waited=True).count()

        while listener.waiters < len(jobs) or await sync_to_async(flagged, thread_sensitive=True)() < len(
            jobs
        ):
            await asyncio.sleep(0.05)
        figures["setup_s"] = time.perf_counter() - started
        figures["sessions"] = await sync_to_async(sessions, thread_sensitive=True)()
        figures["rss_mib"] = rss_mib()[0]
        figures["rss_added_mib"] = figures["rss_mib"] - rss_before

        def due_now() -> None:
            # By range, not pk__in: a statement of 10,000 parameters (its text and the driver's
            # buffers) would add 4-5 MiB to the peak RSS, which is the waiters' to report.
            Job.objects.filter(pk__range=(ids[0], ids[-1])).update(
                run_after=datetime.datetime.now(datetime.UTC)
            )

        procs = start_workers(env, args.workers, 4)
        try:
            await sync_to_async(due_now, thread_sensitive=True)()
            released = time.perf_counter()
            results = await asyncio.gather(*waits)
            figures["drain_s"] = time.perf_counter() - released
        finally:
            await asyncio.get_running_loop().run_in_executor(None, stop_workers, procs)
            await sync_to_async(connections.close_all, thread_sensitive=True)()
        assert results == [None] * len(jobs)
        figures["rss_peak_mib"] = rss_mib()[1]

    asyncio.run(main())
    return figures


# -- ack cost ----------------------------------------------------------------------------------


def ack_run(args: argparse.Namespace) -> dict[str, float]:
    from django.db import connection

    from benchmarks.jobguard_app.tasks import noop

    empty(TABLES)
    ids = [job.pk for job in noop.bulk_enqueue(((i,), {}) for i in range(2 * args.acks))]
    timings: dict[str, list[float]] = {"on": [], "off": []}
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")  # the trigger's cost, not the disk's
        for block in range(0, len(ids), 200):
            state = "on" if (block // 200) % 2 == 0 else "off"
            cursor.execute(
                f"ALTER TABLE jobguard_job {'ENABLE' if state == 'on' else 'DISABLE'} TRIGGER {TRIGGER}"
            )
            for job_id in ids[block : block + 200]:
                t0 = time.perf_counter()
                cursor.execute(
                    "UPDATE jobguard_job SET status = 'succeeded', finished_at = statement_timestamp() "
                    "WHERE id = %s",
                    [job_id],
                )
                timings[state].append((time.perf_counter() - t0) * 1e6)
        cursor.execute(f"ALTER TABLE jobguard_job ENABLE TRIGGER {TRIGGER}")
        cursor.execute("RESET synchronous_commit")
    return {state: statistics.median(values) for state, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/jg_bench_wait")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parts", default="latency,many,ack")
    parser.add_argument("--jobs", type=int, default=200, help="waits per latency run")
    parser.add_argument("--handler-ms", type=float, default=20.0)
    parser.add_argument("--waiters", type=int, default=10_000, help="coroutines waiting at once")
    parser.add_argument("--workers", type=int, default=2, help="worker processes that drain them")
    parser.add_argument("--acks", type=int, default=2000, help="updates per trigger state per run")
    parser.add_argument("--many-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    env = setup_django(args.pg_url, BENCH_WAIT="1")
    if args.many_child:  # one "many" run, in a fresh process; its figures as JSON on stdout
        print(json.dumps(many_run(args, env)))
        return
    log(f"load before: {load()}")

    lat: dict[str, list[tuple[float, float, float, float]]] = {"notify": [], "poll": []}
    many: list[dict[str, float]] = []
    acks: list[dict[str, float]] = []
    for run in range(args.runs):
        if "latency" in parts:
            for mode in ("notify", "poll") if run % 2 == 0 else ("poll", "notify"):
                ack, commit = latency_run(args, env, mode)
                row = (
                    percentile(ack, 0.5),
                    percentile(ack, 0.99),
                    percentile(commit, 0.5),
                    percentile(commit, 0.99),
                )
                lat[mode].append(row)
                log(
                    f"run {run + 1} latency {mode}: from the ack p50/p99 {row[0]:.2f}/{row[1]:.2f} ms, "
                    f"from the commit {row[2]:.2f}/{row[3]:.2f} ms"
                )
        if "many" in parts:
            from django.db import connections

            connections.close_all()  # the child counts the sessions on the database: only its own
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--many-child",
                    *("--pg-url", args.pg_url, "--waiters", str(args.waiters)),
                    *("--workers", str(args.workers)),
                ],
                cwd=ROOT,
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            )
            many.append(json.loads(child.stdout.strip().splitlines()[-1]))
            log(f"run {run + 1} many: {many[-1]}")
        if "ack" in parts:
            acks.append(ack_run(args))
            log(f"run {run + 1} ack: {acks[-1]}")

    print(f"\nbench_wait.py, {args.runs} runs (medians), load after: {load()}")
    if lat["notify"]:
        print(
            f"\nlatency to the waiter's return, ms ({args.jobs} waits per run, "
            f"{args.handler_ms:g} ms handler)"
        )
        print(f"{'waiter':<10}{'ack p50':>10}{'ack p99':>10}{'commit p50':>12}{'commit p99':>12}")
        for mode, rows in lat.items():
            cells = [statistics.median(r[k] for r in rows) for k in range(4)]
            print(f"{mode:<10}{cells[0]:>10.2f}{cells[1]:>10.2f}{cells[2]:>12.2f}{cells[3]:>12.2f}")
    if many:
        print(f"\n{args.waiters:,} coroutines waiting in one process ({args.workers} workers drain them)")
        for key, label in (
            ("sessions", "database sessions held"),
            ("rss_mib", "RSS while waiting, MiB"),
            ("rss_added_mib", "RSS the waiters added, MiB"),
            ("rss_peak_mib", "peak RSS, MiB"),
            ("setup_s", "every waiter flagged after, s"),
            ("drain_s", "all results in after, s"),
        ):
            print(f"{label:<34}{statistics.median(m[key] for m in many):>10.1f}")
    if acks:
        print("\nack cost: a settlement nobody waits on, per single-row UPDATE (autocommit)")
        print(f"{'trigger':<10}{'p50 us':>10}")
        for state in ("off", "on"):
            print(f"{state:<10}{statistics.median(a[state] for a in acks):>10.1f}")


if __name__ == "__main__":
    main()
