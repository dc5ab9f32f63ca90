"""Graceful shutdown: jobs not started go back at once, running ones get the grace period.

What is still running after ``SHUTDOWN_GRACE`` is handed back too (its attempt refunded:
the worker stopped it, the job did not fail). On SQLite a running job's open transaction
holds the database's only write lock, so its connection is cut first (see :func:`cut_connections`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError

from .. import store
from ..log import job_fields
from .executor import hand_back
from .held import LOGGER_NAME, Held
from .pipeline import release_lock

if TYPE_CHECKING:
    from .completer import Completer
    from .slots import Slots

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["Shutdown", "cut_connections"]

#: The longest shutdown waits for the statements of abandoned jobs to stop (SQLite).
CUT_WAIT_SECONDS = 10.0
#: How long one turn waits for an interrupted statement to let go of its connection.
CUT_TURN_SECONDS = 0.05


class Shutdown:
    """Gives back what a stopping worker holds: waiting jobs at once, running ones after the grace."""

    def __init__(self, slots: Slots, completer: Completer, alias: str, worker_id: str) -> None:
        self.slots = slots
        self.completer = completer
        self.alias = alias
        self.worker_id = worker_id

    def run(self, executors: Sequence[threading.Thread], grace: float, forced: Callable[[], bool]) -> bool:
        """Hand back what did not start, wait for the rest; True if threads had to be abandoned.

        ``forced()`` turns true on a second signal: the grace period ends there.
        """
        slots = self.slots
        slots.close()
        slots.release_executors(len(executors))
        deadline = time.monotonic() + (0 if forced() else grace)
        cut = not store.writes_while_busy(self.alias)
        deferred: list[Held] = []
        while True:
            running, waiting = slots.drain()
            if cut and running:
                # SQLite: a running job's transaction would make these hand-backs wait for the
                # write lock (and fail after the busy timeout): hand them back once it is gone.
                deferred += waiting
                waiting = []
            elif deferred:
                waiting, deferred = waiting + deferred, []
            for h in waiting:
                self._hand_back(h)
                slots.remove(h)
            if not running:
                break
            if time.monotonic() >= deadline or forced():
                self._abandon_running(running, cut)
                for h in deferred:
                    self._hand_back(h)
                return True
            slots.wait_freed(0.1)
            slots.clear_freed()
        for thread in executors:
            thread.join(timeout=1)
        return slots.abandoned > 0

    def _hand_back(self, held: Held) -> None:
        try:
            self.completer.settle(held, hand_back(held))
        except (DatabaseError, InterfaceError):
            logger.warning("hand_back_failed job_id=%s; its lease will expire", held.job.id)

    def _abandon_running(self, running: list[Held], cut: bool) -> None:
        """The grace period is over: hand back the jobs still running, their threads left behind."""
        abandoned = [h for h in running if self.slots.abandon(h)]
        if cut:
            # SQLite: a running job's open transaction (an atomic task's, or one its handler
            # opened) holds the database's only write lock, so no hand-back could commit while
            # it lives. Closing the jobs' connections rolls those transactions back (nothing of
            # the attempt is kept, as if the process had died) and leaves the handlers no way to
            # write; then the jobs are handed back like on PostgreSQL, instead of waiting for
            # their leases.
            cut_connections(abandoned, self.worker_id)
        for h in abandoned:
            self._hand_back(h)
            if cut:
                release_lock(h, self.worker_id)  # its handler can no longer write: free the resource
            # Otherwise its lock stays with the handler, which runs until the process
            # exits; the TTL frees it after that.


def cut_connections(helds: list[Held], worker_id: str) -> None:
    """Close the database connections of jobs' executor threads from this thread (SQLite).

    Each open transaction is rolled back and the handler's next query fails. Django lets
    SQLite connections cross threads (``check_same_thread=False``), but sqlite3 crashes the
    process when a connection is closed while another thread runs a statement on it. So a
    connection is closed only while this thread holds its cursor lock, which the
    executor's connection holds while a cursor is open (``store.cursor_lock``); a
    running statement is interrupted first. One waiting for the write lock cannot be
    interrupted, so the jobs are tried in turns: closing the connection that holds the lock
    lets the waiting statement finish.
    """
    pending = [h for h in helds if getattr(h.connection, "connection", None) is not None]
    deadline = time.monotonic() + CUT_WAIT_SECONDS
    while pending:
        pending = [h for h in pending if not _cut_between_statements(h, worker_id)]
        if not pending:
            return
        if time.monotonic() >= deadline:
            for h in pending:
                logger.warning(
                    "connection_cut_skipped job_id=%s; its statement did not stop, its lease will expire",
                    h.job.id,
                    extra=job_fields(h.job, worker_id),
                )
            return


def _cut_between_statements(held: Held, worker_id: str) -> bool:
    """Close the job's connection unless a statement is running on it; whether it is done."""
    raw, lock = held.connection.connection, held.cursor_lock
    if raw is None or lock is None:
        return True  # closed meanwhile, or its cursors take no lock: nothing safe to do
    try:
        if not lock.acquire(blocking=False):
            # A statement is running: end it, and take the lock as it is let go, before the
            # handler's next statement (its failure's retry write would spend an attempt).
            raw.interrupt()
            if not lock.acquire(timeout=CUT_TURN_SECONDS):
                return False
        try:
            raw.close()
        finally:
            lock.release()
    except Exception:  # the connection may be closing already: nothing left to cut
        logger.debug("connection_cut_failed job_id=%s", held.job.id, exc_info=True)
        return True
    logger.info(
        "job_connection_closed job_id=%s; its transaction rolled back so it can be handed back",
        held.job.id,
        extra=job_fields(held.job, worker_id, outcome="handed_back"),
    )
    return True
