"""Database outages as one worker sees them: jittered back-off, and one log line per interval.

While the database is away (a restart, a failover, a network cut) every thread of the
worker fails its statements; logging each try would write several tracebacks a second for
as long as the outage lasts. The first failure logs ``claim_failed`` or ``heartbeat_failed``
(whichever thread met it, with the traceback), then ``database_still_unreachable`` once per
:data:`OUTAGE_LOG_INTERVAL_SECONDS`, and the first statement that succeeds again logs
``database_reachable`` with how long it took. The process stays up throughout and resumes
by itself; its beat row goes stale meanwhile, which is how ``jobguard_status`` and the
admin see it as unhealthy.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from .held import LOGGER_NAME

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["OUTAGE_LOG_INTERVAL_SECONDS", "DatabaseOutage", "backoff_delay"]

#: Seconds between two ``database_still_unreachable`` lines of one worker.
OUTAGE_LOG_INTERVAL_SECONDS = 30.0


def backoff_delay(failures: int, base: float, cap: float) -> float:
    """Wait before the next try after ``failures`` failures in a row: doubling, capped, jittered.

    Between half and all of ``min(cap, base * 2**(failures - 1))``, so workers that lost the
    database together do not all come back in the same instant.
    """
    ceiling: float = min(cap, base * 2.0 ** max(0, failures - 1))
    return ceiling * (0.5 + random.random() / 2.0)  # noqa: S311 - spreading retries, not a secret


class DatabaseOutage:
    """Whether this worker reaches its database now, shared by its threads; logs the changes."""

    def __init__(self, worker_id: str, log_interval: float = OUTAGE_LOG_INTERVAL_SECONDS) -> None:
        self.worker_id = worker_id
        self.log_interval = log_interval
        self._lock = threading.Lock()
        #: monotonic time of the first failure of the current outage; None while reachable.
        self.since: float | None = None
        #: Failures (of any thread) since the outage began.
        self.failures = 0
        self._logged_at = 0.0

    @property
    def healthy(self) -> bool:
        return self.since is None

    def failed(self, where: str, error: BaseException) -> None:
        """Count a statement that failed for want of the database; log if this is news or due.

        Call from the ``except`` block: the first line of an outage carries the traceback.
        """
        with self._lock:
            now = time.monotonic()
            self.failures += 1
            if self.since is None:
                self.since = self._logged_at = now
                self.failures = 1
                logger.warning(
                    "%s_failed worker_id=%s; database_unreachable: retrying with back-off, "
                    "one line every %.0fs while it lasts",
                    where,
                    self.worker_id,
                    self.log_interval,
                    exc_info=True,
                    extra={"worker_id": self.worker_id},
                )
            elif now - self._logged_at >= self.log_interval:
                self._logged_at = now
                logger.warning(
                    "database_still_unreachable worker_id=%s for=%.0fs failures=%d error=%s",
                    self.worker_id,
                    now - self.since,
                    self.failures,
                    type(error).__name__,
                    extra={"worker_id": self.worker_id},
                )

    def recovered(self) -> None:
        """A statement succeeded: end the outage, if there was one, with one line."""
        if self.since is None:
            return
        with self._lock:
            if self.since is None:
                return
            lasted = time.monotonic() - self.since
            logger.warning(
                "database_reachable worker_id=%s after=%.1fs failures=%d; resuming",
                self.worker_id,
                lasted,
                self.failures,
                extra={"worker_id": self.worker_id},
            )
            self.since = None
            self.failures = 0
