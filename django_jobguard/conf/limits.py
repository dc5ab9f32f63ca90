"""Flow control: the shared limits of ``JOBGUARD["LIMITS"]``, their breakers and retry budgets.

Parsed into the specs of :mod:`django_jobguard.flow` (:class:`NamedLimit`, :class:`BreakerSpec`,
:class:`RetryBudgetSpec`); :mod:`django_jobguard.conf` gives their names too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils.module_loading import import_string

from ..flow import MAX_STORED_RATE_KEY_LENGTH, BreakerSpec, NamedLimit, Rate, RetryBudgetSpec, parse_rate
from ._values import fail, integer, mapping, number, optional_integer, reject_unknown, stored_text, string

#: The width of the breaker tables' name columns (``Breaker.name``, ``BreakerEvent.name``),
#: where a limit with a breaker or a retry budget keeps its state under its name.
MAX_BREAKER_NAME_LENGTH = 100

#: The options of an entry of JOBGUARD["LIMITS"].
LIMIT_OPTIONS = {"rate", "burst", "concurrency", "breaker", "retry_budget"}

#: A breaker's options and their defaults (``JOBGUARD["LIMITS"][name]["breaker"]``).
BREAKER_DEFAULTS: dict[str, object] = {
    "failure_rate": 0.5,
    "min_calls": 20,
    "window": 60.0,
    "open_for": 30.0,
    "probes": 5,
    "failures": [],
}

#: A retry budget's options and their defaults (``JOBGUARD["LIMITS"][name]["retry_budget"]``).
RETRY_BUDGET_DEFAULTS: dict[str, float] = {"ratio": 0.2, "min_retries": 10, "window": 60.0}


def parse_limits(value: Any) -> dict[str, NamedLimit]:
    """``JOBGUARD["LIMITS"]``: shared limits by name, each with a rate, a concurrency or both."""
    limits: dict[str, NamedLimit] = {}
    for name, options in mapping(value, ("LIMITS",)).items():
        path = ("LIMITS", str(name))
        string(name, path)
        options = mapping(options, path)
        reject_unknown(options, LIMIT_OPTIONS, path)
        if not set(options) & {"rate", "concurrency", "breaker", "retry_budget"}:
            raise fail(
                path,
                "needs a 'rate' (such as '25/s'), a 'concurrency' (such as 10), a 'breaker' "
                "or a 'retry_budget' (True for the defaults).",
            )
        _check_stored_name(name, options, path)
        rate = None
        if options.get("rate") is not None:
            try:
                parse_rate(options["rate"])
            except ValueError as exc:
                raise fail((*path, "rate"), f"is not a rate: {exc}.") from None
            burst = optional_integer(options.get("burst"), (*path, "burst"))
            rate = Rate(options["rate"], burst=burst)
        elif "burst" in options:
            raise fail((*path, "burst"), "is set without a 'rate' to burst over.")
        limits[name] = NamedLimit(
            name=name,
            concurrency=optional_integer(options.get("concurrency"), (*path, "concurrency")),
            rate=rate,
            breaker=_breaker(options.get("breaker"), (*path, "breaker")),
            retry_budget=_retry_budget(options.get("retry_budget"), (*path, "retry_budget")),
        )
    return limits


def _check_stored_name(name: str, options: Mapping[str, Any], path: tuple[str, ...]) -> None:
    """Refuse a limit name a stored form of which its columns cannot hold.

    A rate's state is stored as ``rate:limit:<name>`` in the rate table's key column, a
    breaker's or a retry budget's under the name in the breaker table's: a value too long
    failed every claim of the limit's jobs, as "database unreachable", retried for ever.
    """
    if "\x00" in name:
        raise fail(path, "holds a NUL character (\\x00): the database cannot store the limit's name.")
    if options.get("breaker") not in (None, False) or options.get("retry_budget") not in (None, False):
        stored_text(
            name,
            path,
            MAX_BREAKER_NAME_LENGTH,
            f"the {MAX_BREAKER_NAME_LENGTH}-character name column of the breaker table "
            "(a limit with a breaker or a retry_budget keeps its state under its name)",
        )
    if options.get("rate") is not None:
        longest = MAX_STORED_RATE_KEY_LENGTH - len("rate:limit:")
        stored_text(
            name,
            path,
            longest,
            f"the rate table's key column as 'rate:limit:<name>' ({MAX_STORED_RATE_KEY_LENGTH} characters)",
        )


def _spec_options(value: Any, defaults: Mapping[str, object], path: tuple[str, ...]) -> dict[str, Any] | None:
    """A breaker's or a budget's options over their defaults; None when it is off (None, False)."""
    if value is None or value is False:
        return None
    if value is True:
        return dict(defaults)
    given = mapping(value, path)
    reject_unknown(given, set(defaults), path)
    return {**defaults, **given}


def _exception_classes(value: Any, path: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    """A list of dotted paths of exception classes (``"requests.ConnectionError"``), imported."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise fail(path, f"must be a list of dotted paths of exception classes, not {value!r}.")
    classes: list[type[BaseException]] = []
    for index, dotted in enumerate(value):
        where = (*path, str(index))
        if not isinstance(dotted, str):
            raise fail(where, f"must be the dotted path of an exception class, not {dotted!r}.")
        try:
            found = import_string(dotted)
        except ImportError as exc:
            raise fail(where, f"cannot be imported: {exc}.") from None
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            raise fail(where, f"{dotted!r} is not an exception class.")
        classes.append(found)
    return tuple(classes)


def _fraction(value: Any, path: tuple[str, ...], *, allow_zero: bool = False) -> float:
    """A share such as 0.5: above 0 (or 0 with ``allow_zero``) and at most 1."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (0 <= value <= 1) or (value == 0 and not allow_zero):
        low = "0" if allow_zero else "above 0"
        raise fail(path, f"must be a fraction from {low} to 1 (0.5 is half), not {value!r}.")
    return float(value)


def _breaker(value: Any, path: tuple[str, ...]) -> BreakerSpec | None:
    options = _spec_options(value, BREAKER_DEFAULTS, path)
    if options is None:
        return None
    return BreakerSpec(
        failure_rate=_fraction(options["failure_rate"], (*path, "failure_rate")),
        min_calls=integer(options["min_calls"], (*path, "min_calls"), minimum=1),
        window=number(options["window"], (*path, "window"), allow_zero=False),
        open_for=number(options["open_for"], (*path, "open_for"), allow_zero=False),
        probes=integer(options["probes"], (*path, "probes"), minimum=1),
        failures=_exception_classes(options["failures"], (*path, "failures")),
    )


def _retry_budget(value: Any, path: tuple[str, ...]) -> RetryBudgetSpec | None:
    options = _spec_options(value, RETRY_BUDGET_DEFAULTS, path)
    if options is None:
        return None
    return RetryBudgetSpec(
        ratio=_fraction(options["ratio"], (*path, "ratio"), allow_zero=True),
        min_retries=integer(options["min_retries"], (*path, "min_retries"), minimum=0),
        window=number(options["window"], (*path, "window"), allow_zero=False),
    )
