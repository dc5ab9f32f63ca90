"""Graceful shutdown: jobs not started go back at once, running ones get the grace period.

What is still running after ``SHUTDOWN_GRACE`` is handed back too (its attempt refunded:
the worker stopped it, the job did not fail). On SQLite a running job's open transaction
holds the database's only write lock, so its connection is cut first (see :func:`cut_connections`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError

from .. import store
from ..log import job_fields
from ..outcome import HeldState
from .executor import hand_back
from .held import LOGGER_NAME, Held
from .pipeline import release_lock

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["cut_connections", "shut_down"]

#: The longest shutdown waits for the statements of abandoned jobs to stop (SQLite).
CUT_WAIT_SECONDS = 10.0
#: How long one turn waits for an interrupted statement to let go of its connection.
CUT_TURN_SECONDS = 0.05


def shut_down(worker: Worker) -> bool:
    """Hand back what did not start, wait for the rest; True if threads had to be abandoned."""
    worker._stopping = True
    for _ in worker._threads:
        worker._ready.put(None)
    deadline = time.monotonic() + (0 if worker._forced else worker.shutdown_grace)
    cut = not store.writes_while_busy(worker.alias)
    deferred: list[Held] = []
    while True:
        with worker._lock:
            running = [h for h in worker._held.values() if h.state is HeldState.RUNNING]
            waiting = [h for h in worker._held.values() if h.state is HeldState.WAITING]
            for h in waiting:
                h.state = HeldState.HANDING_BACK
        if cut and running:
            # SQLite: a running job's transaction would make these hand-backs wait for the
            # write lock (and fail after the busy timeout): hand them back once it is gone.
            deferred += waiting
            waiting = []
        elif deferred:
            waiting, deferred = waiting + deferred, []
        for h in waiting:
            _hand_back(worker, h)
            with worker._lock:
                worker._held.pop(h.job.id, None)
        if not running:
            break
        if time.monotonic() >= deadline or worker._forced:
            _abandon_running(worker, running, cut)
            for h in deferred:
                _hand_back(worker, h)
            return True
        worker._slot_freed.wait(0.1)
        worker._slot_freed.clear()
    for thread in worker._threads:
        thread.join(timeout=1)
    return worker._abandoned > 0


def _hand_back(worker: Worker, held: Held) -> None:
    try:
        worker.completer.settle(held, hand_back(held))
    except (DatabaseError, InterfaceError):
        logger.warning("hand_back_failed job_id=%s; its lease will expire", held.job.id)


def _abandon_running(worker: Worker, running: list[Held], cut: bool) -> None:
    """The grace period is over: hand back the jobs still running, their threads left behind."""
    abandoned = []
    for h in running:
        with worker._lock:
            if h.state is not HeldState.RUNNING:
                continue
            h.state = HeldState.ABANDONED
        abandoned.append(h)
    if cut:
        # SQLite: a running job's open transaction (an atomic task's, or one its handler
        # opened) holds the database's only write lock, so no hand-back could commit while
        # it lives. Closing the jobs' connections rolls those transactions back (nothing of
        # the attempt is kept, as if the process had died) and leaves the handlers no way to
        # write; then the jobs are handed back like on PostgreSQL, instead of waiting for
        # their leases.
        cut_connections(worker, abandoned)
    for h in abandoned:
        _hand_back(worker, h)
        if cut:
            release_lock(h, worker.worker_id)  # its handler can no longer write: free the resource
        # Otherwise its lock stays with the handler, which runs until the process
        # exits; the TTL frees it after that.


def cut_connections(worker: Worker, helds: list[Held]) -> None:
    """Close the database connections of jobs' executor threads from this thread (SQLite).

    Each open transaction is rolled back and the handler's next query fails. Django lets
    SQLite connections cross threads (``check_same_thread=False``), but sqlite3 crashes the
    process when a connection is closed while another thread runs a statement on it. So a
    connection is closed only while this thread holds its statement guard, which the
    executor's connection holds while a cursor is open (``store.guard_statements``); a
    running statement is interrupted first. One waiting for the write lock cannot be
    interrupted, so the jobs are tried in turns: closing the connection that holds the lock
    lets the waiting statement finish.
    """
    pending = [h for h in helds if getattr(h.connection, "connection", None) is not None]
    deadline = time.monotonic() + CUT_WAIT_SECONDS
    while pending:
        pending = [h for h in pending if not _cut_between_statements(worker, h)]
        if not pending:
            return
        if time.monotonic() >= deadline:
            for h in pending:
                logger.warning(
                    "connection_cut_skipped job_id=%s; its statement did not stop, its lease will expire",
                    h.job.id,
                    extra=job_fields(h.job, worker.worker_id),
                )
            return


def _cut_between_statements(worker: Worker, held: Held) -> bool:
    """Close the job's connection unless a statement is running on it; whether it is done."""
    raw, guard = held.connection.connection, held.statement_guard
    if raw is None or guard is None:
        return True  # closed meanwhile, or never guarded: nothing safe to do
    try:
        if not guard.acquire(blocking=False):
            # A statement is running: end it, and take the guard as it is let go, before the
            # handler's next statement (its failure's retry write would spend an attempt).
            raw.interrupt()
            if not guard.acquire(timeout=CUT_TURN_SECONDS):
                return False
        try:
            raw.close()
        finally:
            guard.release()
    except Exception:  # the connection may be closing already: nothing left to cut
        logger.debug("connection_cut_failed job_id=%s", held.job.id, exc_info=True)
        return True
    logger.info(
        "job_connection_closed job_id=%s; its transaction rolled back so it can be handed back",
        held.job.id,
        extra=job_fields(held.job, worker.worker_id, outcome="handed_back"),
    )
    return True
