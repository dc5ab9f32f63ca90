"""``OUTBOX``: the destinations :func:`django_jobguard.outbox.publish` may name, and the relay.

A destination's entry holds the relay's options for it (upper case: ``BACKEND``,
``ON_FAILURE``, ``MAX_ATTEMPTS``, ``RETRY``, ``LIMIT``) and its backend's own options (every other key,
handed to the backend's ``from_options``, which the system check calls at startup). The
backend itself is resolved above this package (:mod:`django_jobguard.outbox.destinations`):
settings only check that it is named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from ._values import boolean, fail, integer, mapping, number, stored_text, string
from .queue_settings import RetryPolicy

__all__ = [
    "DESTINATION_OPTIONS",
    "MAX_DESTINATION_NAME_LENGTH",
    "ON_FAILURE_CHOICES",
    "DestinationConfig",
    "OutboxSettings",
    "parse_outbox_settings",
]

#: The width of the outbox tables' destination columns.
MAX_DESTINATION_NAME_LENGTH = 100
#: What a destination does with a message that cannot be delivered (see the how-to).
ON_FAILURE_CHOICES = ("hold", "skip")
#: The relay's own options of a destination; every other key is the backend's.
DESTINATION_OPTIONS = ("BACKEND", "ON_FAILURE", "MAX_ATTEMPTS", "RETRY", "LIMIT")
#: Attempts of one message before it is dead, when a destination does not say.
DEFAULT_DESTINATION_MAX_ATTEMPTS = 20


@dataclasses.dataclass(frozen=True, slots=True)
class DestinationConfig:
    """One entry of ``OUTBOX["DESTINATIONS"]``, parsed."""

    name: str
    #: A name of ``django_jobguard.outbox.destinations.BACKENDS`` or a dotted path to a class.
    backend: str
    #: "hold": a dead message holds its key's later messages until replayed or skipped;
    #: "skip": it is set aside and the key moves on.
    on_failure: str
    max_attempts: int
    retry: RetryPolicy
    #: The entry of ``JOBGUARD["LIMITS"]`` whose concurrency, rate, breaker and retry budget
    #: apply to this destination's sends, as ``@task(limit=...)`` applies them to a task's jobs.
    limit: str | None = None
    #: The backend's own options (the entry's other keys), as given.
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxSettings:
    """``JOBGUARD["OUTBOX"]``, parsed."""

    destinations: Mapping[str, DestinationConfig] = dataclasses.field(default_factory=dict)
    #: The alias of the outbox tables (where publish() writes and the relay reads) when it is
    #: not the jobs' ``JOBGUARD["DATABASE_ALIAS"]``: the application's database when the jobs
    #: have their own. Read it resolved, as ``Settings.outbox_alias``.
    database_alias: str | None = None
    relay: bool = True
    relay_batch_size: int = 100
    relay_poll_interval: float = 0.5
    relay_lease: float = 60.0
    relay_concurrency: int = 4

    def destination(self, name: str) -> DestinationConfig | None:
        return self.destinations.get(name)


def _limit(value: Any, path: tuple[str, ...], limits: Collection[str]) -> str | None:
    """A destination's ``LIMIT``: the name of an entry of ``JOBGUARD["LIMITS"]``, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise fail(path, f"must name an entry of JOBGUARD['LIMITS'] (a string), not {value!r}.")
    if value not in limits:
        declared = ", ".join(repr(name) for name in sorted(limits)) or "none"
        raise fail(
            path,
            f"names {value!r}, which JOBGUARD['LIMITS'] does not declare (declared: {declared}). "
            "Declare it there, e.g. {'concurrency': 4, 'rate': '20/s', 'breaker': True}.",
        )
    return value


def _destination(name: Any, value: Any, retry: RetryPolicy, limits: Collection[str]) -> DestinationConfig:
    path = ("OUTBOX", "DESTINATIONS", str(name))
    stored_text(
        string(name, path),
        path,
        MAX_DESTINATION_NAME_LENGTH,
        f"the {MAX_DESTINATION_NAME_LENGTH}-character destination column of each outbox message",
    )
    entry = mapping(value, path)
    backend = string(entry.get("BACKEND"), (*path, "BACKEND"))
    on_failure = entry.get("ON_FAILURE", "hold")
    if on_failure not in ON_FAILURE_CHOICES:
        raise fail((*path, "ON_FAILURE"), f'must be "hold" or "skip", not {on_failure!r}.')
    return DestinationConfig(
        name=name,
        backend=backend,
        on_failure=on_failure,
        max_attempts=integer(
            entry.get("MAX_ATTEMPTS", DEFAULT_DESTINATION_MAX_ATTEMPTS), (*path, "MAX_ATTEMPTS"), minimum=1
        ),
        retry=RetryPolicy.parse(entry.get("RETRY", {}), (*path, "RETRY"), retry),
        limit=_limit(entry.get("LIMIT"), (*path, "LIMIT"), limits),
        options={key: option for key, option in entry.items() if key not in DESTINATION_OPTIONS},
    )


def _alias(value: Any, path: tuple[str, ...]) -> str | None:
    """``OUTBOX["DATABASE_ALIAS"]``: None (the jobs' alias) or a non-empty string."""
    return None if value is None else string(value, path)


def parse_outbox_settings(
    group: Mapping[str, Any], retry: RetryPolicy, limits: Collection[str] = ()
) -> OutboxSettings:
    """``JOBGUARD["OUTBOX"]`` (merged over its defaults); ``retry`` is the global ``RETRY``,
    ``limits`` the names ``JOBGUARD["LIMITS"]`` declares (a destination's ``LIMIT`` names one)."""
    path = ("OUTBOX",)
    destinations = {
        name: _destination(name, entry, retry, limits)
        for name, entry in mapping(group["DESTINATIONS"], (*path, "DESTINATIONS")).items()
    }
    return OutboxSettings(
        destinations=destinations,
        database_alias=_alias(group["DATABASE_ALIAS"], (*path, "DATABASE_ALIAS")),
        relay=boolean(group["RELAY"], (*path, "RELAY")),
        relay_batch_size=integer(group["RELAY_BATCH_SIZE"], (*path, "RELAY_BATCH_SIZE"), minimum=1),
        relay_poll_interval=number(
            group["RELAY_POLL_INTERVAL"], (*path, "RELAY_POLL_INTERVAL"), allow_zero=False
        ),
        relay_lease=number(group["RELAY_LEASE"], (*path, "RELAY_LEASE"), minimum=1),
        relay_concurrency=integer(group["RELAY_CONCURRENCY"], (*path, "RELAY_CONCURRENCY"), minimum=1),
    )
