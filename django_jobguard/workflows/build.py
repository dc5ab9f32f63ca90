"""Building workflows: chains, groups, batches, and a job enqueued to wait for others (``after=``).

Each verb writes its rows in the caller's transaction: the jobs (the first steps queued,
the others ``waiting`` with ``waiting_on`` counting their dependencies), the workflow row,
its members' counters and the dependencies (:mod:`.bookkeeping`). What a member's end does
is :mod:`.settle`'s; a batch closed once every member settled finishes there at once.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from django.db import transaction
from django.db.models.functions import Now

from .. import enqueue, events, idempotency, store
from ..conf import get_settings
from ..encryption.payloads import ARGS, KWARGS, seal_json
from ..exceptions import InvalidArgumentsError
from ..models import (
    WORKFLOW_COUNTER_SHARDS,
    Job,
    JobDependency,
    JobStatus,
    Workflow,
    WorkflowKind,
    WorkflowState,
)
from ..registry import registry
from ..task import Signature, Task
from .bookkeeping import Progress, add_to_counters, depend, progress
from .settle import finish_if_settled

# The workflows' logger, shared with settling (see the loggers reference).
logger = logging.getLogger("django_jobguard.workflows")

__all__ = ["CALLBACK_WHENS", "MAX_WORKFLOW_NAME_LENGTH", "Batch", "chain", "enqueue_after", "group"]

#: When each callback of a finished workflow runs.
CALLBACK_WHENS = ("success", "complete", "dead")

#: Jobs joined to their workflow per UPDATE statement.
_JOIN_CHUNK = 5000


# -- building ------------------------------------------------------------------------------


def _steps(steps: Iterable[Any], what: str) -> list[Signature]:
    out = list(steps)
    for step in out:
        if not isinstance(step, Signature):
            raise InvalidArgumentsError(
                f"{what}: {step!r} is not a step; make one with task.s(...) (a task bound to its arguments)."
            )
    return out


def _callback(value: Any, when: str) -> Signature | None:
    if value is None:
        return None
    if not isinstance(value, Signature):
        raise InvalidArgumentsError(
            f"on_{when}: {value!r} is not a registered task's step; make one with task.s(...)."
        )
    _check_registered(value.task)
    return value


def _check_registered(task: Task[Any, Any]) -> None:
    if not _same_task(registry.find(task.name), task):
        raise InvalidArgumentsError(
            f"{task.name} is not a registered task: a worker could not run it. Declare it with @task "
            "in a module the app loads (tasks.py)."
        )


def _same_task(registered: Task[Any, Any] | None, task: Task[Any, Any]) -> bool:
    # using() copies a task; a copy of the registered one is the same task.
    return registered is not None and registered.func is task.func


def _alias() -> str:
    alias = get_settings().database_alias
    # Their rows (workflow, counters, dependencies) are the database's alone.
    store.needs_database(alias, "Workflows (chain, group, Batch, after=)")
    return alias


#: The width of ``Workflow.name``.
MAX_WORKFLOW_NAME_LENGTH = 255


def _sealed_callback(fields: dict[str, Any]) -> dict[str, Any]:
    """A callback's prepared row as the workflow keeps it: its arguments sealed when its task
    encrypts (the store seals them again, for the job, when the callback is enqueued)."""
    if fields.get("encrypt"):
        fields = {
            **fields,
            "args": seal_json(fields["args"], ARGS),
            "kwargs": seal_json(fields["kwargs"], KWARGS),
        }
    return fields


def _create(alias: str, kind: str, state: str, callbacks: dict[str, Signature], name: str = "") -> Workflow:
    if not isinstance(name, str) or len(name) > MAX_WORKFLOW_NAME_LENGTH:
        raise InvalidArgumentsError(
            f"name must be a string of at most {MAX_WORKFLOW_NAME_LENGTH} characters, not "
            f"{len(name) if isinstance(name, str) else type(name).__name__}."
        )
    stored = {
        when: {
            "fields": _sealed_callback(signature.prepared()),
            "result_as": signature.result_as,
            "results_as": signature.results_as,
        }
        for when, signature in callbacks.items()
    }
    workflow = Workflow.objects.using(alias).create(
        kind=kind,
        state=state,
        name=name,
        callbacks=stored,
        closed_at=None if state == WorkflowState.OPEN else Now(),
    )
    return workflow  # its counter rows are written as members join (add_to_counters)


def _insert(alias: str, steps: Sequence[Signature], rows: Sequence[dict[str, Any]]) -> list[Job]:
    """Insert the steps' jobs (queued), in order; keyed ones through their key."""
    jobs: list[Job] = []
    plain: list[tuple[int, Signature, dict[str, Any]]] = []

    def flush() -> None:
        # Consecutive plain rows of one run_after go in one INSERT.
        while plain:
            run_after = plain[0][1].task.run_after
            same = [item for item in plain if item[1].task.run_after == run_after]
            inserted = enqueue.insert_prepared(same[0][1].task, [fields for _, _, fields in same], alias)
            for (index, _, _), job in zip(same, inserted, strict=True):
                placed[index] = job
            plain[:] = [item for item in plain if item[1].task.run_after != run_after]

    placed: dict[int, Job] = {}
    for index, (step, fields) in enumerate(zip(steps, rows, strict=True)):
        if fields["idempotency_key"] is None:
            plain.append((index, step, fields))
            continue
        flush()
        job, created = idempotency.enqueue_once(
            step.task,
            fields,
            alias,
            create_job=functools.partial(_insert_one, step.task, fields, alias),
        )
        if not created:
            raise InvalidArgumentsError(
                f"{step.task.name}: idempotency key {fields['idempotency_key']!r} already belongs to job "
                f"#{job.pk}; a workflow step must be a new job (nothing was enqueued)."
            )
        placed[index] = job
    flush()
    jobs = [placed[index] for index in range(len(rows))]
    for step, job in zip(steps, jobs, strict=True):
        events.emit(events.JobEnqueued(job.queue_name, step.task.name))
    return jobs


