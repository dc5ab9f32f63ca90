"""Queues and retries: ``QUEUES``, ``RETRY``, ``RECOVERABLE_RETRY``, ``UNCLASSIFIED_ERRORS``.

Resolution order for per-job options: the ``@task(...)`` option, then the queue's entry in
``JOBGUARD["QUEUES"]``, then the global default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..exceptions import PermanentError, TransientError
from ._values import (
    fail,
    integer,
    mapping,
    number,
    optional_integer,
    queue_setting,
    reject_unknown,
    stored_text,
)
from .defaults import DEFAULTS
from .retention import RETENTION_STATUSES, RetentionPolicy, parse_queue_retention

#: The width of the handler version columns (``Job.handler_version``, ``DeadLetter.handler_version``).
MAX_HANDLER_VERSION_LENGTH = 64

#: The options a queue in JOBGUARD["QUEUES"] may set (QueueConfig's fields but its name).
QUEUE_OPTIONS = {
    "visibility_timeout",
    "max_attempts",
    "retry",
    "recoverable_retry",
    "concurrency",
    "retention",
}

#: The keys of the queue options that are dicts; a key left out comes from the global setting.
QUEUE_OPTION_KEYS = {
    "retry": ("base", "max", "jitter"),
    "recoverable_retry": ("base", "max", "jitter"),
    "retention": RETENTION_STATUSES,
}

#: Queue options with no global setting behind them: what each does, for the settings reference.
QUEUE_ONLY_OPTIONS = {
    "concurrency": (
        "Jobs of this queue running at once across every worker (an integer of at least 1), "
        "enforced when jobs are claimed: a job over it waits queued, with no attempt charged. "
        "Unset: no limit, and the queue's claims stay the plain claim."
    ),
}

_RETRY_KEYS = {"base", "max", "jitter"}
#: What an exception nobody classified is taken for: one of the error categories.
_CLASSIFICATIONS = {TransientError.category, PermanentError.category}


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: ``min(max, base * 2**(attempt-1)) + uniform(0, jitter)``."""

    base: float
    max: float
    jitter: float

    @classmethod
    def parse(cls, value: Any, path: tuple[str, ...], fallback: RetryPolicy | None = None) -> RetryPolicy:
        """Build a policy from a dict, filling missing keys from ``fallback``."""
        if isinstance(value, RetryPolicy):
            return value
        data = mapping(value, path)
        reject_unknown(data, _RETRY_KEYS, path)
        merged = {**(dataclasses.asdict(fallback) if fallback else {}), **data}
        missing = _RETRY_KEYS - set(merged)
        if missing:
            raise fail((*path, sorted(missing)[0]), "is required.")
        policy = cls(
            base=number(merged["base"], (*path, "base")),
            max=number(merged["max"], (*path, "max")),
            jitter=number(merged["jitter"], (*path, "jitter")),
        )
        if policy.max < policy.base:
            raise fail((*path, "max"), f"({policy.max}) must not be below base ({policy.base}).")
        return policy


@dataclasses.dataclass(frozen=True, slots=True)
class RetryOverrides:
    """Some keys of a :class:`RetryPolicy` (``@task(retry={"base": 1})``).

    Resolution order: the task's keys, then its queue's policy, then the global one. The
    merge happens when a retry is scheduled, because the queue and the global settings
    cannot be read when ``@task`` runs at import time.
    """

    base: float | None = None
    max: float | None = None
    jitter: float | None = None

    @classmethod
    def parse(cls, value: Any, path: tuple[str, ...]) -> RetryOverrides:
        """Validate the keys given; the missing ones come from the queue when used."""
        data = mapping(value, path)
        reject_unknown(data, _RETRY_KEYS, path)
        overrides = cls(**{key: number(data[key], (*path, key)) for key in sorted(data)})
        if overrides.base is not None and overrides.max is not None and overrides.max < overrides.base:
            raise fail((*path, "max"), f"({overrides.max}) must not be below base ({overrides.base}).")
        return overrides

    def over(self, policy: RetryPolicy) -> RetryPolicy:
        """This task's keys over ``policy``; a ``max`` below the merged ``base`` is raised to it."""
        base = policy.base if self.base is None else self.base
        cap = policy.max if self.max is None else self.max
        jitter = policy.jitter if self.jitter is None else self.jitter
        return RetryPolicy(base=base, max=max(cap, base), jitter=jitter)


