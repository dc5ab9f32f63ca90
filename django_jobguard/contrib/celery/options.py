"""Celery's task options, read into jobguard's ``@task`` options (pure: no database, no settings).

Each Celery option is honoured (mapped onto a jobguard option), accepted with a documented
difference, or not honoured: those are kept on the task and named by the system check
``jobguard.celery.W001`` at startup, with what to do instead. Nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from ...exceptions import InvalidTaskError
from ...flow import Rate
from .conf import celery_setting

__all__ = [
    "CELERY_DEFAULT_MAX_RETRIES",
    "CELERY_DEFAULT_RETRY_DELAY",
    "MAX_ATTEMPTS_FOR_UNLIMITED",
    "Mapped",
    "celery_priority",
    "map_options",
    "max_attempts_for",
    "rate_for",
]

#: Celery's defaults for ``max_retries`` and ``default_retry_delay`` (seconds).
CELERY_DEFAULT_MAX_RETRIES = 3
CELERY_DEFAULT_RETRY_DELAY = 180.0
#: Celery's ``retry_backoff_max`` default (seconds).
CELERY_DEFAULT_BACKOFF_MAX = 600.0
#: ``max_retries=None`` (retry for ever, in Celery): jobguard keeps a bound on every job.
MAX_ATTEMPTS_FOR_UNLIMITED = 1_000_000

#: Options that change nothing on jobguard, with why (the reference lists them).
NO_EFFECT = {
    "serializer": "arguments are always JSON (see pass-arguments.md)",
    "typing": "arguments are always checked against the signature at the call",
    "throws": "expected errors are dead-lettered or retried by their class, as any other",
    "track_started": "a running job's state is always STARTED",
    "store_errors_even_if_ignored": "errors are always kept, on the job and its dead letter",
    "trail": "no result tree is kept; a chain's steps are linked by AsyncResult.parent",
    "shared": "every task is shared: there is no app to bind it to",
    "filter": "no task filter is applied",
}

#: What ``acks_late=False`` (acknowledge before the run: at most once) gets instead.
ACKS_EARLY = (
    "jobguard acknowledges a job after its run, always (acks_late=True): a job whose worker dies "
    "runs again, never zero times; make it idempotent (idempotency_key=)"
)

#: Options jobguard cannot honour, with what to do instead (system check jobguard.celery.W001).
NOT_HONOURED = {
    "soft_time_limit": (
        "jobguard has no soft limit that raises inside the handler; use time_limit (a hard limit, "
        "jobguard's timeout=) and check the handler's progress yourself"
    ),
    "reject_on_worker_lost": (
        "a job whose worker dies is always run again once its lease expires (at least once); "
        "make the task idempotent (idempotency_key=)"
    ),
    "expires": (
        "jobguard runs a queued job whenever it is claimed; cancel late jobs yourself "
        "(AsyncResult.revoke()) or check the age in the handler"
    ),
    "base": (
        "a custom Task class is not used, so its hooks (on_success, on_failure, on_retry, "
        "after_return) do not run; connect the task_success, task_failure, task_retry and "
        "task_postrun signals of django_jobguard.contrib.celery.signals instead"
    ),
    "resultrepr_maxsize": "the admin shows results whole",
    "request_stack": "no request stack is kept",
}


@dataclasses.dataclass(frozen=True)
class Mapped:
    """A Celery task's options as jobguard's ``task()`` keywords, and what the shim keeps itself."""

    #: Keywords for :func:`django_jobguard.task`.
    task_options: dict[str, Any]
    #: Celery's ``max_retries`` as the task declared it (None: for ever).
    max_retries: int | None
    default_retry_delay: float
    ignore_result: bool
    #: (option, value, what to do instead) for every option jobguard does not honour.
    unhonoured: tuple[tuple[str, Any, str], ...]
    #: The Celery priority as declared (0-9 or 0-255, the broker decides the direction).
    priority: int | None = None


def max_attempts_for(max_retries: int | None) -> int:
    """Celery's ``max_retries`` (retries after the first run) as jobguard's ``max_attempts``."""
    if max_retries is None:
        return MAX_ATTEMPTS_FOR_UNLIMITED
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise InvalidTaskError(
            f"max_retries must be a whole number of at least 0 or None, not {max_retries!r}."
        )
    return max_retries + 1


def rate_for(value: Any) -> Rate | None:
    """Celery's ``rate_limit`` ("10/m", "100/s", "5/h", or a number per second) as a :class:`Rate`."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidTaskError(f"rate_limit must be such as '10/m' or a number per second, not {value!r}.")
    if isinstance(value, int | float):
        if value <= 0:
            return None  # Celery reads 0 as "no limit"
        if float(value).is_integer():
            return Rate(f"{int(value)}/s")
        per_hour = value * 3600
        if float(per_hour).is_integer():
            return Rate(f"{int(per_hour)}/h")
        raise InvalidTaskError(
            f"rate_limit={value!r} per second cannot be written as a whole number per second, minute "
            "or hour; give a string such as '30/m'."
        )
    if isinstance(value, str):
        text = value.strip()
        count, _, unit = text.partition("/")
        if not unit:
            return rate_for(float(count)) if count.replace(".", "", 1).isdigit() else _bad_rate(value)
        if unit not in ("s", "m", "h"):
            return _bad_rate(value)
        try:
            number = float(count)
        except ValueError:
            return _bad_rate(value)
        if number <= 0:
            return None
        if not number.is_integer():
            return _bad_rate(value)
        return Rate(f"{int(number)}/{unit}")
    return _bad_rate(value)


