"""Lease keeping: heartbeats extend the held jobs' leases and renew their locks; the worker's beat row.

Runs on the heartbeat thread every :data:`HEARTBEAT_TICK_SECONDS`; a lease (or lock) is
renewed once a third of its visibility timeout (TTL) has passed. The hard-timeout watchdog
(:mod:`.watchdog`) runs on the same tick.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, connections

from .. import _faults, events, store
from ..conf import get_settings
from ..exceptions import LockUnavailable
from ..log import job_fields
from ..monitoring import beats
from .held import LOGGER_NAME, Held, close_connection
from .outage import DatabaseOutage, backoff_delay

if TYPE_CHECKING:
    from .aio import AsyncExecutor
    from .slots import Slots
    from .watchdog import Watchdog

logger = logging.getLogger(LOGGER_NAME)

__all__ = [
    "HEARTBEAT_FRACTION",
    "HEARTBEAT_TICK_SECONDS",
    "LIVENESS_TOUCH_SECONDS",
    "Heartbeat",
    "LeaseKeeper",
    "renew_lock",
]

#: How often the heartbeat thread wakes to see whose lease or lock needs renewing.
HEARTBEAT_TICK_SECONDS = 0.25
#: Leases are renewed when this fraction of the visibility timeout has passed.
HEARTBEAT_FRACTION = 1 / 3
#: First and longest wait (seconds) before the heartbeat tries the database again after an error.
HEARTBEAT_BACKOFF_SECONDS = 0.5
HEARTBEAT_BACKOFF_MAX_SECONDS = 5.0
#: Seconds between two touches of JOBGUARD["LIVENESS_FILE"] by the heartbeat thread.
LIVENESS_TOUCH_SECONDS = 1.0


def renew_lock(held: Held, now: float, worker_id: str) -> None:
    """Extend the job's lock; if it is gone, say so to the handler and refuse the ack."""
    handle = held.lock
    if handle is None:
        return
    try:
        kept = handle.extend()
        cause = "it expired, and another owner may have taken it"
    except LockUnavailable as exc:
        # Unknown is lost: the store may have restarted empty and given the key away.
        kept, cause = False, str(exc)
    if kept:
        held.lock_renewed_at = now
        return
    if held.lock is not handle or held.lock_lost:
        return  # released by the executor meanwhile, or already reported
    held.lock_lost = True
    held.signals.lock_lost.set()
    events.emit(events.LockFailed(held.job.queue_name, held.job.task_name, "lost"))
    fields = job_fields(held.job, worker_id, outcome="lock_lost")
    logger.warning(
        "lock_lost job_id=%s lock_key=%r; the job will not be acked: %s",
        held.job.id,
        fields["lock_key"],
        cause,
        extra=fields,
    )


class LeaseKeeper:
    """Keeps the leases and locks of the jobs a worker holds, and touches its liveness file."""

    def __init__(self, alias: str, worker_id: str) -> None:
        self.alias = alias
        self.worker_id = worker_id
        self._liveness_touched_at = -LIVENESS_TOUCH_SECONDS

    def renew_locks(self, active: Sequence[Held], now: float) -> None:
        """Renew the locks due, even of jobs whose lease is lost: their handlers still run."""
        for h in active:
            handle = h.lock
            if (
                handle is not None
                and not h.lock_lost
                and now - h.lock_renewed_at >= handle.ttl * HEARTBEAT_FRACTION
            ):
                renew_lock(h, now, self.worker_id)

    def renew_leases(self, active: Sequence[Held], now: float) -> list[Held]:
        """Extend the leases due in one statement; the jobs still held (lease not lost)."""
        held = [h for h in active if not h.lease_lost]
        due = [h for h in held if now - h.renewed_at >= h.job.visibility_timeout * HEARTBEAT_FRACTION]
        if not due:
            return held
        if _faults.ENABLED:
            _faults.maybe_crash("in_heartbeat")
        cancels: set[int] = set()
        renewed = store.heartbeat(
            self.alias, [(h.job.id, h.job.lease_token) for h in due], cancel_requested=cancels
        )
        for h in due:
            if h.job.id in renewed:
                h.renewed_at = now
                if h.job.id in cancels:
                    h.signals.cancel_requested.set()
            else:
                self._lost(h)
        return held

    def give_up(self, stuck: Sequence[Held], stalled: float) -> None:
        """Stop renewing the leases of jobs stuck behind a blocked event loop past their bound.

        Their leases expire and the reaper puts the jobs back for other workers; the handlers
        see ``context.lease_lost``, and one not started yet is handed back, not started.
        """
        for h in stuck:
            h.lease_lost = True
            h.signals.lease_lost.set()
            logger.warning(
                "lease_released job_id=%s task=%s stalled_for=%.2fs; the event loop it waits on is "
                "blocked past the job's timeout: its lease is left to expire, for another worker",
                h.job.id,
                h.job.task_name,
                stalled,
                extra=job_fields(h.job, self.worker_id, outcome="lease_released"),
            )

    def _lost(self, h: Held) -> None:
        h.lease_lost = True
        h.signals.lease_lost.set()
        events.emit(events.LeaseLost(h.job.queue_name, h.job.task_name, "heartbeat"))
        logger.warning(
            "lease_lost job_id=%s; another worker may run it now",
            h.job.id,
            extra=job_fields(h.job, self.worker_id, outcome="lease_lost"),
        )

    def touch_liveness_file(self) -> None:
        """Show a liveness probe that heartbeats still run (skipped while they fail)."""
        path = get_settings().liveness_file
        now = time.monotonic()
        if not path or now - self._liveness_touched_at < LIVENESS_TOUCH_SECONDS:
            return
        self._liveness_touched_at = now
        try:
            with open(path, "a"):
                os.utime(path)
        except OSError:
            logger.warning("liveness_file_failed worker_id=%s path=%s", self.worker_id, path, exc_info=True)


