"""The groups of the services: ``LOCKS``, ``IDEMPOTENCY``, ``REPLAY`` and ``CACHE``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._values import boolean, fail, integer, merged_group, number, stored_text, string

#: The width of the lock table's key column (``Lock.key``): the prefix, then a job's lock key
#: of at least one character.
MAX_LOCK_PREFIX_LENGTH = 254

_LOCK_BACKENDS = {"database", "redis"}


@dataclasses.dataclass(frozen=True, slots=True)
class LockSettings:
    """``JOBGUARD["LOCKS"]``."""

    backend: str
    cache_alias: str
    prefix: str
    ttl: float
    contention_delay: float


@dataclasses.dataclass(frozen=True, slots=True)
class IdempotencySettings:
    """``JOBGUARD["IDEMPOTENCY"]``."""

    ttl: float
    prune_in_worker: bool
    #: Seconds the key's job, not run yet, may be due after the time a repeat enqueue asks for.
    schedule_tolerance: float


@dataclasses.dataclass(frozen=True, slots=True)
class ReplaySettings:
    """``JOBGUARD["REPLAY"]``."""

    allow_self_approval: bool
    rate_per_minute: int


@dataclasses.dataclass(frozen=True, slots=True)
class CacheSettings:
    """``JOBGUARD["CACHE"]``."""

    alias: str
    tombstone_ttl: float
    durable: bool = False
    queue: str = "jobguard.cache"
    max_attempts: int = 20
    durable_delay: float = 5.0
    refill_lease_ttl: float = 10.0
    refill_wait: float = 3.0


def parse_locks_group(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``LOCKS`` group, its backend checked."""
    locks = merged_group(raw, "LOCKS")
    if locks["BACKEND"] not in _LOCK_BACKENDS:
        raise fail(
            ("LOCKS", "BACKEND"), f"must be one of {sorted(_LOCK_BACKENDS)}, not {locks['BACKEND']!r}."
        )
    return locks


def parse_lock_settings(locks: Mapping[str, Any]) -> LockSettings:
    return LockSettings(
        backend=locks["BACKEND"],
        cache_alias=string(locks["CACHE_ALIAS"], ("LOCKS", "CACHE_ALIAS")),
        prefix=stored_text(
            string(locks["PREFIX"], ("LOCKS", "PREFIX")),
            ("LOCKS", "PREFIX"),
            MAX_LOCK_PREFIX_LENGTH,
            "the 255-character key column of the lock table, before each lock key",
        ),
        ttl=number(locks["TTL"], ("LOCKS", "TTL"), allow_zero=False),
        contention_delay=number(locks["CONTENTION_DELAY"], ("LOCKS", "CONTENTION_DELAY")),
    )


def parse_idempotency_settings(idem: Mapping[str, Any]) -> IdempotencySettings:
    return IdempotencySettings(
        ttl=number(idem["TTL"], ("IDEMPOTENCY", "TTL"), allow_zero=False),
        prune_in_worker=boolean(idem["PRUNE_IN_WORKER"], ("IDEMPOTENCY", "PRUNE_IN_WORKER")),
        schedule_tolerance=number(idem["SCHEDULE_TOLERANCE"], ("IDEMPOTENCY", "SCHEDULE_TOLERANCE")),
    )


def parse_replay_settings(replay: Mapping[str, Any]) -> ReplaySettings:
    return ReplaySettings(
        allow_self_approval=boolean(replay["ALLOW_SELF_APPROVAL"], ("REPLAY", "ALLOW_SELF_APPROVAL")),
        rate_per_minute=integer(replay["RATE_PER_MINUTE"], ("REPLAY", "RATE_PER_MINUTE"), minimum=1),
    )


def _queue_name(value: Any, path: tuple[str, ...]) -> str:
    name = string(value, path)
    if len(name) > 100:  # the width of Job.queue_name
        raise fail(path, f"must be at most 100 characters, not {len(name)}.")
    return name


def parse_cache_settings(cache: Mapping[str, Any]) -> CacheSettings:
    return CacheSettings(
        alias=string(cache["ALIAS"], ("CACHE", "ALIAS")),
        tombstone_ttl=number(cache["TOMBSTONE_TTL"], ("CACHE", "TOMBSTONE_TTL"), allow_zero=False),
        durable=boolean(cache["DURABLE"], ("CACHE", "DURABLE")),
        queue=_queue_name(cache["QUEUE"], ("CACHE", "QUEUE")),
        max_attempts=integer(cache["MAX_ATTEMPTS"], ("CACHE", "MAX_ATTEMPTS"), minimum=1),
        durable_delay=number(cache["DURABLE_DELAY"], ("CACHE", "DURABLE_DELAY")),
        refill_lease_ttl=number(cache["REFILL_LEASE_TTL"], ("CACHE", "REFILL_LEASE_TTL"), allow_zero=False),
        refill_wait=number(cache["REFILL_WAIT"], ("CACHE", "REFILL_WAIT")),
    )
