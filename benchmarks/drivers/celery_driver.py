"""Driver for Celery with the Redis broker (runs in benchmarks/.venv-peers).

Tuned (``--pool threads``): each worker process is ``celery worker --pool threads
--concurrency 2`` (the same two threads per process as django-jobguard), ``acks_late``,
prefetch multiplier 4 (default), ``--without-gossip --without-mingle --without-heartbeat``,
log level WARNING. Default (``--pool prefork``, ``BENCH_CELERY_MODE=default``): ``celery
worker --pool prefork --concurrency 2`` with Celery's default flags and a result backend.
Celery has no burst mode: the orchestrator stops the workers (SIGTERM) once every job is
recorded. CPU is counted from ``worker_ready`` to ``worker_shutting_down``, with the prefork
pool's children included.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks._common import CpuMeter, driver_parser, paced, timed_enqueue, wait_for_go


def enqueue(args: Any) -> None:
    from benchmarks.peers.celery_app import noop

    if args.mode == "bulk":
        raise SystemExit("Celery has no bulk enqueue API")

    def single() -> None:
        for i in paced(range(args.start, args.start + args.n), args.rate):
            noop.apply_async((i,), {"enqueued_at": time.time()})

    timed_enqueue(args.n, args.out, single, args.profile)


def worker(args: Any) -> None:
    from celery.signals import worker_ready, worker_shutting_down

    from benchmarks.peers.celery_app import QUEUE, app

    wait_for_go(args)
    meter = CpuMeter(tree=args.pool == "prefork")
    reported = False

    @worker_ready.connect(weak=False)
    def ready(**kwargs: Any) -> None:
        meter.mark()

    @worker_shutting_down.connect(weak=False)
    def stopping(**kwargs: Any) -> None:
        nonlocal reported
        if not reported:
            reported = True
            meter.report(args.out)

    argv = ["worker", "--pool", args.pool, "--concurrency", str(args.concurrency or 2), "--queues", QUEUE]
    argv += ["--hostname", f"bench{args.index}@%h", "--loglevel", "WARNING"]
    if args.pool == "threads":
        argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    app.worker_main(argv)
    if not reported:
        meter.report(args.out)


def main() -> None:
    args = driver_parser(__doc__ or "").parse_args()
    {"enqueue": enqueue, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
