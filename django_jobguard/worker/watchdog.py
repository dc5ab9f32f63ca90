"""The hard-timeout watchdog: a job past its task's ``timeout`` fails, and its stuck thread is replaced.

Python cannot stop a thread, so the handler keeps running; its ack is refused (the job is
``ABANDONED``), the job is retried or dead-lettered like any failed attempt, and a fresh
executor takes the slot. Past :data:`MAX_ABANDONED_THREADS` the worker exits to be restarted.
A coroutine blocking the event loop past its ``timeout`` is abandoned the same way (the
heartbeat asks :meth:`.aio.AsyncExecutor.overdue`); there is no thread to replace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import retry
from ..models import DeadLetterReason
from ..outcome import HeldState
from ..registry import registry
from . import pipeline
from .held import LOGGER_NAME, Held

if TYPE_CHECKING:
    from .completer import Completer
    from .slots import Slots

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["MAX_ABANDONED_THREADS", "Watchdog"]

#: Executor threads abandoned past their hard timeout before the worker exits to be restarted.
MAX_ABANDONED_THREADS = 16


class Watchdog:
    """Fails the running jobs of one worker that are past their hard timeout."""

    def __init__(
        self,
        slots: Slots,
        completer: Completer,
        worker_id: str,
        *,
        replace_executor: Callable[[], None],
        stop_worker: Callable[[], None],
    ) -> None:
        self.slots = slots
        self.completer = completer
        self.worker_id = worker_id
        self._replace_executor = replace_executor
        self._stop_worker = stop_worker

    def check(self, held: Sequence[Held], now: float) -> int:
        """Abandon the running jobs past their deadline; how many it abandoned."""
        abandoned = 0
        for h in held:
            if h.deadline is not None and now >= h.deadline and h.state is HeldState.RUNNING:
                abandoned += self.abandon(h)
        return abandoned

    def abandon(self, held: Held) -> bool:
        """Fail a job past its hard timeout and replace the thread stuck in it."""
        if not self.slots.abandon(held):
            return False
        task = registry.find(held.job.task_name)
        timeout = task.timeout if task else None
        if held.on_loop:
            error = TimeoutError(
                f"the handler ran past its hard timeout of {timeout}s, blocking its event loop; its "
                "coroutine was abandoned"
            )
        else:
            error = TimeoutError(
                f"the handler ran past its hard timeout of {timeout}s; its thread was abandoned"
            )
        outcome = pipeline.failure_outcome(
            held.job, task, error, None, forced_category=retry.TRANSIENT, reason=DeadLetterReason.HARD_TIMEOUT
        )
        self.completer.settle(held, outcome)
        if held.on_loop:
            # A coroutine holds the loop, not a thread: nothing to replace. The loop's watch
            # stops the worker if the loop stays blocked (aio.AsyncExecutor.watch).
            return True
        # The lock stays with the stuck handler; without renewals its TTL frees it.
        if self.slots.abandoned > MAX_ABANDONED_THREADS:
            logger.error("too_many_abandoned_threads worker_id=%s; stopping for a restart", self.worker_id)
            self._stop_worker()
            return True
        self._replace_executor()
        return True
