"""Procrastinate (standalone, psycopg 3 connector) and the no-op task.

The task is ``async def``: Procrastinate's own advice is not to combine worker
concurrency with synchronous tasks, so the peer gets its best case.
"""

from __future__ import annotations

import os

import procrastinate

from benchmarks._common import conninfo

QUEUE = "jgbench"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=conninfo(
            os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jg_bench_procrastinate")
        )
    )
)


@app.task(name="jgbench.noop", queue=QUEUE)
async def noop(i: int) -> None:
    return None
