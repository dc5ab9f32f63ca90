"""Driver for the peers of ``bench_slow_calls.py`` (runs in the peer's own virtualenv).

    python -m benchmarks.drivers.slow_calls enqueue {celery,procrastinate,arq} --n N --port P
    python -m benchmarks.drivers.slow_calls worker {procrastinate,arq} --concurrency N
    python -m benchmarks.drivers.slow_calls worker bare --concurrency N --n N --port P --out FILE
    python -m benchmarks.drivers.slow_calls schema procrastinate

Celery's worker is its own command line (``celery -A benchmarks.peers.slow_celery worker``),
which applies gevent's monkey-patching; the harness starts it directly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

HOST = "127.0.0.1"
#: Jobs per batch of the enqueues that have one (Procrastinate's batch_defer, Arq's pipeline).
CHUNK = 500


def enqueue_celery(n: int, port: int) -> None:
    from benchmarks.peers.slow_celery import http_get

    # Celery has no bulk enqueue: one message at a time, as its users send them.
    for i in range(n):
        http_get.apply_async((HOST, port, i), {"enqueued_at": time.time()})


def enqueue_procrastinate(n: int, port: int) -> None:
    from benchmarks.peers.slow_procrastinate import app, http_get

    with app.open():
        for first in range(0, n, CHUNK):
            http_get.batch_defer(
                *({"host": HOST, "port": port, "i": i} for i in range(first, min(first + CHUNK, n)))
            )


def enqueue_arq(n: int, port: int) -> None:
    from arq import create_pool

    from benchmarks.peers.slow_arq import WorkerSettings

    async def run() -> None:
        pool = await create_pool(WorkerSettings.redis_settings)
        try:
            for first in range(0, n, CHUNK):
                # enqueue_job is one Redis transaction per job; a batch of them at once.
                await asyncio.gather(
                    *(
                        pool.enqueue_job("http_get", HOST, port, i)
                        for i in range(first, min(first + CHUNK, n))
                    )
                )
        finally:
            await pool.aclose()

    asyncio.run(run())


def worker_procrastinate(concurrency: int) -> None:
    from benchmarks.peers.slow_procrastinate import QUEUE, app

    async def run() -> None:
        async with app.open_async():
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=concurrency,
                wait=True,
                listen_notify=True,
                install_signal_handlers=True,
            )

    asyncio.run(run())


def worker_arq(concurrency: int) -> None:
    os.environ["BENCH_ARQ_MAX_JOBS"] = str(concurrency)
    from arq.worker import run_worker

    from benchmarks.peers.slow_arq import WorkerSettings

    run_worker(WorkerSettings)  # type: ignore[arg-type]


def worker_bare(concurrency: int, n: int, port: int, out: str) -> None:
    """No queue: ``n`` calls, ``concurrency`` at once, on one event loop; then (enqueue, start,
    finish) per call to ``out`` (JSON), and wait for SIGTERM like the queues' workers."""
    import json
    import signal

    from benchmarks._slow_http import get_async

    async def run() -> list[tuple[float, float, float]]:
        slots = asyncio.Semaphore(concurrency)
        enqueued = time.time()

        async def one(i: int) -> tuple[float, float, float]:
            async with slots:
                started = time.time()
                await get_async(HOST, port, i)
                return enqueued, started, time.time()

        return await asyncio.gather(*(one(i) for i in range(n)))

    times = asyncio.run(run())
    with open(out + ".part", "w") as handle:
        json.dump(times, handle)
    os.replace(out + ".part", out)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def schema_procrastinate() -> None:
    from benchmarks.peers.slow_procrastinate import app

    with app.open():
        app.schema_manager.apply_schema()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("command", choices=["enqueue", "worker", "schema"])
    parser.add_argument("system", choices=["celery", "procrastinate", "arq", "bare"])
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--out", default="", help="bare: where the calls' times go")
    args = parser.parse_args()
    if args.command == "enqueue":
        {"celery": enqueue_celery, "procrastinate": enqueue_procrastinate, "arq": enqueue_arq}[args.system](
            args.n, args.port
        )
    elif args.command == "worker" and args.system == "bare":
        worker_bare(args.concurrency, args.n, args.port, args.out)
    elif args.command == "worker":
        {"procrastinate": worker_procrastinate, "arq": worker_arq}[args.system](args.concurrency)
    else:
        schema_procrastinate()


if __name__ == "__main__":
    main()
