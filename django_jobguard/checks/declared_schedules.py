"""Checks of recurring jobs (``JOBGUARD["SCHEDULES"]``): their tasks, times and overlaps."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .. import schedules
from ..conf import ScheduleConfig
from ..exceptions import InvalidArgumentsError, InvalidScheduleError
from ..registry import registry

if TYPE_CHECKING:
    from ..task import Task


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E010: bad cron or time zone; E011: unknown task or arguments that do not fit;
    W013: ticks closer than the task's expected duration; W014: a name declared twice."""
    try:
        declared = schedules.declared_schedules()
    except ImproperlyConfigured:
        return []
    messages: list[checks.CheckMessage] = []
    for name, spec in sorted(declared.items()):
        messages.extend(_schedule_messages(name, spec))
    return messages


def _schedule_where(name: str, spec: ScheduleConfig) -> str:
    """Where schedule ``name`` is declared, as its messages name it."""
    if spec.source == "code":
        return f"@task(schedule={spec.cron!r}) of {name}"
    return f"JOBGUARD['SCHEDULES'][{name!r}]"


def _schedule_messages(name: str, spec: ScheduleConfig) -> list[checks.CheckMessage]:
    """The W014, E010, E011 and W013 messages of one schedule, in that order."""
    messages: list[checks.CheckMessage] = []
    task = registry.find(spec.task)
    in_code = registry.find(name)
    if spec.source == "settings" and in_code is not None and in_code.schedule:
        messages.append(
            checks.Warning(
                f"Schedule {name!r} is declared by @task(schedule=...) and in JOBGUARD['SCHEDULES']; "
                "the settings entry is the one that runs.",
                hint="Keep one of the two declarations.",
                id="jobguard.W014",
            )
        )
    try:
        schedules.validate(spec.cron, spec.timezone)
    except InvalidScheduleError as exc:
        messages.append(
            checks.Error(
                f"{_schedule_where(name, spec)}: {exc}",
                hint="Use five cron fields (minute hour day month weekday), or six with seconds "
                "first, and an IANA time zone; see docs/how-to/recurring-jobs.md.",
                id="jobguard.E010",
            )
        )
        return messages
    problem = _schedule_task_problem(spec, task)
    if task is None or problem is not None:
        messages.append(
            checks.Error(
                f"{_schedule_where(name, spec)} {problem}.",
                hint="Name a function decorated with @task (in an app's tasks.py) by its dotted "
                "path; each tick enqueues it with the schedule's args and kwargs.",
                id="jobguard.E011",
            )
        )
        return messages
    messages.extend(_schedule_overlap(name, spec, task))
    return messages


def _schedule_task_problem(spec: ScheduleConfig, task: Task | None) -> str | None:
    """Why the schedule cannot enqueue its task (unregistered, arguments that do not fit), or None."""
    if task is None:
        return f"names task {spec.task!r}, which is not registered"
    try:
        task.bind(spec.args, spec.kwargs)
    except InvalidArgumentsError as exc:
        return f"has args/kwargs that do not fit the task: {str(exc).rstrip('.')}"
    return None


def _schedule_overlap(name: str, spec: ScheduleConfig, task: Task) -> list[checks.CheckMessage]:
    """jobguard.W013: the schedule ticks more often than its task is expected to run."""
    # Until (and unless) @task takes expected_duration=, tasks simply have none.
    expected = getattr(task, "expected_duration", None)
    if not expected:
        return []
    start = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    interval = schedules.shortest_interval(spec.cron, spec.timezone, start)
    if interval < expected:
        return [
            checks.Warning(
                f"{_schedule_where(name, spec)} ticks every {interval:g}s, but {task.name} is expected "
                f"to run for {expected:g}s: runs will pile up behind each other.",
                hint="Tick less often, or give the task a lock= so runs cannot overlap.",
                id="jobguard.W013",
            )
        ]
    return []
