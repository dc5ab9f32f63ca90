"""Flow-control specs: :class:`Limit`, :class:`Rate`, the rate strings they parse, and the
shared limits of the settings with their breakers and retry budgets.

What ``@task(concurrency=..., rate=..., limit=...)``, ``JOBGUARD["QUEUES"][name]["concurrency"]``
and ``JOBGUARD["LIMITS"]`` declare. Every spec is checked when it is built (at import of the
tasks module, or when the settings are read: :mod:`django_jobguard.conf` parses
``JOBGUARD["LIMITS"]`` into :class:`NamedLimit`), so a bad one never reaches a worker. The
limits themselves are enforced by the claim (:mod:`.admission`, in the store's SQL).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import string
from typing import Any

from ..exceptions import InvalidTaskError

__all__ = [
    "MAX_STORED_RATE_KEY_LENGTH",
    "BreakerSpec",
    "Limit",
    "NamedLimit",
    "Rate",
    "RetryBudgetSpec",
    "keyed_rate_room",
    "over_long_rate_keys",
    "parse_rate",
    "read_flow_keys",
    "stored_flow_keys",
    "template_fields",
]

#: Seconds of each unit a rate string may name.
RATE_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*$")
#: The longest a rendered limit key may be (it is stored with the job, beside the task name).
MAX_LIMIT_KEY_LENGTH = 200
#: The width of the rate table's key column (``FlowRate.key``), where the claim stores each
#: rate key it admits a job under: ``rate:task:<task>``, ``rate:limit:<name>``, ``r:<task>|<key>``.
MAX_STORED_RATE_KEY_LENGTH = 255


def keyed_rate_room(task_name: str) -> int:
    """The longest key a keyed rate of ``task_name`` may render: its stored ``r:<task>|<key>`` fits."""
    return min(MAX_LIMIT_KEY_LENGTH, MAX_STORED_RATE_KEY_LENGTH - len(f"r:{task_name}|"))


def over_long_rate_keys(keys: list[str]) -> list[str]:
    """The rate keys of a job's stored ``flow_keys`` that the rate table cannot hold."""
    return [key for key in keys if key.startswith("r:") and len(key) > MAX_STORED_RATE_KEY_LENGTH]


def stored_flow_keys(value: Any) -> list[str] | None:
    """A job's stored ``flow_keys`` (decoded) as its keys; None when they are not a list of strings.

    Enqueue stores a JSON array of strings; a row written by hand, through the ORM or by an
    older release may hold any JSON value. The limited claim counts such a job under none of
    its stored keys and leases it, and the worker dead-letters it, rather than fail every
    limited claim of its queue.
    """
    if isinstance(value, list) and all(isinstance(key, str) for key in value):
        return value
    return None


