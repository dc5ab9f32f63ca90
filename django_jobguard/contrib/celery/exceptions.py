"""``celery.exceptions``' names, so ``from celery.exceptions import ...`` needs only its module changed.

``SoftTimeLimitExceeded`` is defined for the ``except`` clauses that name it, but nothing
raises it: jobguard has no soft time limit (``jobguard.celery.W001`` names the option).
``TimeoutError`` is Python's, which ``AsyncResult.get(timeout=...)`` raises.
"""

import builtins

from ...exceptions import JobguardError
from .app import MaxRetriesExceededError, Retry
from .result import TaskRevokedError

__all__ = ["MaxRetriesExceededError", "Retry", "SoftTimeLimitExceeded", "TaskRevokedError", "TimeoutError"]

#: Celery's name for what ``get(timeout=...)`` raises: Python's ``TimeoutError``.
TimeoutError = builtins.TimeoutError


class SoftTimeLimitExceeded(JobguardError):  # noqa: N818 - Celery's name
    """Never raised here: jobguard has no soft time limit (see ``jobguard.celery.W001``)."""
