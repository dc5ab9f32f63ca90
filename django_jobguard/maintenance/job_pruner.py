"""Job pruning in the worker: finished jobs past their retention deleted by one elected worker.

Finished jobs were kept for ever unless someone scheduled ``jobguard_prune``: the jobs table
grew by every job run (about 440 bytes a job on PostgreSQL), and every scan of it with it.
Now one worker at a time deletes them, by the rules of :mod:`.retention` and
``JOBGUARD["RETENTION"]``:

- **who**: the maintenance leader when ``MAINTENANCE_LEADER`` is on; otherwise the holder of
  its own lease row, ``jobguard:leader:retention`` (a database lock, so one worker prunes
  however many run, and another takes over within two intervals if it dies);
- **where**: on a thread of its own, with its own database connection, so the claim loop never
  waits for a pass;
- **how**: in batches of ``RETENTION["BATCH_SIZE"]`` jobs, each its own short transaction that
  locks only finished rows (``SKIP LOCKED``), which no claim reads; a pass stops after
  :data:`PASS_SECONDS` and the next one goes on where it stopped, at once while it is behind;
- **when**: every ``RETENTION["INTERVAL"]`` seconds, the first one interval after the worker
  starts (a worker restarted in a loop does not prune at each start). ``INTERVAL`` 0 turns it
  off; a ``--burst`` worker does not prune.

Each pass that deleted something logs ``jobs_pruned`` with its counts per status and its
duration, and emits :class:`~django_jobguard.events.JobsPruned` per status (the
``jobguard_jobs_pruned_total`` counter).

The same pass then deletes settled outbox messages past ``RETENTION["OUTBOX_DELIVERED"]`` and
``["OUTBOX_SKIPPED"]`` (:func:`.retention.prune_outbox_messages`, on the outbox's database),
within the same deadline, and logs ``outbox_messages_pruned`` when it deleted any.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, connections

from .. import events
from ..conf import get_settings
from ..outbox.publisher import outbox_alias
from . import retention
from .leadership import MaintenanceLeadership

logger = logging.getLogger("django_jobguard.worker")

__all__ = ["PASS_SECONDS", "RETENTION_LEADER_KEY", "JobPruner"]

#: Seconds one pass deletes for at most, so the lease is renewed and a stop is heard between passes.
PASS_SECONDS = 5.0
#: The lease row of the pruning worker when MAINTENANCE_LEADER is off: jobguard:leader:retention.
RETENTION_LEADER_KEY = "retention"
#: Seconds to wait after a database error before the next try.
ERROR_BACKOFF_SECONDS = 30.0


class JobPruner:
    """Deletes finished jobs past their retention, a pass per ``RETENTION["INTERVAL"]``, when elected.

    ``leading`` says whether this worker leads maintenance (with ``MAINTENANCE_LEADER``); None
    makes the pruner elect itself through its own lease row.
    """

    def __init__(self, alias: str, worker_id: str = "", leading: Callable[[], bool] | None = None) -> None:
        self.alias = alias
        self.worker_id = worker_id
        self._leading = leading
        self._lease: MaintenanceLeadership | None = None
        #: Where each scope's sweep stands between passes (see retention.prune_retained_jobs).
        self._cursors: dict[retention.RetentionScope, retention.Cursor] = {}
        self._outbox_sweeps: dict[retention.OutboxScope, retention.OutboxSweep] = {}
        #: The outbox part of the last pass (None before the first).
        self.last_outbox: retention.OutboxPrune | None = None
        self._stop = threading.Event()

    def elected(self) -> bool:
        """Whether this worker prunes now: the maintenance leader, or the holder of the retention lease."""
        if self._leading is not None:
            return self._leading()
        if self._lease is None:
            interval = get_settings().retention.interval
            self._lease = MaintenanceLeadership(
                self.alias,
                self.worker_id,
                ttl=2 * interval + PASS_SECONDS,
                key=RETENTION_LEADER_KEY,
            )
        return self._lease.hold()

    def run_once(self, deadline: float | None = None) -> retention.RetainedPrune:
        """One pass now (elected or not): delete what is past its retention, report it."""
        result = retention.prune_retained_jobs(
            self.alias, deadline=deadline, cursors=self._cursors, stop=self._stop.is_set
        )
        for status, count in result.deleted.items():
            if count:
                events.emit(events.JobsPruned(status, count))
        level = logging.INFO if result.total else logging.DEBUG
        logger.log(
            level,
            "jobs_pruned worker_id=%s succeeded=%d cancelled=%d dead=%d batches=%d seconds=%.3f more=%s",
            self.worker_id,
            result.deleted.get("succeeded", 0),
            result.deleted.get("cancelled", 0),
            result.deleted.get("dead", 0),
            result.batches,
            result.seconds,
            result.more,
            extra={"worker_id": self.worker_id},
        )
        outbox = self.prune_outbox(deadline)
        if outbox.more and not result.more:
            result = dataclasses.replace(result, more=True)
        return result

    def prune_outbox(self, deadline: float | None = None) -> retention.OutboxPrune:
        """The outbox part of a pass: settled messages past their retention, logged when any went."""
        outbox = retention.prune_outbox_messages(
            deadline=deadline, sweeps=self._outbox_sweeps, stop=self._stop.is_set
        )
        self.last_outbox = outbox
        logger.log(
            logging.INFO if outbox.total else logging.DEBUG,
            "outbox_messages_pruned worker_id=%s delivered=%d skipped=%d keys=%d batches=%d seconds=%.3f "
            "more=%s",
            self.worker_id,
            outbox.deleted.get("delivered", 0),
            outbox.deleted.get("skipped", 0),
            outbox.keys,
            outbox.batches,
            outbox.seconds,
            outbox.more,
            extra={"worker_id": self.worker_id},
        )
        return outbox

    def run(self) -> None:
        """The thread: a pass per interval while elected, until :meth:`stop`; closes its connection."""
        try:
            wait = get_settings().retention.interval
            while not self._stop.wait(wait):
                wait = self._tick()
        finally:
            if self._lease is not None:
                self._lease.resign()
            connections[self.alias].close()
            connections[outbox_alias()].close()  # the outbox's, when it has a database of its own

    def _tick(self) -> float:
        """One pass if elected; the seconds until the next (none while a pass left work behind)."""
        interval = get_settings().retention.interval
        if interval <= 0:
            return 60.0  # turned off since the start (override_settings): look again later
        try:
            if not self.elected():
                return interval
            result = self.run_once(deadline=time.monotonic() + PASS_SECONDS)
        except (DatabaseError, InterfaceError):
            logger.warning("jobs_prune_failed worker_id=%s", self.worker_id, exc_info=True)
            connections[self.alias].close()
            connections[outbox_alias()].close()
            return min(interval, ERROR_BACKOFF_SECONDS)
        return 0.0 if result.more else interval

    def stop(self) -> None:
        """Ask the thread to end after its current batch."""
        self._stop.set()
