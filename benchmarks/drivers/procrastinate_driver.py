"""Driver for Procrastinate (runs in benchmarks/.venv-peers).

Each worker process runs ``app.run_worker_async(concurrency=2, listen_notify=True)``,
with ``wait=False`` (exit when empty) for throughput; otherwise Procrastinate's defaults.
"""

from __future__ import annotations

import asyncio
from typing import Any

from benchmarks._common import CpuMeter, driver_parser, paced, timed_enqueue, wait_for_go


def enqueue(args: Any) -> None:
    from benchmarks.peers.procrastinate_app import app, noop

    indexes = range(args.start, args.start + args.n)

    def single() -> None:
        for i in paced(indexes, args.rate):
            noop.defer(i=i)

    def bulk() -> None:
        for first in range(indexes.start, indexes.stop, args.chunk):
            noop.batch_defer(*({"i": i} for i in range(first, min(first + args.chunk, indexes.stop))))

    with app.open():
        timed_enqueue(args.n, args.out, bulk if args.mode == "bulk" else single, args.profile)


def worker(args: Any) -> None:
    from benchmarks.peers.procrastinate_app import QUEUE, app

    wait_for_go(args)
    meter = CpuMeter()

    async def run() -> None:
        async with app.open_async():
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=args.concurrency,
                wait=not args.burst,
                listen_notify=True,
                name=f"bench{args.index}",
                install_signal_handlers=True,
            )

    try:
        asyncio.run(run())
    finally:
        meter.report(args.out)


def schema() -> None:
    """Apply Procrastinate's schema (the orchestrator calls this on an empty database)."""
    from benchmarks.peers.procrastinate_app import app

    with app.open():
        app.schema_manager.apply_schema()


def main() -> None:
    import sys

    if sys.argv[1:2] == ["schema"]:
        schema()
        return
    args = driver_parser(__doc__ or "").parse_args()
    {"enqueue": enqueue, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
