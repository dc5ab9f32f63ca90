"""django-jobguard: background jobs that stay correct under at-least-once delivery.

Public API: :func:`task`, :class:`Task`, :class:`JobContext`, :func:`lock`, and the
errors handlers raise or callers catch.
"""

from .context import JobContext
from .exceptions import (
    IdempotencyConflict,
    InvalidArgumentsError,
    JobguardError,
    LeaseLost,
    LockNotAcquired,
    LockUnavailable,
    PermanentError,
    RecoverableError,
    ReplayError,
    TransientError,
    UnknownTaskError,
)
from .locks import lock
from .task import Task, task

__version__ = "0.1.0"

__all__ = [
    "IdempotencyConflict",
    "InvalidArgumentsError",
    "JobContext",
    "JobguardError",
    "LeaseLost",
    "LockNotAcquired",
    "LockUnavailable",
    "PermanentError",
    "RecoverableError",
    "ReplayError",
    "Task",
    "TransientError",
    "UnknownTaskError",
    "__version__",
    "lock",
    "task",
]
