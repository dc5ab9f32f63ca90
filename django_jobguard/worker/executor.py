"""Executor threads: each takes claimed jobs one at a time, runs the pipeline and settles the outcome."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, InterfaceError, connections

from .. import store
from ..log import job_fields
from ..outcome import HandBack, HeldState
from . import pipeline
from .held import LOGGER_NAME, Held, reset_after_db_error

if TYPE_CHECKING:
    from .loop import Worker

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["CONNECTION_CHECK_AFTER_IDLE_SECONDS", "hand_back", "run_executor"]

#: An executor idle this long checks its connection before the next job, so a connection
#: the database dropped meanwhile (restart, failover, idle timeout) costs that job no attempt.
CONNECTION_CHECK_AFTER_IDLE_SECONDS = 1.0


def hand_back(held: Held) -> HandBack:
    """The outcome of a job the worker gives back because it stops."""
    return HandBack(started=held.state in (HeldState.RUNNING, HeldState.ABANDONED))


def run_executor(worker: Worker) -> None:
    """Run jobs from the worker's ready queue until a None arrives or this thread is replaced."""
    guard = store.guard_statements(worker.alias)  # so shutdown can cut its connection (SQLite)
    try:
        while True:
            idle_since = time.monotonic()
            held = worker._ready.get()
            if held is None:
                return
            if time.monotonic() - idle_since >= CONNECTION_CHECK_AFTER_IDLE_SECONDS:
                _drop_unusable_connection(worker)
            held.statement_guard = guard
            if _run_one(worker, held):
                return
    finally:
        connections.close_all()


def _run_one(worker: Worker, held: Held) -> bool:
    """Run (or hand back) one held job and settle it; whether this thread was replaced meanwhile."""
    with worker._lock:
        if worker._stopping or held.state is not HeldState.WAITING:
            start = False
        else:
            held.state = HeldState.RUNNING
            held.started_at = time.monotonic()
            held.connection = connections[worker.alias]
            start = True
    try:
        if start:
            worker.completer.settle_run(held, pipeline.run(held, worker.runtime))
        elif held.state is HeldState.WAITING:
            worker.completer.settle(held, hand_back(held))
    except (DatabaseError, InterfaceError):
        reset_after_db_error(held, worker.worker_id, worker.alias, "connection reset")
    except Exception:
        logger.exception(
            "job_crashed job_id=%s",
            held.job.id,
            extra=job_fields(held.job, worker.worker_id, outcome="crashed"),
        )
    finally:
        with worker._lock:
            # An abandoned job's slot went to a replacement thread already.
            replaced = held.state is HeldState.ABANDONED
            if not replaced:
                if held.state in (HeldState.WAITING, HeldState.RUNNING):
                    held.state = HeldState.DONE
                worker._held.pop(held.job.id, None)
                worker.processed += 1
        worker._slot_freed.set()
    return replaced


def _drop_unusable_connection(worker: Worker) -> None:
    """Close this thread's connection if the database dropped it; the next query reconnects."""
    connection = connections[worker.alias]
    if connection.connection is not None and not connection.is_usable():
        logger.info("connection_reset worker_id=%s; the database had dropped it", worker.worker_id)
        connection.close()
