"""One elected maintenance worker at a time, through a lease row in the database.

With ``JOBGUARD["MAINTENANCE_LEADER"]`` on, only the worker holding the row
``jobguard:leader:maintenance`` of the lock table runs the reaper, redrive and key pruning;
the others skip those passes. The row is a database lock (a TTL and an owner token on the
database clock), not a session advisory lock, so it works through PgBouncer in transaction
mode. The leader renews it on every pass; if the leader dies, the row expires after
``LEADER_TTL_PASSES`` reaper intervals and the next worker to try takes over, so expired
leases may wait that much longer to be returned. Maintenance is safe with many workers
doing it at once; leadership only saves their queries, hence off by default.

Job pruning (:mod:`.job_pruner`) elects one worker whatever that setting: with it off, through
a row of its own, ``jobguard:leader:retention`` (the ``key`` and ``ttl`` arguments).
"""

from __future__ import annotations

import logging

from ..exceptions import LockNotAcquired, LockUnavailable
from ..locks.db import DatabaseLock

logger = logging.getLogger("django_jobguard.leadership")

__all__ = ["LEADER_KEY", "LEADER_PREFIX", "MaintenanceLeadership"]

#: The leadership row's key in the lock table: ``jobguard:leader:maintenance``.
LEADER_PREFIX = "jobguard:leader:"
LEADER_KEY = "maintenance"
#: Reaper intervals a leader's row outlives its last renewal.
LEADER_TTL_PASSES = 3
#: The shortest leadership TTL, in seconds.
MIN_LEADER_TTL_SECONDS = 2.0


class MaintenanceLeadership:
    """Holds, renews and gives up one worker's claim on maintenance leadership."""

    def __init__(
        self,
        alias: str,
        worker_id: str,
        reaper_interval: float = 0.0,
        *,
        ttl: float | None = None,
        key: str = LEADER_KEY,
    ) -> None:
        self.alias = alias
        self.worker_id = worker_id
        self.ttl = max(MIN_LEADER_TTL_SECONDS, LEADER_TTL_PASSES * reaper_interval if ttl is None else ttl)
        #: What is led: the row is ``jobguard:leader:<key>``, the log lines ``<key>_leader_elected``...
        self.key = key
        self._lock: DatabaseLock | None = None

    def hold(self) -> bool:
        """Whether this worker leads maintenance now: renews the row, or takes it if free."""
        try:
            if self._lock is not None and self._lock.held:
                if self._lock.extend():
                    return True
                logger.warning("%s_leader_lost worker_id=%s", self.key, self.worker_id)
            lock = DatabaseLock(
                self.key, ttl=self.ttl, prefix=LEADER_PREFIX, blocking=False, using=self.alias
            )
            if not lock.acquire(blocking=False):
                return False
            self._lock = lock
        except LockUnavailable:
            logger.warning("%s_leader_unavailable worker_id=%s", self.key, self.worker_id, exc_info=True)
            return False
        logger.info(
            "%s_leader_elected worker_id=%s ttl=%.1f",
            self.key,
            self.worker_id,
            self.ttl,
            extra={"worker_id": self.worker_id},
        )
        return True

    def resign(self) -> None:
        """Free the row at shutdown, so another worker takes over at its next pass."""
        if self._lock is None or not self._lock.held:
            return
        try:
            self._lock.release()
        except (LockNotAcquired, LockUnavailable):
            pass  # expired or unreachable: the TTL frees it
        logger.info("%s_leader_resigned worker_id=%s", self.key, self.worker_id)
