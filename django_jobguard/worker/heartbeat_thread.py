"""The heartbeat thread: a tick every :data:`HEARTBEAT_TICK_SECONDS` until the worker stops.

Each tick keeps the leases and locks of the held jobs (:class:`~.leases.LeaseKeeper`), fails
the jobs past their hard timeout (:mod:`.watchdog`), writes the progress their handlers
reported (the keeper again, only for handlers that report), writes the worker's beat row
(:class:`~django_jobguard.monitoring.beats.Beat`) and, while the database answers, touches
the liveness file. A database error backs the next try off, logged once per outage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, connections

from .. import events
from ..conf import get_settings
from ..monitoring import beats
from .held import LOGGER_NAME, close_connection
from .leases import LeaseKeeper
from .outage import DatabaseOutage, backoff_delay

if TYPE_CHECKING:
    from .aio import AsyncExecutor
    from .slots import Slots
    from .watchdog import Watchdog

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["HEARTBEAT_TICK_SECONDS", "LIVENESS_TOUCH_SECONDS", "Heartbeat"]

#: How often the heartbeat thread wakes to see whose lease or lock needs renewing.
HEARTBEAT_TICK_SECONDS = 0.25
#: First and longest wait (seconds) before the heartbeat tries the database again after an error.
HEARTBEAT_BACKOFF_SECONDS = 0.5
HEARTBEAT_BACKOFF_MAX_SECONDS = 5.0
#: Seconds between two touches of JOBGUARD["LIVENESS_FILE"] by the heartbeat thread.
LIVENESS_TOUCH_SECONDS = 1.0


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
        self._liveness_touched_at = -LIVENESS_TOUCH_SECONDS

    def run(self) -> None:
        failures = 0
        retry_at = 0.0
        try:
            while not self._stop.wait(HEARTBEAT_TICK_SECONDS):
                if failures and time.monotonic() < retry_at:
                    continue  # backing off: the database failed the last try
                try:
                    self.tick()
                    self._touch_liveness_file()
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
        """Renew the locks and leases due, fail jobs past their hard timeout, write the progress
        reports and the beat row."""
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
        self.keeper.write_progress(held, now)  # reported progress: nothing unless a handler reports
        if aio is not None:
            events.emit(events.EventLoopSampled(aio.running, aio.size, aio.lag))
        # The worker's own row and the outcome counts: one upsert each per beat interval.
        self.beat.maybe_beat(now, len(active), None if aio is None else aio.sample)

    def _touch_liveness_file(self) -> None:
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
