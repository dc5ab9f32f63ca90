"""A job this worker holds a lease on, shared by the loop, the executors and lease keeping."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from django.db import DatabaseError, connections

from .. import store
from ..context import JobContext, RunSignals
from ..log import log_job_exception
from ..outcome import HeldState

__all__ = ["LOGGER_NAME", "Held", "reset_after_db_error"]

#: Every module of the worker logs under the one name the worker always used.
LOGGER_NAME = "django_jobguard.worker"

logger = logging.getLogger(LOGGER_NAME)


@dataclasses.dataclass(eq=False, slots=True)
class Held:
    """A job this worker holds a lease on, from claim to ack or hand-back."""

    job: store.ClaimedJob
    renewed_at: float
    state: HeldState = HeldState.WAITING
    started_at: float = 0.0
    deadline: float | None = None
    context: JobContext | None = None
    lock: Any = None
    lock_renewed_at: float = 0.0
    lock_lost: bool = False
    lease_lost: bool = False
    #: What the heartbeat tells the handler (its context reads them).
    signals: RunSignals = dataclasses.field(default_factory=RunSignals)
    #: The executor thread's connection while the job runs, so shutdown can cut it (SQLite).
    connection: Any = None
    #: Held by that connection while a cursor is open (SQLite; ``store.cursor_lock``).
    cursor_lock: threading.RLock | None = None
    #: Runs as a coroutine on the worker's event loop (``--async-slots``), not on a thread.
    on_loop: bool = False
    #: When (monotonic) its job transaction opened, while an ``atomic=True`` job's is open; else 0.
    transaction_started_at: float = 0.0
    #: With tracing on, makes the attempt's settle span current again: its batched ack is
    #: written and reported on the ack thread, whose log lines and exemplars join the trace.
    trace_scope: Callable[[], AbstractContextManager[Any]] | None = None


def reset_after_db_error(held: Held, worker_id: str, alias: str, consequence: str) -> None:
    """Log the database error being handled for this job, and close the thread's connection.

    The next query reconnects. The job keeps its lease until it expires, and the reaper
    gives it back. Call from the ``except`` block, so the log line carries the traceback.
    """
    # A database error can quote the statement's values (a key, an argument).
    log_job_exception(
        logger,
        logging.WARNING,
        "job_db_error job_id=%s; %s",
        held.job.id,
        consequence,
        job=held.job,
        worker_id=worker_id,
        outcome="db_error",
    )
    close_connection(alias)


def close_connection(alias: str) -> None:
    """Close this thread's connection after a database error; the next query reconnects.

    mysqlclient raises when closing a connection the server already dropped; Django has
    forgotten it by then all the same, so that error is moot.
    """
    try:
        connections[alias].close()
    except DatabaseError:
        pass
