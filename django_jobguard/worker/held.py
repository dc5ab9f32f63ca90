"""A job this worker holds a lease on, shared by the loop, the executors and lease keeping."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from .. import store
from ..context import JobContext
from ..outcome import HeldState

__all__ = ["LOGGER_NAME", "Held"]

#: Every module of the worker logs under the one name the worker always used.
LOGGER_NAME = "django_jobguard.worker"

logger = logging.getLogger(LOGGER_NAME)


@dataclasses.dataclass(eq=False)
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
    #: The executor thread's connection while the job runs, so shutdown can cut it (SQLite).
    connection: Any = None
    #: Held by that connection while a cursor is open (SQLite; ``store.guard_statements``).
    statement_guard: threading.RLock | None = None
