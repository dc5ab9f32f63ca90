"""django-jobguard: background jobs that stay correct under at-least-once delivery.

Public API: :func:`task`, :class:`Task`, :class:`JobContext`, :func:`lock`, the flow-control
specs :class:`Limit` and :class:`Rate`, and the errors handlers raise or callers catch.
"""

from typing import TYPE_CHECKING, Any

from .context import JobContext
from .exceptions import (
    IdempotencyConflict,
    InvalidArgumentsError,
    JobCancelled,
    JobFailed,
    JobguardError,
    JobNotFound,
    LeaseLost,
    LockNotAcquired,
    LockUnavailable,
    PermanentError,
    RecoverableError,
    ReplayError,
    ResultExpired,
    ResultNotStored,
    TransientError,
    UnknownTaskError,
    WaitError,
    WaitTimeout,
)
from .flow import Limit, Rate
from .locks import lock
from .task import Signature, Task, task

if TYPE_CHECKING:
    from .outbox.bridge import enqueue_via_outbox
    from .outbox.publisher import publish
    from .workflows import Batch, chain, group

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "IdempotencyConflict",
    "InvalidArgumentsError",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobguardError",
    "LeaseLost",
    "Limit",
    "LockNotAcquired",
    "LockUnavailable",
    "PermanentError",
    "Rate",
    "RecoverableError",
    "ReplayError",
    "ResultExpired",
    "ResultNotStored",
    "Signature",
    "Task",
    "TransientError",
    "UnknownTaskError",
    "WaitError",
    "WaitTimeout",
    "__version__",
    "chain",
    "enqueue_via_outbox",
    "group",
    "lock",
    "publish",
    "task",
]


#: Names served from a module that needs the models, so imported at first use (PEP 562):
#: importing the package must not load the models before the app registry is ready.
_WORKFLOW_NAMES = frozenset({"Batch", "chain", "group"})


def __getattr__(name: str) -> Any:
    if name in _WORKFLOW_NAMES:
        from . import workflows

        return getattr(workflows, name)
    if name == "publish":
        from .outbox.publisher import publish

        return publish
    if name == "enqueue_via_outbox":
        from .outbox.bridge import enqueue_via_outbox

        return enqueue_via_outbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
