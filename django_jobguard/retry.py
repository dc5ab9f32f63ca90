"""Error classification and backoff with jitter (pure functions, no I/O)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from .conf import RetryPolicy, get_settings
from .exceptions import (
    InvalidArgumentsError,
    PermanentError,
    RecoverableError,
    TaskError,
    TransientError,
    UnknownTaskError,
)

if TYPE_CHECKING:
    from .task import Task

__all__ = ["PERMANENT", "RECOVERABLE", "TRANSIENT", "backoff", "classify", "policy_for"]

TRANSIENT = "transient"
RECOVERABLE = "recoverable"
PERMANENT = "permanent"

_rng = random.SystemRandom()


def classify(exc: BaseException, task: Task[Any, Any] | None) -> str:
    """The category of ``exc`` raised by ``task``.

    Order: the task's ``fatal_on`` / ``recoverable_on`` / ``retry_on`` (most specific
    wins by order of these checks), then our own error classes, then payload errors
    (permanent), then ``JOBGUARD["UNCLASSIFIED_ERRORS"]``.
    """
    if task is not None:
        if task.fatal_on and isinstance(exc, task.fatal_on):
            return PERMANENT
        if task.recoverable_on and isinstance(exc, task.recoverable_on):
            return RECOVERABLE
        if task.retry_on and isinstance(exc, task.retry_on):
            return TRANSIENT
    if isinstance(exc, PermanentError | InvalidArgumentsError | UnknownTaskError):
        return PERMANENT
    if isinstance(exc, RecoverableError):
        return RECOVERABLE
    if isinstance(exc, TransientError | TaskError):
        return TRANSIENT
    return get_settings().unclassified_errors


def policy_for(task: Task[Any, Any] | None, queue_name: str, category: str) -> RetryPolicy:
    """The schedule for ``category``: the task's, else the queue's, else the global one."""
    queue = get_settings().queue(queue_name)
    if category == RECOVERABLE:
        return (task.recoverable_retry if task else None) or queue.recoverable_retry
    return (task.retry if task else None) or queue.retry


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): capped exponential + jitter."""
    exponent = max(attempt - 1, 0)
    # Cap the exponent so 2**n cannot overflow a float for absurd attempt counts.
    delay = min(policy.max, policy.base * 2.0 ** min(exponent, 62))
    jitter = (rng or _rng).uniform(0, policy.jitter) if policy.jitter else 0.0
    return delay + jitter


def requested_delay(exc: BaseException) -> float | None:
    """A delay the handler asked for (``TransientError(retry_after=30)``), if any."""
    value = getattr(exc, "retry_after", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None
