"""The checks every area's parser shares: numbers, strings, dicts, unknown keys, the error.

Each raises ``ImproperlyConfigured`` naming the full key, as in
``JOBGUARD['QUEUES']['exports']['visibility_timeout'] must be at least 1, not 0.``
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .defaults import DEFAULTS

#: The width of the queue columns (``Job.queue_name``, ``QueueState.queue_name``, ...).
MAX_QUEUE_NAME_LENGTH = 100


def _key(*parts: str) -> str:
    return "JOBGUARD" + "".join(f"[{p!r}]" for p in parts)


def fail(path: tuple[str, ...], message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{_key(*path)} {message}")


def number(value: Any, path: tuple[str, ...], *, minimum: float = 0, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(path, f"must be a number of seconds, not {value!r}.")
    if value < minimum or (not allow_zero and value == 0):
        raise fail(path, f"must be {'more than' if not allow_zero else 'at least'} {minimum}, not {value!r}.")
    return float(value)


def integer(value: Any, path: tuple[str, ...], *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise fail(path, f"must be an integer of at least {minimum}, not {value!r}.")
    return value


def optional_integer(value: Any, path: tuple[str, ...]) -> int | None:
    return None if value is None else integer(value, path, minimum=1)


def mapping(value: Any, path: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise fail(path, f"must be a dict, not {type(value).__name__}.")
    return value


def reject_unknown(given: Mapping[str, Any], allowed: set[str], path: tuple[str, ...]) -> None:
    extra = sorted(set(given) - allowed)
    if extra:
        raise fail(
            (*path, extra[0]),
            f"is not a known setting; known keys here: {', '.join(sorted(allowed))}. "
            "See docs/reference/settings.md.",
        )


def string(value: Any, path: tuple[str, ...]) -> str:
    if not isinstance(value, str) or not value:
        raise fail(path, f"must be a non-empty string, not {value!r}.")
    return value


def stored_text(value: str, path: tuple[str, ...], width: int, stored: str) -> str:
    """A string setting the database stores (``stored`` says where): at most ``width``
    characters, and no NUL, which PostgreSQL cannot store. Checked when the settings are
    read, so that no claim, tick or admin action meets it as a database error later."""
    if "\x00" in value:
        raise fail(path, f"holds a NUL character (\\x00), which the database cannot store in {stored}.")
    if len(value) > width:
        raise fail(
            path, f"is {len(value)} characters long; it may have at most {width}: it is stored in {stored}."
        )
    return value


def queue_setting(value: Any, path: tuple[str, ...]) -> str:
    """A queue name a setting gives: a non-empty string that fits the queue columns."""
    return stored_text(
        string(value, path),
        path,
        MAX_QUEUE_NAME_LENGTH,
        f"the {MAX_QUEUE_NAME_LENGTH}-character queue column of each job and of the queue controls",
    )


def boolean(value: Any, path: tuple[str, ...]) -> bool:
    if not isinstance(value, bool):
        raise fail(path, f"must be True or False, not {value!r}.")
    return value


def merged_group(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    given = mapping(raw.get(name, {}), (name,))
    reject_unknown(given, set(DEFAULTS[name]), (name,))
    return {**DEFAULTS[name], **given}
