"""``CELERY_BEAT_SCHEDULE`` read into ``JOBGUARD["SCHEDULES"]``, and Celery's ``crontab``.

Import-safe in a settings module (no Django settings, no models)::

    from django_jobguard.contrib.celery.beat import beat_schedule, crontab

    CELERY_BEAT_SCHEDULE = {
        "nightly-report": {"task": "shop.tasks.report", "schedule": crontab(hour=3, minute=0)},
        "poll": {"task": "shop.tasks.poll", "schedule": 30.0, "args": (1,)},
    }
    JOBGUARD = {"SCHEDULES": beat_schedule(CELERY_BEAT_SCHEDULE, timezone=CELERY_TIMEZONE)}

Every worker's scheduler then enqueues each entry once per tick, across the fleet (there is
no beat process to run). An entry option jobguard does not honour is left out here and named
by the system check ``jobguard.celery.W004``; an entry missing from ``JOBGUARD["SCHEDULES"]``
by ``jobguard.celery.W003``.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

__all__ = ["beat_schedule", "convert_entry", "cron_for", "crontab"]

#: Options of a beat entry's ``options`` that become the schedule's.
_HONOURED_OPTIONS = ("queue",)


def _field(value: Any, name: str) -> str:
    if isinstance(value, bool):
        raise ImproperlyConfigured(
            f"crontab({name}={value!r}): give a number, a string or a list of numbers."
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text:
            raise ImproperlyConfigured(f"crontab({name}=''): give '*' for every value.")
        return text.upper() if any(c.isalpha() for c in text) else text
    if isinstance(value, Iterable):
        items = sorted({int(item) for item in value})
        if not items:
            raise ImproperlyConfigured(f"crontab({name}=...) is empty.")
        return ",".join(map(str, items))
    raise ImproperlyConfigured(f"crontab({name}={value!r}): give a number, a string or a list of numbers.")


@dataclasses.dataclass(frozen=True)
class crontab:  # noqa: N801 - Celery's name
    """Celery's ``crontab(minute, hour, day_of_week, day_of_month, month_of_year)``: a cron expression.

    Each field defaults to ``"*"``, as in Celery (so ``crontab(hour=7)`` ticks every minute of
    7 o'clock). ``day_of_week`` counts from Sunday = 0, or takes names (``"mon-fri"``).
    """

    minute: Any = "*"
    hour: Any = "*"
    day_of_week: Any = "*"
    day_of_month: Any = "*"
    month_of_year: Any = "*"

    @property
    def cron(self) -> str:
        """The five-field cron expression (minute hour day-of-month month day-of-week)."""
        return " ".join(
            (
                _field(self.minute, "minute"),
                _field(self.hour, "hour"),
                _field(self.day_of_month, "day_of_month"),
                _field(self.month_of_year, "month_of_year"),
                _field(self.day_of_week, "day_of_week"),
            )
        )


def _interval_cron(seconds: float, where: str) -> str:
    if seconds <= 0 or not float(seconds).is_integer():
        raise ImproperlyConfigured(
            f"{where}: an interval must be a whole number of seconds, not {seconds!r}."
        )
    whole = int(seconds)
    if whole < 60 and 60 % whole == 0:
        return "* * * * * *" if whole == 1 else f"*/{whole} * * * * *"
    if whole % 60 == 0 and whole < 3600 and 60 % (whole // 60) == 0:
        minutes = whole // 60
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if whole % 3600 == 0 and whole < 86400 and 24 % (whole // 3600) == 0:
        hours = whole // 3600
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    if whole == 86400:
        return "0 0 * * *"
    raise ImproperlyConfigured(
        f"{where}: every {whole} seconds is not a whole fraction of a minute, an hour or a day, so no cron "
        "expression ticks at that interval; write the entry with crontab(...) instead."
    )


def cron_for(schedule: Any, where: str = "schedule") -> str:
    """A beat entry's ``schedule`` (crontab, timedelta or seconds) as a cron expression.

    An interval becomes ticks aligned to the clock (every 30 s: at :00 and :30 of each
    minute), where Celery's beat counts from its own start.
    """
    if isinstance(schedule, crontab):
        return schedule.cron
    if isinstance(schedule, datetime.timedelta):
        return _interval_cron(schedule.total_seconds(), where)
    if isinstance(schedule, int | float) and not isinstance(schedule, bool):
        return _interval_cron(float(schedule), where)
    cron = getattr(schedule, "cron", None)
    if isinstance(cron, str):
        return cron
    raise ImproperlyConfigured(
        f"{where}: {schedule!r} is not a crontab, a timedelta or a number of seconds (solar schedules and "
        "custom schedule classes are not read)."
    )


def convert_entry(
    name: str, entry: Mapping[str, Any], timezone: str = "UTC"
) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """One beat entry as a ``JOBGUARD["SCHEDULES"]`` entry, and the options left out of it."""
    where = f"CELERY_BEAT_SCHEDULE[{name!r}]"
    if not isinstance(entry, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict with 'task' and 'schedule'.")
    for required in ("task", "schedule"):
        if required not in entry:
            raise ImproperlyConfigured(f"{where} has no {required!r}.")
    args = entry.get("args") or ()
    if isinstance(args, str | bytes) or not isinstance(args, Iterable):
        raise ImproperlyConfigured(f"{where}['args'] must be a list or tuple.")
    converted: dict[str, Any] = {
        "task": entry["task"],
        "cron": cron_for(entry["schedule"], f"{where}['schedule']"),
        "timezone": timezone or "UTC",
        "args": list(args),
        "kwargs": dict(entry.get("kwargs") or {}),
    }
    left_out: list[tuple[str, Any]] = []
    options = dict(entry.get("options") or {})
    if options.get("queue"):
        converted["queue_name"] = options["queue"]
    left_out += [
        (f"options[{key!r}]", value) for key, value in options.items() if key not in _HONOURED_OPTIONS
    ]
    if entry.get("relative"):
        left_out.append(("relative", entry["relative"]))
    left_out += [
        (key, entry[key])
        for key in entry
        if key not in ("task", "schedule", "args", "kwargs", "options", "relative")
    ]
    return converted, left_out


def beat_schedule(
    entries: Mapping[str, Any] | None, *, timezone: str | None = None
) -> dict[str, dict[str, Any]]:
    """``CELERY_BEAT_SCHEDULE`` as ``JOBGUARD["SCHEDULES"]`` (the entries keep their names).

    ``timezone``: the one your crontabs were written in (``CELERY_TIMEZONE``; UTC if None).
    Raises ``ImproperlyConfigured`` naming the entry for one that cannot be read.
    """
    return {name: convert_entry(name, entry, timezone or "UTC")[0] for name, entry in (entries or {}).items()}
