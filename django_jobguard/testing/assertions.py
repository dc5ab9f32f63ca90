"""``assert_enqueued``, ``refute_enqueued`` and ``enqueued_jobs``: what the code under test enqueued.

They read the jobs of whichever store serves them (the database's table, or the in-memory
store), every status included: a job that already ran was still enqueued. Each keyword narrows
the match: ``kwargs`` is a partial match by parameter name (the arguments given must be
there with these values, passed by keyword or by position or left to their defaults; others
may be too), ``args`` an exact one, ``run_after`` matches within a second (a datetime,
or a timedelta counted from the job's enqueue). ``unittest.mock.ANY`` matches any value.
"""

from __future__ import annotations

import datetime
import inspect
import pprint
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..conf import get_settings
from ..encryption.payloads import ARGS, KWARGS, open_json
from ..registry import registry
from . import _state
from ._stores import all_jobs
from .errors import JobguardTestingError

if TYPE_CHECKING:
    from ..models import Job

__all__ = ["assert_enqueued", "enqueued_jobs", "refute_enqueued", "task_name"]

#: How far apart a job's run_after and the one asked for may be, in seconds (clocks, rounding).
RUN_AFTER_TOLERANCE_SECONDS = 1.0
#: Jobs the failure message of assert_enqueued lists at most.
MAX_LISTED = 20
_UNSET: Any = object()


def task_name(task: Any) -> str:
    """The registered name of ``task`` (a task, a Django task or a dotted name); a clear error if none."""
    name: Any = task
    if not isinstance(task, str):
        name = getattr(task, "name", None) or getattr(task, "module_path", None)
        if not isinstance(name, str):
            raise JobguardTestingError(
                f"expected a task (decorated with @task) or its dotted name, not {task!r}"
            )
    if registry.resolve(name) is None:
        known = ", ".join(registry.names()) or "(none)"
        raise JobguardTestingError(
            f"no task is registered as {name!r}, so no job of it can be enqueued: check the name, "
            f"and that its app's tasks.py is imported. Registered tasks: {known}"
        )
    return str(name)


class _Criteria:
    """What a test asks of a job, and how one job differs from it."""

    def __init__(self, task: Any, fields: dict[str, Any]) -> None:
        self.task = task_name(task) if task is not None else None
        self.fields = {name: value for name, value in fields.items() if value is not _UNSET}
        if "kwargs" in self.fields and not isinstance(self.fields["kwargs"], Mapping):
            raise JobguardTestingError(f"kwargs= takes a dict, not {self.fields['kwargs']!r}")
        args = self.fields.get("args")
        if args is not None and (isinstance(args, str | bytes) or not isinstance(args, Sequence)):
            raise JobguardTestingError(f"args= takes a list, not {args!r}")

    def describe(self) -> str:
        parts = [f"{name}={value!r}" for name, value in self.fields.items()]
        return ", ".join(parts) if parts else "any arguments"

    def differences(self, job: Job) -> list[str]:
        """How ``job`` differs from the criteria, one line each (empty: it matches)."""
        found: list[str] = []
        if self.task is not None and job.task_name != self.task:
            found.append(f"task: expected {self.task!r}, got {job.task_name!r}")
        for name, expected in self.fields.items():
            if name == "kwargs":
                named = named_arguments(job)
                for key, value in expected.items():
                    if key not in named:
                        found.append(f"kwargs[{key!r}]: expected {value!r}, missing")
                    elif named[key] != value:
                        found.append(f"kwargs[{key!r}]: expected {value!r}, got {named[key]!r}")
            elif name == "args":
                args = list(_payload(job)[0])
                if args != list(expected):
                    found.append(f"args: expected {list(expected)!r}, got {args!r}")
            elif name == "run_after":
                if not _run_after_matches(job, expected):
                    got = job.run_after.isoformat()
                    found.append(f"run_after: expected {_when(job, expected)}, got {got}")
            else:
                actual = getattr(job, _FIELD[name])
                if actual != expected:
                    found.append(f"{name}: expected {expected!r}, got {actual!r}")
        return found


def named_arguments(job: Job) -> dict[str, Any]:
    """The job's arguments by parameter name: positional ones bound to the handler's signature,
    defaults filled in, ``**kwargs`` spread out (only its ``kwargs`` if the task is unknown)."""
    found = registry.resolve(job.task_name)
    signature = getattr(found, "signature", None)
    args, kwargs = _payload(job)
    if not isinstance(signature, inspect.Signature):
        return dict(kwargs)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return dict(kwargs)
    bound.apply_defaults()
    named: dict[str, Any] = {}
    for key, value in bound.arguments.items():
        if signature.parameters[key].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[key] = value
    return named


#: assert_enqueued's keywords -> Job's fields.
_FIELD = {
    "queue": "queue_name",
    "priority": "priority",
    "status": "status",
    "idempotency_key": "idempotency_key",
}


def _when(job: Job, expected: datetime.datetime | datetime.timedelta) -> str:
    if isinstance(expected, datetime.timedelta):
        return f"{(job.enqueued_at + expected).isoformat()} (enqueued_at + {expected})"
    return expected.isoformat()


def _run_after_matches(job: Job, expected: Any) -> bool:
    if isinstance(expected, datetime.timedelta):
        target = job.enqueued_at + expected
    elif isinstance(expected, datetime.datetime):
        target = expected
    else:
        return bool(job.run_after == expected)  # e.g. unittest.mock.ANY
    return abs((job.run_after - target).total_seconds()) <= RUN_AFTER_TOLERANCE_SECONDS


