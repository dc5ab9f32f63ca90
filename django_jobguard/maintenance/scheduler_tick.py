"""The scheduler tick: the schedules' due ticks enqueued (see :mod:`django_jobguard.schedules`)."""

from __future__ import annotations

import dataclasses
import logging

from django.db import DatabaseError, InterfaceError

from .. import schedules
from ..conf import get_settings

logger = logging.getLogger("django_jobguard.worker")

__all__ = ["SCHEDULER_MIN_SLEEP_SECONDS", "SCHEDULER_RETRY_SECONDS", "SchedulerTick", "TickResult"]

#: Shortest wait between two scheduler passes, however close the next tick is.
SCHEDULER_MIN_SLEEP_SECONDS = 0.01
#: Wait before the scheduler tries again after a failed pass (a missing migration, an outage),
#: well within SCHEDULER.MISSED_AFTER so a brief outage loses no tick.
SCHEDULER_RETRY_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class TickResult:
    """What one scheduler pass did, and when (monotonic clock) the next one is due."""

    enqueued: int
    next_at: float
    failed: bool = False


class SchedulerTick:
    """Runs the scheduler in a worker: syncs the schedules once, then enqueues due ticks."""

    def __init__(self, alias: str, worker_id: str = "") -> None:
        self.alias = alias
        self.worker_id = worker_id
        self._synced = False

    def run_once(self, now: float) -> TickResult:
        """One pass at monotonic time ``now``; a failure is logged and retried later, never raised."""
        interval = get_settings().scheduler.interval
        try:
            if not self._synced:
                schedules.sync(using=self.alias)
                self._synced = True
            done = schedules.run_once(using=self.alias)
        except (DatabaseError, InterfaceError):
            logger.warning(
                "scheduler_failed worker_id=%s; retrying in %.0fs",
                self.worker_id,
                max(interval, SCHEDULER_RETRY_SECONDS),
                exc_info=True,
            )
            return TickResult(0, now + max(interval, SCHEDULER_RETRY_SECONDS), failed=True)
        except Exception:
            # A scheduler bug must not stop this worker from running jobs.
            logger.exception("scheduler_crashed worker_id=%s", self.worker_id)
            return TickResult(0, now + max(interval, SCHEDULER_RETRY_SECONDS), failed=True)
        next_at = now + interval
        if done.next_due_in is not None:
            # Wake for the next tick rather than up to a whole interval after it.
            next_at = now + min(interval, max(SCHEDULER_MIN_SLEEP_SECONDS, done.next_due_in))
        return TickResult(len(done.enqueued), next_at)
