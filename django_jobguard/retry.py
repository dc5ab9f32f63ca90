"""Error classification and backoff with jitter (pure functions, no I/O).

A failed attempt is *transient* (retry on the task's schedule), *recoverable* (retry on the
longer recoverable schedule) or *permanent* (dead-letter at once). :func:`classify` decides,
:func:`delay_for` says how long the job waits before its next attempt.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING, Any

from .conf import RetryOverrides, RetryPolicy, get_settings
from .exceptions import (
    ErrorCategory,
    InvalidArgumentsError,
    LockNotAcquired,
    LockUnavailable,
    TaskError,
    UnknownTaskError,
)

if TYPE_CHECKING:
    from .task import Task

__all__ = [
    "PERMANENT",
    "RECOVERABLE",
    "TRANSIENT",
    "backoff",
    "classify",
    "declared_category",
    "delay_for",
    "policy_for",
    "requested_delay",
]

# The error categories, defined once as exceptions.ErrorCategory; here as the plain strings
# the classification returns, the outcomes carry and the store writes.
TRANSIENT = ErrorCategory.TRANSIENT.value
RECOVERABLE = ErrorCategory.RECOVERABLE.value
PERMANENT = ErrorCategory.PERMANENT.value

#: Classes outside the TaskError family we classify, checked after the task's mappings.
_BUILT_IN: tuple[tuple[type[BaseException], str], ...] = (
    # A payload that no longer fits its handler will not fit it on the next attempt either.
    (InvalidArgumentsError, PERMANENT),
    (UnknownTaskError, PERMANENT),
    # A lock a handler takes itself may be free on the next attempt.
    (LockNotAcquired, TRANSIENT),
    (LockUnavailable, TRANSIENT),
)
_CATEGORIES = (TRANSIENT, RECOVERABLE, PERMANENT)

_rng = random.SystemRandom()


def _task_mappings(task: Task[Any, Any] | None) -> list[tuple[tuple[type[BaseException], ...], str]]:
    if task is None:
        return []
    # In this order, so a class named in two options is fatal before it is retried.
    return [(task.fatal_on, PERMANENT), (task.recoverable_on, RECOVERABLE), (task.retry_on, TRANSIENT)]


def _own_category(cls: type[BaseException], *, built_in: bool = True) -> str | None:
    """The category a class declares: ``TaskError`` subclasses set ``category``; a few others we know."""
    if issubclass(cls, TaskError):
        declared = vars(cls).get("category")
        return declared if declared in _CATEGORIES else None
    if not built_in:
        return None
    for known, category in _BUILT_IN:
        if cls is known:
            return category
    return None


def classify(exc: BaseException, task: Task[Any, Any] | None) -> str:
    """The category of ``exc`` raised by ``task``: ``transient``, ``recoverable`` or ``permanent``.

    The most specific class wins: walking up the exception's MRO, the first class that is
    named in the task's ``fatal_on`` / ``recoverable_on`` / ``retry_on``, or declares a
    ``category`` (our ``TransientError`` / ``RecoverableError`` / ``PermanentError`` and
    your subclasses of ``TaskError``), decides. So ``retry_on=(Exception,)`` does not retry a
    ``PermanentError``, and ``fatal_on=(InvalidOrder,)`` beats ``retry_on=(ValueError,)`` for
    an ``InvalidOrder`` that subclasses ``ValueError``. Anything else follows
    ``JOBGUARD["UNCLASSIFIED_ERRORS"]``.
    """
    declared = _declared(exc, task, built_in=True)
    return declared if declared is not None else get_settings().unclassified_errors


def declared_category(exc: BaseException, task: Task[Any, Any] | None) -> str | None:
    """The category the task or the exception's own class declares for ``exc``; None if neither does.

    As :func:`classify` (the most specific class wins), but without the built-in lock errors
    and without the ``JOBGUARD["UNCLASSIFIED_ERRORS"]`` default: what the task's author said,
    in ``fatal_on`` / ``recoverable_on`` / ``retry_on`` or by raising a ``TaskError`` subclass.
    Circuit breakers count only such declared failures (see :mod:`django_jobguard.breakers`).
    """
    return _declared(exc, task, built_in=False)


def _declared(exc: BaseException, task: Task[Any, Any] | None, *, built_in: bool) -> str | None:
    mappings = _task_mappings(task)
    for cls in type(exc).__mro__:
        for types, category in mappings:
            if cls in types:
                return category
        own = _own_category(cls, built_in=built_in)
        if own is not None:
            return own
    # Classes registered as virtual subclasses (abc.ABC.register) are not in the MRO.
    for types, category in mappings:
        if types and isinstance(exc, types):
            return category
    return None


def _resolve(override: RetryPolicy | RetryOverrides | None, fallback: RetryPolicy) -> RetryPolicy:
    if override is None:
        return fallback
    if isinstance(override, RetryOverrides):
        return override.over(fallback)
    return override


def policy_for(task: Task[Any, Any] | None, queue_name: str, category: str) -> RetryPolicy:
    """The schedule for ``category``: the task's keys, else the queue's, else the global ones."""
    queue = get_settings().queue(queue_name)
    if category == RECOVERABLE:
        return _resolve(task.recoverable_retry if task else None, queue.recoverable_retry)
    return _resolve(task.retry if task else None, queue.retry)


def backoff(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): capped exponential + jitter."""
    exponent = max(attempt - 1, 0)
    # Cap the exponent so 2**n cannot overflow a float for absurd attempt counts.
    delay = min(policy.max, policy.base * 2.0 ** min(exponent, 62))
    return delay + _jitter(policy, rng)


def _jitter(policy: RetryPolicy, rng: random.Random | None) -> float:
    return (rng or _rng).uniform(0, policy.jitter) if policy.jitter else 0.0


def requested_delay(exc: BaseException) -> float | None:
    """A delay the handler asked for (``TransientError(retry_after=30)``), if any.

    Any exception with a finite, non-negative ``retry_after`` number counts, so a client
    library's rate-limit error can carry the server's ``Retry-After`` through unchanged.
    """
    value = getattr(exc, "retry_after", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def delay_for(
    exc: BaseException,
    task: Task[Any, Any] | None,
    queue_name: str,
    category: str,
    attempt: int,
    rng: random.Random | None = None,
) -> float:
    """Seconds before the next attempt after ``exc`` failed attempt ``attempt``.

    A delay the handler asked for wins over the backoff, and still gets the schedule's
    jitter on top: a thousand jobs told ``Retry-After: 30`` must not all return in the
    same second and trip the same rate limit again.
    """
    policy = policy_for(task, queue_name, category)
    requested = requested_delay(exc)
    if requested is not None:
        return requested + _jitter(policy, rng)
    return backoff(policy, attempt, rng)
