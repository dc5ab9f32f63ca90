"""The worker: a process loop, executor threads running each job through one pipeline, lease keeping.

- :mod:`.loop` — :class:`Worker`: the claim loop (with capacity), wake-ups, OS signals;
  :mod:`.shutdown` — the graceful shutdown;
- :mod:`.executor` — executor threads, one job at a time;
- :mod:`.pipeline` — one claimed job as the article's flow, returning an outcome value;
- :mod:`.completer` — the one writer of outcomes (store write, metric, log line, signal);
- :mod:`.heartbeat_thread` — the heartbeat thread's tick: lease keeping, the watchdog, the worker's
  beat row, the liveness file;
- :mod:`.leases` — lease keeping: the held jobs' leases extended, their locks renewed;
- :mod:`.watchdog` — the hard-timeout watchdog.

Maintenance passes (reaper, redrive, key pruning, scheduler) are :mod:`django_jobguard.maintenance`.
Every module logs as ``django_jobguard.worker``.
"""

from __future__ import annotations

from .executor import CONNECTION_CHECK_AFTER_IDLE_SECONDS
from .heartbeat_thread import HEARTBEAT_TICK_SECONDS, LIVENESS_TOUCH_SECONDS
from .leases import HEARTBEAT_FRACTION
from .loop import (
    DB_ERROR_BACKOFF_MAX_SECONDS,
    DB_ERROR_BACKOFF_SECONDS,
    EXIT_LOOP_WEDGED,
    EXIT_NOT_MIGRATED,
    EXIT_THREAD_DIED,
    OUTCOMES,
    PREFETCH_MAX_RUN_SECONDS,
    RUN_TIME_SMOOTHING,
    Worker,
    default_worker_id,
)
from .pipeline import CONTENTION_JITTER_FRACTION, MAX_REMEMBERED_SHAPES
from .watchdog import MAX_ABANDONED_THREADS

__all__ = [
    "CONNECTION_CHECK_AFTER_IDLE_SECONDS",
    "CONTENTION_JITTER_FRACTION",
    "DB_ERROR_BACKOFF_MAX_SECONDS",
    "DB_ERROR_BACKOFF_SECONDS",
    "EXIT_LOOP_WEDGED",
    "EXIT_NOT_MIGRATED",
    "EXIT_THREAD_DIED",
    "HEARTBEAT_FRACTION",
    "HEARTBEAT_TICK_SECONDS",
    "LIVENESS_TOUCH_SECONDS",
    "MAX_ABANDONED_THREADS",
    "MAX_REMEMBERED_SHAPES",
    "OUTCOMES",
    "PREFETCH_MAX_RUN_SECONDS",
    "RUN_TIME_SMOOTHING",
    "Worker",
    "default_worker_id",
]
