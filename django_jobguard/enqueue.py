"""Bind and validate arguments, dedupe by idempotency key, insert the job row.

Enqueue runs on ``JOBGUARD["DATABASE_ALIAS"]`` inside whatever transaction the caller
has open there: a rolled-back transaction leaves no job behind. On PostgreSQL a trigger
(see the migrations) notifies idle workers when the row commits.
"""

from __future__ import annotations

import datetime
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _dispatch, idempotency, leasing, metrics, signals
from .conf import get_settings
from .exceptions import InvalidArgumentsError

if TYPE_CHECKING:
    from .models import Job
    from .task import Task

__all__ = ["bulk_enqueue", "enqueue", "normalize_json"]

MAX_QUEUE_NAME_LENGTH = 100


def normalize_json(value: Any, where: str) -> Any:
    """Return ``value`` as plain JSON types, or raise naming the first part that is not.

    Tuples become lists. Non-finite floats, non-string keys and any other type are
    refused, so what the handler receives is exactly what was enqueued.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentsError(f"{where}: {value!r} is not valid JSON (only finite numbers are).")
        return value
    if isinstance(value, list | tuple):
        return [normalize_json(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidArgumentsError(
                    f"{where}: key {key!r} is not a string; JSON objects need string keys."
                )
            out[key] = normalize_json(item, f"{where}[{key!r}]")
        return out
    hint = " (pass value.isoformat())" if isinstance(value, datetime.date | datetime.time) else ""
    raise InvalidArgumentsError(
        f"{where}: {type(value).__module__}.{type(value).__qualname__} is not JSON-serialisable{hint}."
    )


def _prepare(task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Everything about one call that does not touch the database."""
    bound = task.bind(args, kwargs)
    clean_args = normalize_json(list(args), "args")
    clean_kwargs = normalize_json(dict(kwargs), "kwargs")
    conf = get_settings()
    queue_name = task.queue_name or conf.default_queue
    if len(queue_name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidArgumentsError(f"queue_name must be at most {MAX_QUEUE_NAME_LENGTH} characters.")
    queue = conf.queue(queue_name)
    return {
        "task_name": task.name,
        "queue_name": queue_name,
        "args": clean_args,
        "kwargs": clean_kwargs,
        "priority": task.priority,
        "max_attempts": task.max_attempts or queue.max_attempts,
        "visibility_timeout": task.visibility_timeout or queue.visibility_timeout,
        "lock_key": task.lock_key_for(bound),
        "handler_version": task.handler_version or conf.handler_version,
        "idempotency_key": task.idempotency_key,
    }


def _insert(task: Task[Any, Any], rows: list[dict[str, Any]], alias: str) -> list[Job]:
    """Insert ``rows`` and return them as saved ``Job`` instances (no second query)."""
    inserted = leasing.insert_jobs(alias, rows, task.run_after)
    return [build_job(alias, fields, row) for fields, row in zip(rows, inserted, strict=True)]


def build_job(
    alias: str, fields: dict[str, Any], inserted: tuple[int, datetime.datetime, datetime.datetime]
) -> Job:
    """The saved ``Job`` of ``fields`` and what its insert returned: ``(id, run_after, enqueued_at)``."""
    from .models import Job

    names, defaults = _job_layout()
    pk, run_after, enqueued_at = inserted
    values = {**defaults, **fields, "id": pk, "run_after": run_after, "enqueued_at": enqueued_at}
    values["checkpoints"] = {}
    values["attempt_history"] = []
    # from_db builds the instance positionally, as a query would: about a third of the
    # cost of keyword construction, on the enqueue hot path.
    return Job.from_db(alias, names, [values[name] for name in names])


@functools.cache
def _job_layout() -> tuple[list[str], dict[str, Any]]:
    """The Job's column attributes in order, and the fixed defaults of a new row."""
    from .models import Job

    fields = Job._meta.concrete_fields
    return [field.attname for field in fields], {
        field.attname: None if callable(field.default) else field.get_default() for field in fields
    }


def enqueue(task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Job:
    """Store one job for ``task(*args, **kwargs)`` and return it (see :meth:`Task.enqueue`)."""
    fields = _prepare(task, args, kwargs)
    alias = get_settings().database_alias
    if task.idempotency_key is not None:
        job, created = idempotency.enqueue_once(
            task, fields, alias, create_job=lambda: _insert(task, [fields], alias)[0]
        )
        if not created:
            return job  # the key's job; the duplicate is counted by enqueue_once
    else:
        (job,) = _insert(task, [fields], alias)
    metrics.job_enqueued(job.queue_name, job.task_name)
    _dispatch.send(signals.job_enqueued, job=job)
    return job


def bulk_enqueue(task: Task[Any, Any], calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Job]:
    """Store many jobs of one task in a single INSERT; every call is validated first."""
    if task.idempotency_key is not None:
        raise InvalidArgumentsError(
            "bulk_enqueue() does not take one idempotency key for many jobs; enqueue them one by one."
        )
    rows = [_prepare(task, args, kwargs) for args, kwargs in calls]
    if not rows:
        return []
    jobs = _insert(task, rows, get_settings().database_alias)
    metrics.job_enqueued(jobs[0].queue_name, task.name, len(jobs))
    if signals.job_enqueued.has_listeners(None):
        for job in jobs:
            _dispatch.send(signals.job_enqueued, job=job)
    return jobs
