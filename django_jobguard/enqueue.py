"""Bind and validate arguments, dedupe by idempotency key, insert the job row.

Enqueue runs on ``JOBGUARD["DATABASE_ALIAS"]`` inside whatever transaction the caller
has open there: a rolled-back transaction leaves no job behind. On PostgreSQL a trigger
(see the migrations) notifies idle workers when the row commits.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.db import transaction

from . import _dispatch, events, idempotency, signals, store
from ._json import validate_payload
from .conf import get_settings
from .encryption.payloads import seals
from .exceptions import IdempotencyConflict, InvalidArgumentsError, TaskNotExposedError, UnknownQueueError
from .registry import registry
from .task import MAX_IDEMPOTENCY_KEY_LENGTH

if TYPE_CHECKING:
    from .models import Job
    from .task import Task

__all__ = [
    "bulk_enqueue",
    "enqueue",
    "enqueue_exposed",
    "insert_prepared",
    "prepare",
    "validate_payload",
]

MAX_QUEUE_NAME_LENGTH = 100
#: Keys sent through the API are stored as ``api:<caller>:<key>``, apart from the application's.
API_KEY_PREFIX = "api:"


def prepare(task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The job row of one call, from everything about it that does not touch the database.

    The fields :func:`~django_jobguard.store.insert_jobs` takes (a replay builds its job from
    them too). Every check that can refuse the call runs here, before anything is written, and raises
    :class:`InvalidArgumentsError` (a refused queue: :class:`UnknownQueueError`).
    """
    bound = task.bind(args, kwargs)
    clean_args, clean_kwargs = validate_payload(args, kwargs)
    conf = get_settings()
    queue_name = task.queue_name or conf.default_queue
    if len(queue_name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidArgumentsError(f"queue_name must be at most {MAX_QUEUE_NAME_LENGTH} characters.")
    refusal = conf.undeclared_queue(queue_name)
    if refusal is not None:
        raise UnknownQueueError(f"{task.name}: {refusal}")
    queue = conf.queue(queue_name)
    if task.limited:
        _check_limited_routing(task, queue_name, conf.default_queue)
    fields = {
        "task_name": task.name,
        "queue_name": queue_name,
        "args": clean_args,
        "kwargs": clean_kwargs,
        "priority": task.priority,
        "max_attempts": task.max_attempts or queue.max_attempts,
        "visibility_timeout": task.visibility_timeout or queue.visibility_timeout,
        "lock_key": task.lock_key_for(bound),
        "handler_version": task.handler_version or conf.handler_version,
        "idempotency_key": task.idempotency_key_for(bound),
        "flow_keys": task.flow_keys_for(bound),
    }
    if conf.opentelemetry:
        fields["trace_context"] = _tracing().carrier()
    if (task.encrypt or conf.encryption.all_tasks) and store.memory_store() is None:
        # Kept in clear here (the idempotency fingerprint and the returned Job read them);
        # the store seals them as it writes the row. The in-memory store (tests) keeps them clear.
        fields["encrypt"] = seals(task, conf)
    return fields


def _tracing() -> ModuleType:
    """:mod:`django_jobguard.monitoring.tracing`, imported only when ``OPENTELEMETRY`` is on.

    It imports OpenTelemetry, an optional extra: a project without it never loads it.
    """
    from .monitoring import tracing

    return tracing


def _check_limited_routing(task: Task[Any, Any], queue_name: str, default_queue: str) -> None:
    """Refuse a limited task's job sent to a queue where its limits would not be enforced.

    Workers take the limited claim only on the queues that can hold limited jobs (those
    of limited tasks and those with a concurrency), so the others keep the plain claim.
    """
    declared = registry.find(task.name)
    if declared is not None and queue_name == (declared.queue_name or default_queue):
        return  # the task's own queue: the common case, decided without building the plan
    plan = registry.flow_plan()
    if plan is not None and queue_name in plan.queues:
        return
    raise InvalidArgumentsError(
        f"{task.name} has flow-control limits, which workers enforce on the queues of limited "
        f"tasks and on queues with a concurrency; {queue_name!r} is neither, so its job would "
        f"run unlimited. Send it to {task.queue_name!r}, or give {queue_name!r} a concurrency "
        "in JOBGUARD['QUEUES']."
    )


def insert_prepared(task: Task[Any, Any], rows: list[dict[str, Any]], alias: str) -> list[Job]:
    """Insert prepared ``rows`` (see :func:`prepare`) as saved ``Job`` instances (no second query)."""
    inserted = store.insert_jobs(alias, rows, task.run_after)
    return [store.build_job(alias, fields, row) for fields, row in zip(rows, inserted, strict=True)]


def enqueue(task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Job:
    """Store one job for ``task(*args, **kwargs)`` and return it (see :meth:`Task.enqueue`)."""
    return _enqueue(task, args, kwargs)[0]


def enqueue_exposed(
    task_name: str,
    args: Any,
    kwargs: Any,
    *,
    queue_name: str | None = None,
    priority: int | None = None,
    run_after: datetime.datetime | None = None,
    idempotency_key: str | None = None,
    caller: str | None = None,
    may_view_payload: bool = True,
) -> tuple[Job, bool]:
    """Enqueue a task by name for a caller outside this code (the REST API): ``(job, created)``.

    Keys: a task whose ``@task(idempotency_key=...)`` template derives its key from the
    arguments always keys by that template; a caller's ``idempotency_key`` must then equal
    the rendered key (or be left out), else :class:`InvalidArgumentsError`. For any other task
    the caller's key is kept in the caller's own namespace (``api:<caller>:<key>``), so it can
    never claim a key the application derives, nor meet another caller's. A repeat onto a
    job that has not run yet must also ask for the same ``run_after``.

    Only tasks declared ``@task(api=True)`` are accepted (:class:`UnknownTaskError` for a
    name not registered, :class:`TaskNotExposedError` for one not opted in). A caller's job
    goes to the task's queue at the task's priority or lower, unless the task opts in to more
    (``@task(api={"queue_name": True, "max_priority": 50})``). ``created`` is
    False when ``idempotency_key`` already names a job with the same arguments: that job is
    returned. The same key with other arguments, or with another ``queue_name`` or
    ``priority`` than its job, raises :class:`IdempotencyConflict`. Nothing is written on
    any error.

    A key from the task's template is shared with every other enqueue of that action (the
    application's, other callers'). For a ``caller`` without ``may_view_payload``, any repeat
    of such a key whose job exists raises the same :class:`IdempotencyConflict`, whether or
    not the arguments, schedule, queue or priority match: a 200 for the right arguments and a
    409 for the wrong ones would let a caller guess another caller's arguments one try at a
    time, and the job returned would be someone else's.
    """
    task = registry.get(task_name)
    if not task.api:
        raise TaskNotExposedError(
            f"Task {task_name!r} is not exposed to the API; declare it with @task(api=True) to allow it."
        )
    if not isinstance(args, list | tuple):
        raise InvalidArgumentsError(f"args must be a JSON array, not {type(args).__name__}.")
    if not isinstance(kwargs, Mapping):
        raise InvalidArgumentsError(f"kwargs must be a JSON object, not {type(kwargs).__name__}.")
    _check_api_routing(task, queue_name, priority)
    known = get_settings().known_queues
    if queue_name is not None and queue_name != task.queue_name and queue_name not in known:
        # Even where Python code may name queues freely: a caller's free-form names would
        # each add metric series and health-page rows.
        raise InvalidArgumentsError(
            f"queue_name: {queue_name!r} is not a declared queue. Through the API a job goes to its "
            f"task's queue or to one of: {', '.join(known)}."
        )
    key = _api_key(task, args, kwargs, idempotency_key, caller)
    call = task.using(queue_name=queue_name, priority=priority, run_after=run_after, idempotency_key=key)
    # A template's key meets other enqueues' jobs: a caller who may not read payloads learns
    # only that the action has a job, never whether its arguments are the ones it sent.
    shared = key is None and task.idempotency_key_template is not None
    hidden = shared and caller is not None and not may_view_payload
    try:
        job, created = _enqueue(call, args, kwargs)
    except IdempotencyConflict as exc:
        if hidden:
            raise _taken(exc.key, exc.scope) from None
        if key is None or key == idempotency_key:
            raise
        # Name the key the caller sent, not its namespaced form.
        raise type(exc)(str(idempotency_key), exc.scope, exc.used) from None
    if hidden and not created:
        raise _taken(str(job.idempotency_key), idempotency.scope_of(task))
    wanted = (call.queue_name or get_settings().default_queue, call.priority)
    if not created and (job.queue_name, job.priority) != wanted:
        raise IdempotencyConflict(
            str(idempotency_key),
            idempotency.scope_of(task),
            f"for job #{job.pk} on queue {job.queue_name!r} with priority {job.priority}",
        )
    if not created and job.attempts == 0 and job.status == "queued" and not _same_run_after(job, run_after):
        # Before its first run the job's run_after is still the one it was asked for; after
        # it, retries move it, so only a job not yet run can be compared.
        raise IdempotencyConflict(
            str(idempotency_key),
            idempotency.scope_of(task),
            f"for job #{job.pk}, which is to run after {job.run_after.isoformat()}",
        )
    return job, created


def _taken(key: str, scope: str) -> IdempotencyConflict:
    """The one answer to a repeat of a shared key by a caller who may not read payloads."""
    return IdempotencyConflict(
        key,
        scope,
        "by a job that already stands for this action (whether its arguments are these is shown "
        "only to users with jobguard.view_payload)",
    )


def _check_api_routing(task: Task[Any, Any], queue_name: str | None, priority: int | None) -> None:
    """Refuse a queue or priority the task does not let API callers choose.

    A caller who may enqueue could otherwise put its jobs ahead of everyone's (priority 100)
    or on a queue served by other workers; both are the task author's to allow.
    """
    own_queue = task.queue_name or get_settings().default_queue
    if queue_name is not None and queue_name != own_queue and not task.api_queue_name:
        raise InvalidArgumentsError(
            f"queue_name: {task.name} runs on its own queue, {own_queue!r}; its author has not let "
            "API callers choose another (@task(api={'queue_name': True}))."
        )
    ceiling = task.priority if task.api_max_priority is None else task.api_max_priority
    if priority is not None and priority > ceiling:
        raise InvalidArgumentsError(
            f"priority: at most {ceiling} for {task.name} through the API, not {priority} "
            "(@task(api={'max_priority': ...}) raises the ceiling)."
        )


#: A repeat asked for no run_after matches a job due within this many seconds of its enqueue.
_UNSCHEDULED_SLACK_SECONDS = 1.0


def _same_run_after(job: Job, run_after: datetime.datetime | None) -> bool:
    if run_after is None:
        return (job.run_after - job.enqueued_at).total_seconds() <= _UNSCHEDULED_SLACK_SECONDS
    return job.run_after == run_after


def _api_key(
    task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any], key: str | None, caller: str | None
) -> str | None:
    """The idempotency key an API call enqueues with (see :func:`enqueue_exposed`)."""
    if key is None:
        return None
    if task.idempotency_key_template is not None:
        rendered = task.idempotency_key_for(task.bind(args, kwargs))
        if key != rendered:
            raise InvalidArgumentsError(
                f"idempotency_key: {task.name} derives its key from its arguments "
                f"({task.idempotency_key_template!r}); send no Idempotency-Key, or exactly the key "
                "those arguments give."
            )
        return None  # the template applies, as for every other enqueue of this task
    if caller is None:
        return key
    scoped = f"{API_KEY_PREFIX}{caller}:{key}"
    if len(scoped) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise InvalidArgumentsError(
            f"idempotency_key: at most {MAX_IDEMPOTENCY_KEY_LENGTH - len(scoped) + len(key)} characters "
            "for this caller (the key is stored in the caller's own namespace)."
        )
    return scoped


def _enqueue(task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Job, bool]:
    conf = get_settings()
    if conf.opentelemetry:
        return _enqueue_traced(task, args, kwargs)
    fields = prepare(task, args, kwargs)
    return _store_one(task, fields, conf.database_alias)


def _enqueue_traced(task: Task[Any, Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Job, bool]:
    """:func:`_enqueue` in a producer span, whose context the job stores (see tracing)."""
    tracing = _tracing()
    queue_name = task.queue_name or get_settings().default_queue
    with tracing.enqueue_span(task.name, queue_name) as span:
        fields = prepare(task, args, kwargs)
        job, created = _store_one(task, fields, get_settings().database_alias)
        tracing.record_enqueued(span, job, created)
    return job, created


def _store_one(task: Task[Any, Any], fields: dict[str, Any], alias: str) -> tuple[Job, bool]:
    """Insert one prepared job, deduped by its key: ``(job, created)``; announce a new job."""
    if fields["idempotency_key"] is not None:
        job, created = idempotency.enqueue_once(
            task, fields, alias, create_job=lambda: insert_prepared(task, [fields], alias)[0]
        )
        if not created:
            return job, False  # the key's job; the duplicate is counted by enqueue_once
    else:
        (job,) = insert_prepared(task, [fields], alias)
    events.emit(events.JobEnqueued(job.queue_name, job.task_name))
    _dispatch.send(signals.job_enqueued, job=job)
    return job, True


def bulk_enqueue(task: Task[Any, Any], calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Job]:
    """Store many jobs of one task in a single INSERT; every call is validated first.

    A task with an ``idempotency_key`` template gives each call its own key, so its jobs
    are stored one by one (each deduped by its key), in one transaction.
    """
    if task.idempotency_key is not None:
        raise InvalidArgumentsError(
            "bulk_enqueue() does not take one idempotency key for many jobs; enqueue them one by one."
        )
    pending = list(calls)
    if not pending:
        return []
    conf = get_settings()
    if conf.opentelemetry:
        with _tracing().enqueue_span(task.name, task.queue_name or conf.default_queue) as span:
            jobs = _bulk_insert(task, pending, conf.database_alias)
            span.set_attribute("messaging.batch.message_count", len(jobs))
            return jobs
    return _bulk_insert(task, pending, conf.database_alias)


def _bulk_insert(
    task: Task[Any, Any], calls: list[tuple[Sequence[Any], Mapping[str, Any]]], alias: str
) -> list[Job]:
    rows = [prepare(task, args, kwargs) for args, kwargs in calls]
    if task.idempotency_key_template is not None:
        with transaction.atomic(using=alias):
            return [_store_one(task, fields, alias)[0] for fields in rows]
    jobs = insert_prepared(task, rows, alias)
    events.emit(events.JobEnqueued(jobs[0].queue_name, task.name, len(jobs)))
    if signals.job_enqueued.has_listeners(None):
        for job in jobs:
            _dispatch.send(signals.job_enqueued, job=job)
    return jobs
