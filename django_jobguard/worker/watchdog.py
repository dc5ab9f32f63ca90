"""The hard-timeout watchdog: a job past its task's ``timeout`` fails, and its stuck thread is replaced.

Python cannot stop a thread, so the handler keeps running; its ack is refused (the job is
``ABANDONED``), the job is retried or dead-lettered like any failed attempt, and a fresh
executor takes the slot. Past :data:`MAX_ABANDONED_THREADS` the worker exits to be restarted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import retry
from ..models import DeadLetterReason
from ..outcome import HeldState
from ..registry import registry
from . import pipeline
from .held import LOGGER_NAME, Held

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["MAX_ABANDONED_THREADS", "Watchdog"]

#: Executor threads abandoned past their hard timeout before the worker exits to be restarted.
MAX_ABANDONED_THREADS = 16


class Watchdog:
    """Fails the running jobs of one worker that are past their hard timeout."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def check(self, held: Sequence[Held], now: float) -> int:
        """Abandon the running jobs past their deadline; how many it abandoned."""
        abandoned = 0
        for h in held:
            if h.deadline is not None and now >= h.deadline and h.state is HeldState.RUNNING:
                abandoned += self.abandon(h)
        return abandoned

    def abandon(self, held: Held) -> bool:
        """Fail a job past its hard timeout and replace the thread stuck in it."""
        worker = self.worker
        with worker._lock:
            if held.state is not HeldState.RUNNING:
                return False
            held.state = HeldState.ABANDONED
            worker._held.pop(held.job.id, None)
            worker._abandoned += 1
        task = registry.find(held.job.task_name)
        timeout = task.timeout if task else None
        error = TimeoutError(f"the handler ran past its hard timeout of {timeout}s; its thread was abandoned")
        outcome = pipeline.classify(
            held.job, task, error, None, forced_category=retry.TRANSIENT, reason=DeadLetterReason.HARD_TIMEOUT
        )
        worker.completer.settle(held, outcome)
        # The lock stays with the stuck handler; without renewals its TTL frees it.
        worker._slot_freed.set()
        if worker._abandoned > MAX_ABANDONED_THREADS:
            logger.error("too_many_abandoned_threads worker_id=%s; stopping for a restart", worker.worker_id)
            worker.stop()
            return True
        worker._start_executor(len(worker._threads))
        return True
