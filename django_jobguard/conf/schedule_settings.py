"""Recurring jobs: ``JOBGUARD["SCHEDULES"]`` and the scheduler's ``SCHEDULER`` group."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._values import fail, integer, mapping, number, queue_setting, reject_unknown, stored_text, string

#: What a schedule does with ticks missed while no scheduler ran (see docs/how-to/recurring-jobs.md).
MISSED_POLICIES = ("skip", "run_once", "catch_up")

#: Schedule names are part of each tick's idempotency key, which holds 255 characters.
MAX_SCHEDULE_NAME_LENGTH = 200
#: The widths of the schedule table's task, cron and time zone columns (``Schedule``).
MAX_SCHEDULE_TASK_LENGTH = 255
MAX_SCHEDULE_CRON_LENGTH = 255
MAX_SCHEDULE_TIMEZONE_LENGTH = 64

_SCHEDULE_KEYS = {"task", "cron", "timezone", "args", "kwargs", "queue_name", "missed"}


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleConfig:
    """One recurring job: ``JOBGUARD["SCHEDULES"][name]`` or a task's ``schedule=`` option.

    The cron expression and the time zone are checked by the system checks (``jobguard.E010``)
    and by the scheduler, which never ticks a schedule it cannot parse.
    """

    name: str
    task: str
    cron: str
    timezone: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    queue_name: str | None = None
    missed: str = "run_once"
    #: "settings" or "code" (a task's schedule= option).
    source: str = "settings"


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """``JOBGUARD["SCHEDULER"]``."""

    interval: float
    missed_after: float
    catch_up_max: int


def _json_value(value: Any, path: tuple[str, ...]) -> None:
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise fail(path, f"must be JSON-serialisable: {exc}.") from None


def parse_schedules(value: Any) -> dict[str, ScheduleConfig]:
    """Validate ``JOBGUARD["SCHEDULES"]``: the shape of each entry (cron syntax: the checks)."""
    schedules: dict[str, ScheduleConfig] = {}
    for name, entry in mapping(value, ("SCHEDULES",)).items():
        path = ("SCHEDULES", str(name))
        stored_text(
            string(name, path),
            path,
            MAX_SCHEDULE_NAME_LENGTH,
            f"the {MAX_SCHEDULE_NAME_LENGTH}-character name column of the schedule table, and in each "
            "tick's idempotency key",
        )
        entry = mapping(entry, path)
        reject_unknown(entry, _SCHEDULE_KEYS, path)
        for required in ("task", "cron"):
            if required not in entry:
                raise fail((*path, required), "is required.")
        args = entry.get("args", [])
        if not isinstance(args, list | tuple):
            raise fail((*path, "args"), f"must be a list, not {type(args).__name__}.")
        kwargs = mapping(entry.get("kwargs", {}), (*path, "kwargs"))
        _json_value(list(args), (*path, "args"))
        _json_value(dict(kwargs), (*path, "kwargs"))
        queue_name = entry.get("queue_name")
        if queue_name is not None:
            queue_path = (*path, "queue_name")
            queue_setting(queue_name, queue_path)
        missed = entry.get("missed", "run_once")
        if missed not in MISSED_POLICIES:
            raise fail((*path, "missed"), f"must be one of {list(MISSED_POLICIES)}, not {missed!r}.")
        schedules[name] = ScheduleConfig(
            name=name,
            task=_column(entry["task"], (*path, "task"), MAX_SCHEDULE_TASK_LENGTH, "task"),
            cron=_column(entry["cron"], (*path, "cron"), MAX_SCHEDULE_CRON_LENGTH, "cron"),
            timezone=_column(
                entry.get("timezone", "UTC"), (*path, "timezone"), MAX_SCHEDULE_TIMEZONE_LENGTH, "timezone"
            ),
            args=tuple(args),
            kwargs=dict(kwargs),
            queue_name=queue_name,
            missed=missed,
        )
    return schedules


def _column(value: Any, path: tuple[str, ...], width: int, column: str) -> str:
    """A schedule's string option stored in the ``column`` of the schedule table, ``width`` wide."""
    return stored_text(
        string(value, path), path, width, f"the {width}-character {column} column of the schedule table"
    )


def parse_scheduler_settings(scheduler: Mapping[str, Any]) -> SchedulerSettings:
    return SchedulerSettings(
        interval=number(scheduler["INTERVAL"], ("SCHEDULER", "INTERVAL"), allow_zero=False),
        missed_after=number(scheduler["MISSED_AFTER"], ("SCHEDULER", "MISSED_AFTER")),
        catch_up_max=integer(scheduler["CATCH_UP_MAX"], ("SCHEDULER", "CATCH_UP_MAX"), minimum=1),
    )