def _bad_rate(value: Any) -> Rate:
    raise InvalidTaskError(
        f"rate_limit must be such as '10/s', '10/m' or '10/h' (a whole count), or a number per second, "
        f"not {value!r}."
    )


def celery_priority(priority: int, direction: str) -> int:
    """A Celery priority as jobguard's (-100..100, higher first).

    ``direction`` "lowest-first" (Redis and SQS: 0 runs first, 9 last): 0 → 0, 9 → -90, so a
    task without a priority, which Redis puts first, stays ahead. "highest-first" (RabbitMQ:
    0 is the lowest, up to ``x-max-priority``): p → 10 * p, capped at 100.
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise InvalidTaskError(f"priority must be a whole number of at least 0 (Celery's), not {priority!r}.")
    if direction == "lowest-first":
        return -min(priority, 10) * 10
    return min(priority * 10, 100)


def _types(value: Any, option: str) -> tuple[type[BaseException], ...]:
    if value is None:
        return ()
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, Iterable):
        raise InvalidTaskError(f"{option} must be a tuple of exception classes, not {value!r}.")
    found = tuple(value)
    for item in found:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidTaskError(f"{option} must hold exception classes, not {item!r}.")
    return found


def _seconds(value: Any, option: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidTaskError(f"{option} must be a number of seconds, not {value!r}.")
    return float(value)


def map_options(options: Mapping[str, Any], *, direction: str) -> Mapped:
    """Read a Celery task's options into jobguard's; raise :class:`InvalidTaskError` on a bad one.

    An option neither mapped, accepted nor known is refused here, at import, naming it: an
    option whose meaning is unknown is never dropped.
    """
    options = dict(options)
    out: dict[str, Any] = {}
    unhonoured: list[tuple[str, Any, str]] = []

    if "name" in options:
        out["name"] = options.pop("name")
    if (queue := options.pop("queue", None)) is not None:
        out["queue_name"] = queue
    priority = options.pop("priority", None)
    if priority is not None:
        out["priority"] = celery_priority(priority, direction)

    max_retries = options.pop("max_retries", CELERY_DEFAULT_MAX_RETRIES)
    retry_kwargs = dict(options.pop("retry_kwargs", None) or {})
    if "max_retries" in retry_kwargs:
        max_retries = retry_kwargs.pop("max_retries")
    out["max_attempts"] = max_attempts_for(max_retries)
    default_delay = _seconds(options.pop("default_retry_delay", None), "default_retry_delay")
    default_delay = CELERY_DEFAULT_RETRY_DELAY if default_delay is None else default_delay

    autoretry = _types(options.pop("autoretry_for", ()), "autoretry_for")
    dont = _types(options.pop("dont_autoretry_for", ()), "dont_autoretry_for")
    backoff = options.pop("retry_backoff", False)
    backoff_max = _seconds(options.pop("retry_backoff_max", None), "retry_backoff_max")
    jitter = options.pop("retry_jitter", True)
    countdown = _seconds(retry_kwargs.pop("countdown", None), "retry_kwargs['countdown']")
    if retry_kwargs:
        unknown = ", ".join(sorted(map(str, retry_kwargs)))
        raise InvalidTaskError(f"retry_kwargs takes max_retries and countdown, not {unknown}.")
    # Celery fails a task at once on an exception it was not told to retry (and on one in
    # dont_autoretry_for); self.retry() raises Retry, which is transient by its own class.
    out["retry_on"] = autoretry
    # fatal_on is looked at before retry_on for the same class, so autoretry_for=(Exception,)
    # must not also make Exception fatal.
    retries_everything = any(issubclass(Exception, cls) for cls in autoretry)
    out["fatal_on"] = dont if retries_everything else (*dont, Exception)
    if backoff:
        factor = 1.0 if backoff is True else _seconds(backoff, "retry_backoff")
        cap = CELERY_DEFAULT_BACKOFF_MAX if backoff_max is None else backoff_max
        # Celery draws a full jitter below the delay; jobguard adds up to `jitter` on top.
        out["retry"] = {"base": factor, "max": max(cap, factor or 0.0), "jitter": factor if jitter else 0.0}
    else:
        fixed = default_delay if countdown is None else countdown
        out["retry"] = {"base": fixed, "max": fixed, "jitter": 0.0}

    if (rate := rate_for(options.pop("rate_limit", None))) is not None:
        out["rate"] = rate
    # CELERY_TASK_TIME_LIMIT is Celery's time_limit for every task that gives none.
    time_limit = _seconds(options.pop("time_limit", None), "time_limit")
    if time_limit is None:
        time_limit = _seconds(celery_setting("TASK_TIME_LIMIT", None), "CELERY_TASK_TIME_LIMIT")
    if time_limit is not None:
        out["timeout"] = time_limit
    ignore_result = bool(options.pop("ignore_result", False))
    if ignore_result:
        out["result_retention"] = 0  # nobody waits on it: AsyncResult.get() says so at once
    acks_late = options.pop("acks_late", None)
    if acks_late is False:
        unhonoured.append(("acks_late", False, ACKS_EARLY))
    for option, advice in NOT_HONOURED.items():
        if option in options:
            value = options.pop(option)
            if value not in (None, False):
                unhonoured.append((option, value, advice))
    for option in NO_EFFECT:
        options.pop(option, None)
    # jobguard's own options pass through, so a task can opt in to its guarantees while it
    # keeps the Celery decorator (idempotency_key=, lock=, concurrency=, ...).
    for option in ("idempotency_key", "idempotent", "lock", "lock_ttl", "concurrency", "limit", "atomic"):
        if option in options:
            out[option] = options.pop(option)
    if options:
        raise InvalidTaskError(
            f"Celery option {sorted(options)[0]!r} is not known to django_jobguard.contrib.celery; "
            "see docs/reference/celery.md for the options it reads."
        )
    return Mapped(
        task_options=out,
        max_retries=max_retries,
        default_retry_delay=default_delay,
        ignore_result=ignore_result,
        unhonoured=tuple(unhonoured),
        priority=priority,
    )
