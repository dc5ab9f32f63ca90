"""Driver for django-jobguard (runs in the project's virtualenv).

``BENCH_METRICS=0`` hides ``prometheus_client`` from the process, which is exactly what a
deployment without the ``metrics`` extra sees: every metrics call becomes a no-op.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from benchmarks._common import CpuMeter, ThreadProfiler, driver_parser, paced, timed_enqueue, wait_for_go

#: variant -> (task attribute in benchmarks.jobguard_app.tasks, how each job is enqueued:
#: ``single``, with an ``idempotency key`` of its own, or as a step of a ``chain`` of two).
#: ``keyed`` needs ``BENCH_KEYED=1`` and ``insert_atomic`` ``BENCH_ATOMIC=1`` (their tasks are
#: imported only then).
VARIANTS: dict[str, tuple[str, str]] = {
    "plain": ("noop", "single"),
    "atomic": ("noop_atomic", "single"),
    "idempotency": ("noop", "idempotency key"),
    "lock": ("noop_locked", "single"),
    "all": ("noop_all", "idempotency key"),
    "keyed": ("noop_keyed", "single"),
    "workflow": ("noop", "chain"),
    "insert_atomic": ("insert_atomic", "single"),
}


def _setup() -> None:
    if os.environ.get("BENCH_METRICS", "1") == "0":
        sys.modules["prometheus_client"] = None  # type: ignore[assignment]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.jobguard_settings")
    import django

    django.setup()


def _task(variant: str) -> tuple[Any, str]:
    from benchmarks.jobguard_app import tasks

    name, how = VARIANTS[variant]
    return getattr(tasks, name), how


def _enqueue(task: Any, how: str, first: int, stop: int) -> int:
    """Enqueue job ``first`` (a chain: ``first`` and ``first + 1``, below ``stop``); the next index."""
    if how == "chain":
        # Each first step's ack releases the second; each second step's finishes its workflow.
        from django_jobguard import chain

        last = min(first + 2, stop)
        chain(*(task.s(i) for i in range(first, last))).enqueue()
        return last
    if how == "idempotency key":
        task.using(idempotency_key=f"bench:{first}").enqueue(first)
    else:
        task.enqueue(first)
    return first + 1


def enqueue(args: Any) -> None:
    task, how = _task(args.variant)
    indexes = range(args.start, args.start + args.n)
    if how == "chain":
        # Paced per chain: a chain of two is one enqueue of two jobs.
        indexes = range(args.start, args.start + args.n, 2)
        rate = args.rate / 2
    else:
        rate = args.rate

    def single() -> None:
        for i in paced(indexes, rate):
            _enqueue(task, how, i, args.start + args.n)

    def bulk() -> None:
        if how == "chain":
            raise SystemExit(f"variant {args.variant!r} has no bulk enqueue")
        for first in range(args.start, args.start + args.n, args.chunk):
            last = min(first + args.chunk, args.start + args.n)
            task.bulk_enqueue(((i,), {}) for i in range(first, last))

    timed_enqueue(args.n, args.out, bulk if args.mode == "bulk" else single, args.profile)


def capture(args: Any) -> None:
    """The statements one ``enqueue()`` sends, exactly as sent (client-side binding: values inlined)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from benchmarks._common import write_json

    task, how = _task(args.variant)
    _enqueue(task, how, -4, -3)  # connect and warm caches first: the capture is of the steady state
    with CaptureQueriesContext(connection) as queries:
        _enqueue(task, how, -2, -1)
    write_json(args.out, {"statements": [q["sql"] for q in queries.captured_queries]})


def _capture_claims(path: str) -> None:
    """Write the first claim statement the worker sends (as sent) and the SETs the claiming connection ran."""
    import json
    import threading

    from django.db.backends.signals import connection_created

    lock = threading.Lock()
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        result = execute(sql, params, many, context)
        sent = context["connection"].ops.last_executed_query(context["cursor"], sql, params) or sql
        with lock:
            if sent.lstrip().upper().startswith("SET ") and sent not in seen:
                seen.append(sent)
            elif (
                "SKIP LOCKED" in sent and "ORDER BY lease_expires_at" not in sent and not os.path.exists(path)
            ):
                with open(path, "w") as handle:
                    json.dump({"settings": list(seen), "claim": sent}, handle)
        return result

    def install(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(wrapper)

    connection_created.connect(install, weak=False)


def worker(args: Any) -> None:
    from django.core.management import call_command

    if os.environ.get("BENCH_LOCK_BACKEND") == "redis":
        # The redis lock back end imports redis and django_redis on first use, from the
        # executor threads; two threads importing them at once can fail (redis's circular
        # imports) and crash the job. Import them here, once, so the run measures the lock,
        # not that start-up race (reported as a bug, not worked around in the package).
        import django_redis.client  # noqa: F401
        import redis  # noqa: F401

    # The worker's modules load before the meter starts: its figure is CPU per job, and a
    # tree with more modules would otherwise pay for importing them once per run, spread over
    # the jobs (at 20,000 jobs, 100 ms of imports reads as 5 us per job).
    import django_jobguard.management.commands.jobguard_worker  # noqa: F401

    wait_for_go(args)
    profiler = ThreadProfiler(args.profile) if args.profile else None
    meter = CpuMeter()
    if profiler:
        profiler.install()
    options = ["--worker-id", f"bench-{args.index}-{os.getpid()}"]
    if args.concurrency:
        options += ["--concurrency", str(args.concurrency)]
    for queue in filter(None, args.queues.split(",")):
        options += ["--queue", queue]
    if args.max_jobs:
        options += ["--max-jobs", str(args.max_jobs)]
    if os.environ.get("BENCH_CAPTURE_SQL"):
        _capture_claims(os.environ["BENCH_CAPTURE_SQL"])
    if args.burst:
        options.append("--burst")
    try:
        call_command("jobguard_worker", *options)
    finally:
        if profiler:
            profiler.dump()
        meter.report(args.out)


def main() -> None:
    args = driver_parser(__doc__ or "").parse_args()
    _setup()
    {"enqueue": enqueue, "worker": worker, "capture": capture}[args.command](args)


if __name__ == "__main__":
    main()
