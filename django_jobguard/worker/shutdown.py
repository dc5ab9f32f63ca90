"""Graceful shutdown: jobs not started go back at once, running ones get the grace period.

What is still running after ``SHUTDOWN_GRACE`` is handed back too (its attempt refunded:
the worker stopped it, the job did not fail). On SQLite a running job's open transaction
holds the database's only write lock, so its connection is cut first (see :func:`cut_connection`).
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

__all__ = ["cut_connection", "shut_down"]


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
    for h in running:
        with worker._lock:
            if h.state is not HeldState.RUNNING:
                continue
            h.state = HeldState.ABANDONED
        if cut:
            # SQLite: a running job's open transaction (an atomic task's, or one its
            # handler opened) holds the database's only write lock, so no hand-back
            # could commit while it lives. Closing the job's connection rolls that
            # transaction back (nothing of the attempt is kept, as if the process
            # had died) and leaves the handler no way to write; then the job is
            # handed back like on PostgreSQL, instead of waiting for its lease.
            cut_connection(worker, h)
        _hand_back(worker, h)
        if cut:
            release_lock(h, worker.worker_id)  # its handler can no longer write: free the resource
        # Otherwise its lock stays with the handler, which runs until the process
        # exits; the TTL frees it after that.


def cut_connection(worker: Worker, held: Held) -> None:
    """Close the database connection of a job's executor thread from this thread (SQLite).

    Its open transaction is rolled back and its handler's next query fails. Django lets
    SQLite connections cross threads (``check_same_thread=False``); interrupting first
    ends a statement in progress.
    """
    raw = getattr(held.connection, "connection", None)
    if raw is None:
        return
    try:
        raw.interrupt()
        raw.close()
    except Exception:  # the connection may be closing already: nothing left to cut
        logger.debug("connection_cut_failed job_id=%s", held.job.id, exc_info=True)
    logger.info(
        "job_connection_closed job_id=%s; its transaction rolled back so it can be handed back",
        held.job.id,
        extra=job_fields(held.job, worker.worker_id, outcome="handed_back"),
    )
