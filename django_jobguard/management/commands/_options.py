"""Arguments shared by the jobguard commands; their errors name the rule broken."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

from ...conf import get_settings


def add_database_argument(parser: CommandParser) -> None:
    """``--database ALIAS``; read it back with :func:`database_alias`."""
    parser.add_argument(
        "--database",
        default=None,
        help="Database alias holding the jobs (default JOBGUARD['DATABASE_ALIAS']).",
    )


def database_alias(options: dict[str, Any]) -> str:
    """The ``--database`` given, else ``JOBGUARD["DATABASE_ALIAS"]``; an unknown alias is an error."""
    alias: str = options["database"] or get_settings().database_alias
    if alias not in connections.settings:
        raise CommandError(f"--database {alias!r}: no such database alias in DATABASES.")
    return alias


def positive_int(value: str) -> int:
    """An integer of 1 or more."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {number}")
    return number


def positive_float(value: str) -> float:
    """A number of seconds above zero."""
    number = _seconds(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {value}")
    return number


def non_negative_float(value: str) -> float:
    """A number of seconds, zero or more."""
    number = _seconds(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 seconds or more, not {value}")
    return number


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number of seconds")
    return number


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window(value: str) -> float:
    """A time window: ``90s``, ``30m``, ``24h``, ``7d``, or plain seconds; above zero."""
    text = value.strip().lower()
    unit = _UNITS.get(text[-1:]) if text else None
    number_text = text[:-1] if unit is not None else text
    try:
        number = float(number_text) * (unit or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a time window; write it as 90s, 30m, 24h, 7d or a number of seconds"
        ) from None
    if number != number or number in (float("inf"), float("-inf")) or number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a finite window above 0")
    return number