@dataclasses.dataclass(frozen=True, slots=True)
class QueueConfig:
    """Options of one queue, already merged with the global defaults."""

    name: str
    visibility_timeout: float
    max_attempts: int
    retry: RetryPolicy
    recoverable_retry: RetryPolicy
    #: Jobs of the queue running at once across every worker; None: no limit.
    concurrency: int | None = None
    #: How long the queue's finished jobs are kept, merged over ``RETENTION``; None: as ``RETENTION``.
    retention: RetentionPolicy | None = None


def parse_retry_policies(merged: Mapping[str, Any]) -> tuple[RetryPolicy, RetryPolicy]:
    """``RETRY`` and ``RECOVERABLE_RETRY``, each over its own default."""
    retry = RetryPolicy.parse(merged["RETRY"], ("RETRY",), RetryPolicy.parse(DEFAULTS["RETRY"], ("RETRY",)))
    recoverable = RetryPolicy.parse(
        merged["RECOVERABLE_RETRY"],
        ("RECOVERABLE_RETRY",),
        RetryPolicy.parse(DEFAULTS["RECOVERABLE_RETRY"], ("RECOVERABLE_RETRY",)),
    )
    return retry, recoverable


def parse_queues(
    value: Any,
    visibility: float,
    attempts: int,
    retry: RetryPolicy,
    recoverable: RetryPolicy,
    retention: RetentionPolicy | None = None,
) -> dict[str, QueueConfig]:
    """``JOBGUARD["QUEUES"]``: each queue's options over the global ones."""
    queues: dict[str, QueueConfig] = {}
    for name, options in mapping(value, ("QUEUES",)).items():
        path = ("QUEUES", str(name))
        queue_setting(name, path)
        options = mapping(options, path)
        reject_unknown(options, QUEUE_OPTIONS, path)
        queues[name] = QueueConfig(
            name=name,
            visibility_timeout=number(
                options.get("visibility_timeout", visibility), (*path, "visibility_timeout"), minimum=1
            ),
            max_attempts=integer(options.get("max_attempts", attempts), (*path, "max_attempts"), minimum=1),
            retry=RetryPolicy.parse(options.get("retry", {}), (*path, "retry"), retry),
            recoverable_retry=RetryPolicy.parse(
                options.get("recoverable_retry", {}), (*path, "recoverable_retry"), recoverable
            ),
            concurrency=optional_integer(options.get("concurrency"), (*path, "concurrency")),
            retention=(
                parse_queue_retention(
                    options["retention"], (*path, "retention"), retention or RetentionPolicy()
                )
                if "retention" in options
                else None
            ),
        )
    return queues


def parse_unclassified_errors(merged: Mapping[str, Any]) -> str:
    """``UNCLASSIFIED_ERRORS``, after which ``HANDLER_VERSION`` is checked to be a string."""
    unclassified: str = merged["UNCLASSIFIED_ERRORS"]
    if unclassified not in _CLASSIFICATIONS:
        raise fail(
            ("UNCLASSIFIED_ERRORS",), f"must be one of {sorted(_CLASSIFICATIONS)}, not {unclassified!r}."
        )
    if not isinstance(merged["HANDLER_VERSION"], str):
        raise fail(("HANDLER_VERSION",), "must be a string.")
    stored_text(
        merged["HANDLER_VERSION"],
        ("HANDLER_VERSION",),
        MAX_HANDLER_VERSION_LENGTH,
        f"the {MAX_HANDLER_VERSION_LENGTH}-character handler version column of each job and dead letter",
    )
    return unclassified
