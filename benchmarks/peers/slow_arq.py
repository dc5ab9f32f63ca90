"""Arq for ``bench_slow_calls.py`` (runs in ``benchmarks/.venv-arq``): the slow-call task.

Arq's defaults but ``max_jobs`` (``BENCH_ARQ_MAX_JOBS``, 500: the slots) and the Redis
database (``BENCH_ARQ_REDIS``). Arq keeps each job's result, with its enqueue, start and
finish times, in Redis (``keep_result``, an hour by default): the harness reads them back.
"""

from __future__ import annotations

import os
from typing import Any

from arq.connections import RedisSettings

from benchmarks._slow_http import get_async


async def http_get(ctx: dict[str, Any], host: str, port: int, i: int) -> int:
    return await get_async(host, port, i)


class WorkerSettings:
    functions = [http_get]
    redis_settings = RedisSettings.from_dsn(os.environ.get("BENCH_ARQ_REDIS", "redis://127.0.0.1:6379/10"))
    max_jobs = int(os.environ.get("BENCH_ARQ_MAX_JOBS", "500"))