def _payload(job: Job) -> tuple[Any, Any]:
    """A job's arguments as the test wrote them: opened if its task encrypts them."""
    return open_json(job.args, ARGS, "job.args"), open_json(job.kwargs, KWARGS, "job.kwargs")


def _line(job: Job) -> str:
    args, kwargs = _payload(job)
    return (
        f"job {job.pk} {job.task_name} queue={job.queue_name!r} args={list(args)!r} "
        f"kwargs={pprint.pformat(kwargs, width=200, compact=True)} priority={job.priority} "
        f"run_after={job.run_after.isoformat()} status={job.status}"
    )


def _select(
    task: Any,
    *,
    args: Any,
    kwargs: Any,
    queue: Any,
    priority: Any,
    run_after: Any,
    status: Any,
    idempotency_key: Any,
    using: str | None,
) -> tuple[_Criteria, list[Job], list[Job]]:
    """The criteria, the matching jobs, and every job (oldest first)."""
    _state.raise_problems()
    criteria = _Criteria(
        task,
        {
            "args": args,
            "kwargs": kwargs,
            "queue": queue,
            "priority": priority,
            "run_after": run_after,
            "status": status,
            "idempotency_key": idempotency_key,
        },
    )
    jobs = all_jobs(using or get_settings().database_alias)
    return criteria, [job for job in jobs if not criteria.differences(job)], jobs


def enqueued_jobs(
    task: Any = None,
    *,
    args: Any = _UNSET,
    kwargs: Any = _UNSET,
    queue: Any = _UNSET,
    priority: Any = _UNSET,
    run_after: Any = _UNSET,
    status: Any = _UNSET,
    idempotency_key: Any = _UNSET,
    using: str | None = None,
) -> list[Job]:
    """The jobs enqueued (of ``task``, matching the keywords), oldest first."""
    _, matching, _ = _select(
        task,
        args=args,
        kwargs=kwargs,
        queue=queue,
        priority=priority,
        run_after=run_after,
        status=status,
        idempotency_key=idempotency_key,
        using=using,
    )
    return matching


def assert_enqueued(
    task: Any = None,
    *,
    args: Any = _UNSET,
    kwargs: Any = _UNSET,
    queue: Any = _UNSET,
    priority: Any = _UNSET,
    run_after: Any = _UNSET,
    status: Any = _UNSET,
    idempotency_key: Any = _UNSET,
    count: int | None = None,
    using: str | None = None,
) -> Job:
    """Assert a job of ``task`` matching the keywords was enqueued (exactly ``count`` with count=).

    Returns the first match. On failure the ``AssertionError`` lists what was enqueued
    instead, and how each job of the task differs from what was asked.
    """
    criteria, matching, jobs = _select(
        task,
        args=args,
        kwargs=kwargs,
        queue=queue,
        priority=priority,
        run_after=run_after,
        status=status,
        idempotency_key=idempotency_key,
        using=using,
    )
    what = f"{criteria.task or 'any task'} with {criteria.describe()}"
    if count is not None and len(matching) != count:
        listed = "".join(f"\n  {_line(job)}" for job in matching[:MAX_LISTED])
        raise AssertionError(f"expected {count} job(s) of {what}, found {len(matching)}{listed}")
    if matching:
        return matching[0]
    raise AssertionError(_missing(what, criteria, jobs))


def _missing(what: str, criteria: _Criteria, jobs: list[Job]) -> str:
    lines = [f"no job of {what} was enqueued."]
    if not jobs:
        lines.append("Nothing was enqueued.")
        return "\n".join(lines)
    same_task = [job for job in jobs if criteria.task is None or job.task_name == criteria.task]
    others = [job for job in jobs if job not in same_task]
    if same_task:
        lines.append(f"Enqueued instead ({len(same_task)} job(s) of {criteria.task or 'any task'}):")
        for job in same_task[:MAX_LISTED]:
            lines.append(f"  {_line(job)}")
            lines.extend(f"      - {difference}" for difference in criteria.differences(job))
        if len(same_task) > MAX_LISTED:
            lines.append(f"  ... and {len(same_task) - MAX_LISTED} more")
    else:
        lines.append(f"No job of {criteria.task} at all.")
    if others:
        counts: dict[str, int] = {}
        for job in others:
            counts[job.task_name] = counts.get(job.task_name, 0) + 1
        listed = ", ".join(f"{name} ({n})" for name, n in sorted(counts.items()))
        lines.append(f"Other tasks enqueued: {listed}")
    return "\n".join(lines)


def refute_enqueued(
    task: Any = None,
    *,
    args: Any = _UNSET,
    kwargs: Any = _UNSET,
    queue: Any = _UNSET,
    priority: Any = _UNSET,
    run_after: Any = _UNSET,
    status: Any = _UNSET,
    idempotency_key: Any = _UNSET,
    using: str | None = None,
) -> None:
    """Assert no job of ``task`` matching the keywords was enqueued; the error lists those that were."""
    criteria, matching, _ = _select(
        task,
        args=args,
        kwargs=kwargs,
        queue=queue,
        priority=priority,
        run_after=run_after,
        status=status,
        idempotency_key=idempotency_key,
        using=using,
    )
    if matching:
        listed = "\n".join(f"  {_line(job)}" for job in matching[:MAX_LISTED])
        raise AssertionError(
            f"expected no job of {criteria.task or 'any task'} with {criteria.describe()}, "
            f"found {len(matching)}:\n{listed}"
        )