def read_flow_keys(value: Any) -> list[str] | None:
    """A row's ``flow_keys`` as the database returns them (JSON text, or decoded) as its keys;
    None when they are not a JSON array of strings (see :func:`stored_flow_keys`)."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return stored_flow_keys(value)


def parse_rate(value: Any) -> tuple[int, float]:
    """``"100/m"`` -> ``(100, 60.0)``: jobs, and the seconds they are spread over.

    Also ``"10/s"``, ``"5/h"``, ``"1000/d"`` and a counted period, ``"30/10s"``. Raises
    :class:`ValueError` naming what is wrong.
    """
    if not isinstance(value, str):
        raise ValueError(f"a rate is a string such as '100/m' or '10/s', not {value!r}")
    match = _RATE.match(value.lower())
    if match is None:
        raise ValueError(
            f"cannot read the rate {value!r}: write it as '<jobs>/<unit>', e.g. '100/m' or '10/s'"
        )
    count, multiple, unit = int(match[1]), match[2], match[3]
    if unit not in RATE_UNITS:
        raise ValueError(f"the rate {value!r} has an unknown unit {unit!r}; units: s, m, h, d")
    period = RATE_UNITS[unit] * (int(multiple) if multiple else 1)
    if count <= 0 or period <= 0:
        raise ValueError(f"the rate {value!r} must allow at least one job in a period longer than 0")
    return count, period


def template_fields(template: str) -> list[str]:
    """The argument names a key template formats (``"account:{account_id}"`` -> ``["account_id"]``)."""
    fields = []
    for _literal, field, _spec, _conv in string.Formatter().parse(template):
        if field is not None:
            fields.append(field.split(".")[0].split("[")[0])
    return fields


def _key(key: Any, what: str) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str) or not key:
        raise InvalidTaskError(
            f"{what} key must be a non-empty template such as 'account:{{account_id}}', not {key!r}."
        )
    try:
        fields = template_fields(key)
    except ValueError as exc:
        raise InvalidTaskError(f"{what} key {key!r} is not a valid template: {exc}.") from None
    if not fields:
        raise InvalidTaskError(
            f"{what} key {key!r} names no argument, so every job would share one key; "
            "leave key out for one limit over all jobs."
        )
    return key


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidTaskError(f"{what} must be a whole number of at least 1, not {value!r}.")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """At most ``n`` jobs running at once across every worker; with ``key``, ``n`` per key.

    ``key`` is a template over the task's arguments, in the language of ``lock=``
    (``"account:{account_id}"``).
    """

    n: int
    key: str | None = None

    def __post_init__(self) -> None:
        _positive_int(self.n, "Limit(n)")
        _key(self.key, "Limit")


@dataclasses.dataclass(frozen=True, slots=True)
class Rate:
    """At most ``rate`` job starts across every worker (``"10/s"``); with ``key``, per key.

    ``burst``: how many starts may happen at once after a quiet spell (default: one second's
    worth of the rate, at least 1). Enforced with the generic cell rate algorithm (GCRA).
    """

    rate: str
    key: str | None = None
    burst: int | None = None

    def __post_init__(self) -> None:
        try:
            parse_rate(self.rate)
        except ValueError as exc:
            raise InvalidTaskError(f"Rate: {exc}.") from None
        _key(self.key, "Rate")
        if self.burst is not None:
            _positive_int(self.burst, "Rate(burst)")

    @property
    def interval(self) -> float:
        """Seconds between two starts at the steady rate (GCRA's emission interval)."""
        count, period = parse_rate(self.rate)
        return period / count

    @property
    def burst_size(self) -> int:
        """The declared burst, or one second's worth of the rate (at least 1)."""
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(1.0 / self.interval))


def concurrency_spec(value: Any) -> Limit | None:
    """``@task(concurrency=...)``: a whole number or a :class:`Limit`."""
    if value is None or isinstance(value, Limit):
        return value
    return Limit(_positive_int(value, "concurrency"))


def rate_spec(value: Any) -> Rate | None:
    """``@task(rate=...)``: a rate string or a :class:`Rate`."""
    if value is None or isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise InvalidTaskError(f"rate must be a string such as '100/m' or a Rate(...), not {value!r}.")
    return Rate(value)


@dataclasses.dataclass(frozen=True, slots=True)
class NamedLimit:
    """An entry of ``JOBGUARD["LIMITS"]``: a limit several tasks share with ``@task(limit=name)``."""

    name: str
    concurrency: int | None
    rate: Rate | None
    breaker: BreakerSpec | None = None
    retry_budget: RetryBudgetSpec | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerSpec:
    """``JOBGUARD["LIMITS"][name]["breaker"]``: when the dependency's breaker opens, and for how long.

    It opens when, among the calls (attempts that ended) of a window, at least ``min_calls``
    were made and at least ``failure_rate`` of them failed transiently; it stays open
    ``open_for`` seconds, then lets ``probes`` attempts through (half-open): one success
    closes it, one transient failure opens it again.
    """

    failure_rate: float = 0.5
    min_calls: int = 20
    window: float = 60.0
    open_for: float = 30.0
    probes: int = 5
    #: Exception classes that count as a failed call besides those that always do (timeouts,
    #: connection errors, the task's declared transient and recoverable errors).
    failures: tuple[type[BaseException], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class RetryBudgetSpec:
    """``JOBGUARD["LIMITS"][name]["retry_budget"]``: retries per window, as a share of first attempts.

    Within each window of ``window`` seconds the claim starts at most
    ``max(min_retries, ratio * first attempts started)`` retries of the dependency's jobs.
    """

    ratio: float = 0.2
    min_retries: int = 10
    window: float = 60.0

    def allowed(self, first_attempts: int) -> int:
        """Retries the window allows after ``first_attempts`` first attempts."""
        return max(self.min_retries, int(self.ratio * first_attempts))