def _insert_one(task: Task[Any, Any], fields: dict[str, Any], alias: str) -> Job:
    return enqueue.insert_prepared(task, [fields], alias)[0]


def _join(
    alias: str, workflow_id: int, job_ids: Sequence[int], waiting: dict[int, int], adopt: Sequence[int] = ()
) -> None:
    """Count the jobs as pending members of the workflow; ``waiting``: id → waiting_on.

    New members are inserted with their ``workflow_id``; ``adopt`` names jobs stored before
    (a dependency's parents), whose rows are updated to join.
    """
    if not job_ids:
        return
    # In chunks: a statement's parameters are bounded (SQLite's, and any driver's binding).
    for start in range(0, len(adopt), _JOIN_CHUNK):
        chunk = adopt[start : start + _JOIN_CHUNK]
        Job.objects.using(alias).filter(pk__in=chunk).update(workflow_id=workflow_id)
    by_count: dict[int, list[int]] = defaultdict(list)
    for job_id, count in waiting.items():
        by_count[count].append(job_id)
    for count, ids in by_count.items():
        for start in range(0, len(ids), _JOIN_CHUNK):
            Job.objects.using(alias).filter(pk__in=ids[start : start + _JOIN_CHUNK]).update(
                status=JobStatus.WAITING, waiting_on=count
            )
    per_shard: dict[int, int] = defaultdict(int)
    for job_id in job_ids:
        per_shard[job_id % WORKFLOW_COUNTER_SHARDS] += 1
    add_to_counters(alias, workflow_id, {shard: (count, 0) for shard, count in per_shard.items()})
    for job_id in waiting:
        _note(job_id, waiting[job_id])


_Verb = TypeVar("_Verb", bound=Callable[..., Any])


