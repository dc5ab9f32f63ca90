"""django-jobguard: background jobs that stay correct under at-least-once delivery.

Public API: :func:`task`, :class:`Task`, :class:`JobContext`, :func:`lock`, the flow-control
specs :class:`Limit` and :class:`Rate`, and the errors handlers raise or callers catch.
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
from .flow import Limit, Rate
from .locks import lock
from .task import Task, task

__version__ = "0.1.0"

__all__ = [
    "IdempotencyConflict",
    "InvalidArgumentsError",
    "JobContext",
    "JobguardError",
    "LeaseLost",
    "Limit",
    "LockNotAcquired",
    "LockUnavailable",
    "PermanentError",
    "Rate",
    "RecoverableError",
    "ReplayError",
    "Task",
    "TransientError",
    "UnknownTaskError",
    "__version__",
    "lock",
    "task",
]