class Heartbeat:
    """The heartbeat thread: a :meth:`tick` every :data:`HEARTBEAT_TICK_SECONDS` until stopped."""

    def __init__(
        self,
        slots: Slots,
        keeper: LeaseKeeper,
        watchdog: Watchdog,
        beat: beats.Beat,
        outage: DatabaseOutage | None = None,
        aio: AsyncExecutor | None = None,
    ) -> None:
        self.outage = outage or DatabaseOutage(keeper.worker_id)
        self.slots = slots
        #: The event loop whose slots in use and lag the beat row and the metrics show.
        self.aio = aio
        self.keeper = keeper
        self.watchdog = watchdog
        self.beat = beat
        self.alias = keeper.alias
        self.worker_id = keeper.worker_id
        self._stop = threading.Event()

    def run(self) -> None:
        failures = 0
        retry_at = 0.0
        try:
            while not self._stop.wait(HEARTBEAT_TICK_SECONDS):
                if failures and time.monotonic() < retry_at:
                    continue  # backing off: the database failed the last try
                try:
                    self.tick()
                    self.keeper.touch_liveness_file()
                    failures = 0
                except (DatabaseError, InterfaceError) as exc:
                    failures += 1
                    # One line per outage interval, shared with the claim loop, not one per tick.
                    self.outage.failed("heartbeat", exc)
                    close_connection(self.alias)
                    retry_at = time.monotonic() + backoff_delay(
                        failures, HEARTBEAT_BACKOFF_SECONDS, HEARTBEAT_BACKOFF_MAX_SECONDS
                    )
                except Exception:
                    logger.exception("heartbeat_crashed worker_id=%s", self.worker_id)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop.set()

    def tick(self) -> None:
        """Renew the locks and leases due, fail jobs past their hard timeout, write the beat row."""
        now = time.monotonic()
        aio = self.aio
        if aio is not None:
            # Blocking code cannot be cancelled: its job fails here once past its timeout.
            overdue = aio.overdue(now)
            if overdue is not None:
                self.watchdog.abandon(overdue)
        active = self.slots.active()
        # The longest open atomic job transaction (it holds the cluster's vacuum horizon), set
        # before the database work below, which may wait.
        opened = [h.transaction_started_at for h in active if h.transaction_started_at]
        events.emit(events.JobTransactionSampled(now - min(opened) if opened else 0.0))
        # Locks first, and even for jobs whose lease is lost: the handler still runs, so its
        # resource stays locked until it returns. A database error below must not stop them.
        self.keeper.renew_locks(active, now)
        if aio is not None:
            self.keeper.give_up(aio.stuck(active, now), aio.stalled(now))
        held = self.keeper.renew_leases(active, now)
        self.watchdog.check(held, now)
        if aio is not None:
            events.emit(events.EventLoopSampled(aio.running, aio.size, aio.lag))
        # The worker's own row and the outcome counts: one upsert each per beat interval.
        self.beat.maybe_beat(now, len(active), None if aio is None else aio.sample)
