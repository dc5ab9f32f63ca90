"""Driver for django-jobguard (runs in the project's virtualenv).

``BENCH_METRICS=0`` hides ``prometheus_client`` from the process, which is exactly what a
deployment without the ``metrics`` extra sees: every metrics call becomes a no-op.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from benchmarks._common import CpuMeter, ThreadProfiler, driver_parser, paced, timed_enqueue, wait_for_go

#: variant -> (task attribute in benchmarks.jobguard_app.tasks, enqueue with an idempotency key)
VARIANTS: dict[str, tuple[str, bool]] = {
    "plain": ("noop", False),
    "atomic": ("noop_atomic", False),
    "idempotency": ("noop", True),
    "lock": ("noop_locked", False),
    "all": ("noop_all", True),
}


def _setup() -> None:
    if os.environ.get("BENCH_METRICS", "1") == "0":
        sys.modules["prometheus_client"] = None  # type: ignore[assignment]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.jobguard_settings")
    import django

    django.setup()


def _task(variant: str) -> tuple[Any, bool]:
    from benchmarks.jobguard_app import tasks

    name, keyed = VARIANTS[variant]
    return getattr(tasks, name), keyed


def enqueue(args: Any) -> None:
    task, keyed = _task(args.variant)
    indexes = range(args.start, args.start + args.n)

    def single() -> None:
        for i in paced(indexes, args.rate):
            if keyed:
                task.using(idempotency_key=f"bench:{i}").enqueue(i)
            else:
                task.enqueue(i)

    def bulk() -> None:
        for first in range(indexes.start, indexes.stop, args.chunk):
            last = min(first + args.chunk, indexes.stop)
            task.bulk_enqueue(((i,), {}) for i in range(first, last))

    timed_enqueue(args.n, args.out, bulk if args.mode == "bulk" else single, args.profile)


def capture(args: Any) -> None:
    """The statements one ``enqueue()`` sends, exactly as sent (client-side binding: values inlined)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from benchmarks._common import write_json

    task, keyed = _task(args.variant)
    task.enqueue(-1)  # connect and warm caches first: the capture is of the steady state
    with CaptureQueriesContext(connection) as queries:
        if keyed:
            task.using(idempotency_key="bench:capture").enqueue(-2)
        else:
            task.enqueue(-2)
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