def _traced(operation: str, kind: str | None = None) -> Callable[[_Verb], _Verb]:
    """Run a verb in the workflow's producer span when tracing is on (see :mod:`.monitoring.tracing`).

    Its jobs store that span as their enqueue, so every member's run links to it. ``kind``
    None: the verb is a :class:`Batch` method, whose own kind (batch or group) is used.
    """

    def decorate(verb: _Verb) -> _Verb:
        @functools.wraps(verb)
        def traced(*args: Any, **kwargs: Any) -> Any:
            if not get_settings().opentelemetry:
                return verb(*args, **kwargs)
            from ..monitoring import tracing  # an optional extra, imported only with the setting on

            with tracing.workflow_span(operation, kind or args[0].kind) as span:
                result = verb(*args, **kwargs)
                if isinstance(result, Workflow):  # a chain
                    tracing.record_workflow(span, result.pk, len(getattr(result, "jobs", ())))
                elif isinstance(result, Job):  # a job with after=
                    tracing.record_workflow(span, result.workflow_id, 1)
                else:  # Batch.open / enqueue (the batch), Batch.add (its new members)
                    tracing.record_workflow(span, args[0].id, len(result) if isinstance(result, list) else 0)
            return result

        return traced  # type: ignore[return-value]

    return decorate


def _note(job_id: int, count: int) -> None:
    logger.debug("job_waiting job_id=%s dependencies=%d", job_id, count)


# -- chains --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, init=False)
class chain:  # noqa: N801 - named like the other verbs users write (group, task)
    """Steps that run one after another, each once the previous one succeeded.

    ``chain(charge.s(order_id=1), reserve.s(order_id=1)).enqueue()`` stores every step in
    the caller's transaction; the first is queued, the others wait. A step made with
    ``.receives("name")`` gets the previous step's result as that keyword argument, with
    ``.receives()`` as its first positional argument. A step
    that is dead-lettered (or cancelled) cancels the rest ("upstream failed").
    """

    steps: tuple[Signature, ...]

    def __init__(self, *steps: Signature) -> None:
        if len(steps) == 1 and not isinstance(steps[0], Signature) and isinstance(steps[0], Iterable):
            steps = tuple(steps[0])
        object.__setattr__(self, "steps", tuple(_steps(steps, "chain")))
        if not self.steps:
            raise InvalidArgumentsError("chain() needs at least one step (task.s(...)); it was given none.")
        if self.steps[0].result_as:
            raise InvalidArgumentsError(
                f"{self.steps[0].task.name}: the first step of a chain has no previous result to receive."
            )
        for step in self.steps:
            if step.results_as:
                raise InvalidArgumentsError(
                    f"{step.task.name}: a chain step has no members' results to receive; "
                    "receives_results() is for a group's or batch's callback (use receives())."
                )

    @_traced("enqueue", WorkflowKind.CHAIN)
    def enqueue(self, *, name: str = "") -> Workflow:
        """Store the chain (joining the caller's transaction); its workflow, with ``jobs`` set."""
        rows = [step.prepared() for step in self.steps]  # every check before any write
        alias = _alias()
        with transaction.atomic(using=alias):
            workflow = _create(alias, WorkflowKind.CHAIN, WorkflowState.CLOSED, {}, name)
            for fields in rows:
                fields["workflow_id"] = workflow.pk
            jobs = _insert(alias, self.steps, rows)
            ids = [job.pk for job in jobs]
            _join(alias, workflow.pk, ids, dict.fromkeys(ids[1:], 1))
            depend(
                alias,
                [
                    JobDependency(parent_id=parent, child_id=child, result_as=step.result_as)
                    for parent, child, step in zip(ids, ids[1:], self.steps[1:], strict=False)
                ],
            )
        for job in jobs[1:]:
            job.status, job.waiting_on = JobStatus.WAITING, 1
        for job in jobs:
            job.workflow_id = workflow.pk
        workflow.jobs = jobs  # type: ignore[attr-defined]
        return workflow


# -- groups and batches --------------------------------------------------------------------


