"""Run a Celery project's tasks on jobguard with one import changed.

``from django_jobguard.contrib.celery import shared_task`` in place of ``from celery import
shared_task``: the decorator, ``.delay()``, ``.apply_async()``, ``self.retry()``,
``AsyncResult`` and the canvas (``chain``, ``group``, ``chord``, ``signature``) work over
jobguard's tasks, jobs and workflows, with no broker. Celery is not needed (nor imported).
Options jobguard cannot honour are named by system checks (``jobguard.celery.*``) at
startup. See docs/how-to/move-from-celery.md and docs/reference/celery.md.

Importing this package loads no model, so a settings module may import ``crontab`` and
``beat_schedule`` (from :mod:`.beat`); the names that read jobs load on first use.
"""

from typing import TYPE_CHECKING, Any

from . import checks as checks
from .app import BoundTask, Celery, CeleryTask, MaxRetriesExceededError, Request, Retry, shared_task
from .beat import beat_schedule, crontab
from .signals import task_failure, task_postrun, task_prerun, task_retry, task_success

if TYPE_CHECKING:
    from .canvas import ChordResult, Signature, chain, chord, group, signature
    from .result import (
        FAILURE,
        PENDING,
        RETRY,
        REVOKED,
        STARTED,
        SUCCESS,
        AsyncResult,
        EagerResult,
        GroupResult,
        TaskFailed,
        TaskRevokedError,
    )

__all__ = [
    "FAILURE",
    "PENDING",
    "RETRY",
    "REVOKED",
    "STARTED",
    "SUCCESS",
    "AsyncResult",
    "BoundTask",
    "Celery",
    "CeleryTask",
    "ChordResult",
    "EagerResult",
    "GroupResult",
    "MaxRetriesExceededError",
    "Request",
    "Retry",
    "Signature",
    "TaskFailed",
    "TaskRevokedError",
    "beat_schedule",
    "chain",
    "chord",
    "crontab",
    "group",
    "shared_task",
    "signature",
    "task_failure",
    "task_postrun",
    "task_prerun",
    "task_retry",
    "task_success",
]

_CANVAS = frozenset({"ChordResult", "Signature", "chain", "chord", "group", "signature"})
_RESULT = frozenset(
    {
        "FAILURE",
        "PENDING",
        "RETRY",
        "REVOKED",
        "STARTED",
        "SUCCESS",
        "AsyncResult",
        "EagerResult",
        "GroupResult",
        "TaskFailed",
        "TaskRevokedError",
    }
)


def __getattr__(name: str) -> Any:
    # PEP 562: these read job rows, so the models load at first use, not at import.
    if name in _CANVAS:
        from . import canvas

        return getattr(canvas, name)
    if name in _RESULT:
        from . import result

        return getattr(result, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
