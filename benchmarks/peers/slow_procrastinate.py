"""Procrastinate for ``bench_slow_calls.py``: the slow-call task as an ``async def``.

Its worker runs the coroutines on one event loop (``run_worker_async(concurrency=500)``); the
connector is ``PsycopgConnector`` with its defaults (psycopg_pool's: 4 connections).
"""

from __future__ import annotations

import os

import procrastinate

from benchmarks._common import conninfo
from benchmarks._slow_http import get_async

QUEUE = "jgslow"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=conninfo(
            os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jg_slow_procrastinate")
        )
    )
)


@app.task(name="jgslow.http_get", queue=QUEUE)
async def http_get(host: str, port: int, i: int) -> int:
    return await get_async(host, port, i)