class Batch:
    """Jobs settled together, with callbacks run exactly once when the last one settles.

    ``on_success`` runs if every member succeeded, ``on_dead`` if any was dead-lettered or
    cancelled, ``on_complete`` in both cases. A callback made with ``.receives("name")`` gets
    the workflow's summary, with ``.receives_results("name")`` its members' results (a list in
    member order, read when it is enqueued). ``Batch(...).enqueue(members)`` stores members
    and closes the batch in one go; ``open()``, ``add()`` (any number of times, from any
    transaction) and ``close()`` build one up: no callback runs before it is closed.
    """

    def __init__(
        self,
        *,
        on_success: Signature | None = None,
        on_complete: Signature | None = None,
        on_dead: Signature | None = None,
        name: str = "",
        kind: str = WorkflowKind.BATCH,
    ) -> None:
        found = {
            "success": _callback(on_success, "success"),
            "complete": _callback(on_complete, "complete"),
            "dead": _callback(on_dead, "dead"),
        }
        self.callbacks = {when: sig for when, sig in found.items() if sig is not None}
        for signature in self.callbacks.values():
            signature.prepared()  # a callback whose arguments do not bind fails here
        self.name = name
        self.kind = kind
        self.id: int | None = None

    @classmethod
    def get(cls, workflow_id: int) -> Batch:
        """A handle on a stored batch (to add members, close it or read its progress)."""
        row = Workflow.objects.using(_alias()).get(pk=workflow_id)
        batch = cls(name=row.name, kind=row.kind)
        batch.id = row.pk
        return batch

    @_traced("open")
    def open(self) -> Batch:
        """Store the batch, open: members may be added until :meth:`close`."""
        if self.id is not None:
            raise InvalidArgumentsError(f"batch #{self.id} is stored already.")
        self.id = _create(_alias(), self.kind, WorkflowState.OPEN, self.callbacks, self.name).pk
        return self

    @_traced("add")
    def add(self, members: Iterable[Signature]) -> list[Job]:
        """Enqueue members of this open batch (joining the caller's transaction)."""
        if self.id is None:
            raise InvalidArgumentsError("open() the batch (or enqueue() it) before adding members.")
        steps = _steps(members, "batch member")
        for step in steps:
            if step.result_as or step.results_as:
                raise InvalidArgumentsError(
                    f"{step.task.name}: a batch member has no previous result to receive."
                )
        rows = [step.prepared() for step in steps]
        if not rows:
            return []
        for fields in rows:
            fields["workflow_id"] = self.id
        alias = _alias()
        with transaction.atomic(using=alias):
            # Counters first, the workflow row after: the order an ack takes them in, so an add
            # and an ack never wait for each other in a circle. Refused (rolled back) unless
            # still open once the row is locked; a close waits for this add, or refuses it.
            jobs = _insert(alias, steps, rows)
            _join(alias, self.id, [job.pk for job in jobs], {})
            state = (
                Workflow.objects.using(alias)
                .select_for_update()
                .values_list("state", flat=True)
                .get(pk=self.id)
            )
            if state != WorkflowState.OPEN:
                raise InvalidArgumentsError(f"batch #{self.id} is {state}: it accepts no more members.")
        for job in jobs:
            job.workflow_id = self.id
        return jobs

    def close(self) -> None:
        """No more members: the callbacks run once every member has settled (now, if they have)."""
        if self.id is None:
            raise InvalidArgumentsError("the batch is not stored; enqueue() it.")
        alias = _alias()
        with transaction.atomic(using=alias):
            updated = (
                Workflow.objects.using(alias)
                .filter(pk=self.id, state=WorkflowState.OPEN)
                .update(state=WorkflowState.CLOSED, closed_at=Now())
            )
            if updated:
                finish_if_settled(alias, self.id)

    @_traced("enqueue")
    def enqueue(self, members: Iterable[Signature]) -> Batch:
        """Store the batch with its members, closed (joining the caller's transaction)."""
        steps = _steps(members, "batch member")
        if not steps:
            raise InvalidArgumentsError("a batch needs at least one member (task.s(...)); it was given none.")
        with transaction.atomic(using=_alias()):
            self.open()
            self.add(steps)
            self.close()
        return self

    def progress(self) -> Progress:
        if self.id is None:
            raise InvalidArgumentsError("the batch is not stored yet.")
        return progress(self.id)


def group(members: Iterable[Signature], *, then: Signature | None = None, name: str = "") -> Batch:
    """Members that run side by side; ``then`` runs once, after every one of them succeeded.

    Returns the :class:`Batch` not yet stored: ``group([...], then=report.s()).enqueue()``.
    """
    steps = _steps(members, "group member")
    batch = _GroupBatch(steps, on_success=then, name=name, kind=WorkflowKind.GROUP)
    return batch


