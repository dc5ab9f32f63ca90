"""Arguments shared by the jobguard commands; their errors name the rule broken."""

from __future__ import annotations

import argparse
import datetime
import getpass
import re
from collections.abc import Iterable
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections

from ...conf import get_settings
from ...models import Job

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def operator() -> str:
    """Who ran the command, for the audit trail (the command runs with no Django user)."""
    try:
        return f"shell:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry in some containers
        return "shell"


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


def non_negative_int(value: str) -> int:
    """An integer of 0 or more."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {number}")
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


def duration(value: str) -> datetime.timedelta:
    """An age: a number of seconds, or a number with a unit s, m, h, d or w (``90m``, ``30d``)."""
    match = _DURATION.match(value)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration: give a number of seconds (3600) or a number with a unit "
            "s, m, h, d or w (90m, 12h, 30d, 2w)"
        )
    return datetime.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


def check_queues(names: Iterable[str], alias: str, option: str = "--queue") -> None:
    """Refuse a queue name that JOBGUARD["QUEUES"] does not declare and that holds no job.

    A name outside the declared queues is most often a typo: a worker would wait on it
    forever and a status would show zeros. One that still holds jobs (a queue removed from
    the settings, its jobs not drained yet) stays usable, so its jobs can still be run or seen.
    """

    conf = get_settings()
    for name in names:
        if not name or len(name) > 100:
            raise CommandError(f"{option} {name!r}: a queue name is 1 to 100 characters.")
        refusal = conf.undeclared_queue(name)
        if refusal is not None and not Job.objects.using(alias).filter(queue_name=name).exists():
            raise CommandError(f"{option} {name!r}: {refusal} No job is in that queue either.")


def window(value: str) -> float:
    """A time window in seconds: ``90s``, ``30m``, ``24h``, ``7d``, or plain seconds; above zero."""
    seconds = duration(value).total_seconds()
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be a window above 0")
    return seconds