class _GroupBatch(Batch):
    def __init__(self, steps: list[Signature], **options: Any) -> None:
        super().__init__(**options)
        self._steps = steps

    def enqueue(self, members: Iterable[Signature] | None = None) -> Batch:
        return super().enqueue(self._steps if members is None else members)


# -- dependencies --------------------------------------------------------------------------


@_traced("enqueue", WorkflowKind.GRAPH)
def enqueue_after(task: Task[Any, Any], args: Sequence[Any], kwargs: Any) -> Job:
    """Enqueue one job that waits for ``task.after`` (see :meth:`Task.using`)."""
    fields = enqueue.prepare(task, args, kwargs)
    step = Signature(dataclasses.replace(task, after=()), tuple(args), dict(kwargs))
    parents = list(task.after)
    alias = _alias()
    with transaction.atomic(using=alias):
        rows = list(
            Job.objects.using(alias)
            .select_for_update()
            .filter(pk__in=parents)
            .values_list("pk", "status", "workflow_id", "trace_context")
        )
        found = {pk: (status, workflow_id) for pk, status, workflow_id, _ in rows}
        missing = [pk for pk in parents if pk not in found]
        if missing:
            raise InvalidArgumentsError(f"after: no job #{missing[0]}; nothing was enqueued.")
        for pk in parents:
            status, workflow_id = found[pk]
            if status in (JobStatus.DEAD, JobStatus.CANCELLED):
                raise InvalidArgumentsError(
                    f"after: job #{pk} is {status}, so a job waiting for it would never run; "
                    "nothing was enqueued."
                )
            if status == JobStatus.RUNNING and workflow_id is None:
                raise InvalidArgumentsError(
                    f"after: job #{pk} is already running outside any workflow, so its end cannot release "
                    "another job; declare dependencies before it starts (in the transaction that "
                    "enqueues it)."
                )
        if "trace_context" in fields:  # tracing on: its run links to its parents' enqueues too
            from ..monitoring import tracing

            contexts = {pk: context for pk, _, _, context in rows}
            fields["trace_context"] = tracing.with_parents(
                fields["trace_context"], [contexts[pk] for pk in parents]
            )
        if fields["idempotency_key"] is not None:
            job, created = idempotency.enqueue_once(
                task, fields, alias, create_job=lambda: enqueue.insert_prepared(task, [fields], alias)[0]
            )
            if not created:
                if job.pk in _ancestors(alias, parents):
                    raise InvalidArgumentsError(
                        f"after: this call's idempotency key names job #{job.pk}, which it would wait for: "
                        "a dependency cycle; nothing was enqueued."
                    )
                return job  # the key's job, as any repeat of a keyed enqueue
            (job,) = [job]
        else:
            (job,) = _insert(alias, [step], [fields])
        # A graph of its own: joining another workflow would lock that workflow's row before
        # its counters, the reverse of an ack's order.
        workflow_id = _create(alias, WorkflowKind.GRAPH, WorkflowState.CLOSED, {}).pk
        unsettled = [pk for pk in parents if found[pk][0] != JobStatus.SUCCEEDED]
        newcomers = [pk for pk in unsettled if found[pk][1] is None]
        joining = [*newcomers, job.pk]
        _join(alias, workflow_id, joining, {job.pk: len(unsettled)} if unsettled else {}, adopt=joining)
        depend(alias, [JobDependency(parent_id=pk, child_id=job.pk) for pk in parents])
    job.workflow_id = workflow_id
    if unsettled:
        job.status, job.waiting_on = JobStatus.WAITING, len(unsettled)
    return job


def _ancestors(alias: str, parents: list[int]) -> set[int]:
    """The jobs ``parents`` wait for, directly or not, and the parents themselves."""
    seen = set(parents)
    frontier = list(parents)
    while frontier:
        above = list(
            JobDependency.objects.using(alias)
            .filter(child_id__in=frontier)
            .values_list("parent_id", flat=True)
        )
        frontier = [pk for pk in above if pk not in seen]
        seen.update(frontier)
    return seen
