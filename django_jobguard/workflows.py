"""Workflows: chains, groups, batches and jobs that wait for other jobs.

Everything is rows in the job database, written in the caller's transaction: a rolled-back
transaction leaves nothing of a workflow behind, and no result backend is involved.

- A step that waits is a job in status ``waiting``, with ``waiting_on`` counting its
  dependencies (:class:`~django_jobguard.models.JobDependency` rows) that have not succeeded.
  The claim reads queued rows only (its partial indexes hold nothing else), so waiting jobs
  cost no poll anything.
- Every member carries its workflow's id, returned by the claim. Whatever settles a member
  (the ack, the dead letter, a cancel) calls :func:`job_settled` in the same transaction:
  its dependents are released or cancelled, and one shard of the workflow's counters
  (:class:`~django_jobguard.models.WorkflowCounter`, picked by the job id) is updated, so
  concurrent completions rarely meet on one row.
- The completion that empties a shard locks the workflow row and sums the shards; the one
  that finds every member settled marks the workflow finished and enqueues its callbacks,
  each with a unique :class:`~django_jobguard.models.WorkflowCallback` row: exactly once,
  however the workers crash (a crash rolls the whole settling back with the ack).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

from django.db import connections, transaction
from django.db.models import Sum
from django.db.models.functions import Now

from . import enqueue, events, idempotency, store
from .conf import get_settings
from .exceptions import InvalidArgumentsError
from .models import (
    WORKFLOW_COUNTER_SHARDS,
    Job,
    JobDependency,
    JobStatus,
    Workflow,
    WorkflowCallback,
    WorkflowCounter,
    WorkflowKind,
    WorkflowState,
)
from .registry import registry
from .store import key_rows
from .task import Signature, Task

logger = logging.getLogger(__name__)

__all__ = [
    "Batch",
    "Progress",
    "add_to_counters",
    "chain",
    "enqueue_after",
    "finish_if_settled",
    "group",
    "job_settled",
    "jobs_settled",
    "replayed",
]

#: When each callback of a finished workflow runs.
CALLBACK_WHENS = ("success", "complete", "dead")

_JOB = "jobguard_job"
#: Jobs joined to their workflow per UPDATE statement.
_JOIN_CHUNK = 5000


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far a workflow is: members settled as succeeded or failed, and those pending."""

    workflow_id: int
    state: str
    total: int
    succeeded: int
    failed: int
    pending: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def progress(workflow_id: int, *, using: str | None = None) -> Progress:
    """The progress of a workflow, from its counters."""
    alias = using or get_settings().database_alias
    state = Workflow.objects.using(alias).values_list("state", flat=True).get(pk=workflow_id)
    sums = (
        WorkflowCounter.objects.using(alias)
        .filter(workflow_id=workflow_id)
        .aggregate(pending=Sum("pending"), succeeded=Sum("succeeded"), failed=Sum("failed"))
    )
    pending, succeeded, failed = (int(sums[name] or 0) for name in ("pending", "succeeded", "failed"))
    return Progress(workflow_id, state, pending + succeeded + failed, succeeded, failed, pending)


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
    return get_settings().database_alias


#: The width of ``Workflow.name``.
MAX_WORKFLOW_NAME_LENGTH = 255


def _create(alias: str, kind: str, state: str, callbacks: dict[str, Signature], name: str = "") -> Workflow:
    if not isinstance(name, str) or len(name) > MAX_WORKFLOW_NAME_LENGTH:
        raise InvalidArgumentsError(
            f"name must be a string of at most {MAX_WORKFLOW_NAME_LENGTH} characters, not "
            f"{len(name) if isinstance(name, str) else type(name).__name__}."
        )
    stored = {
        when: {"fields": signature.prepared(), "result_as": signature.result_as}
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


def add_to_counters(alias: str, workflow_id: int, changes: dict[int, tuple[int, int]]) -> None:
    """Add ``(pending, failed)`` to each shard's counters of a workflow, creating missing rows.

    One store call, its rows in shard order: two writers lock the rows they share in the
    same order, so they may wait for each other but never in a circle.
    """
    rows = [
        (workflow_id, shard, pending, 0, failed)
        for shard, (pending, failed) in sorted(changes.items())
        if pending or failed
    ]
    store.add_workflow_counts(alias, rows)


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
            from .monitoring import tracing  # an optional extra, imported only with the setting on

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
    ``.receives("name")`` gets the previous step's result as that keyword argument. A step
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
            _depend(
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
    cancelled, ``on_complete`` in both cases. ``Batch(...).enqueue(members)`` stores members
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
            if step.result_as:
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
                _maybe_finish(alias, self.id)

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
            from .monitoring import tracing

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
        _depend(alias, [JobDependency(parent_id=pk, child_id=job.pk) for pk in parents])
    job.workflow_id = workflow_id
    if unsettled:
        job.status, job.waiting_on = JobStatus.WAITING, len(unsettled)
    return job


def _depend(alias: str, links: list[JobDependency]) -> None:
    """Store dependencies and mark their parents, whose acks then look their dependants up.

    Callers hold the parents' rows (new in this transaction, or locked): a parent's ack,
    a fenced write of that row, waits for this commit and reads the mark it made.
    """
    if not links:
        return
    JobDependency.objects.using(alias).bulk_create(links)
    parents = sorted({link.parent_id for link in links})
    Job.objects.using(alias).filter(pk__in=parents, has_dependants=False).update(has_dependants=True)


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


# -- settling ------------------------------------------------------------------------------


def job_settled(
    alias: str, job_id: int, workflow_id: int, status: str, result_json: str | None = None
) -> None:
    """Account for a member that reached ``status`` (succeeded, dead or cancelled).

    Call it inside the transaction that wrote that status, so both commit or neither does.
    Dependents are released (all their dependencies succeeded) or cancelled (one of them
    failed), and so on down the graph.
    """
    jobs_settled(alias, [(job_id, workflow_id, status, result_json)])


def jobs_settled(
    alias: str,
    settled: Sequence[tuple[int, int, str, str | None]],
    *,
    parents: Collection[int] | None = None,
) -> None:
    """:func:`job_settled` for several members at once: ``(job_id, workflow_id, status, result_json)``.

    ``parents``: the members that have dependants (``Job.has_dependants`` as the write that
    settled them read it); the others' dependencies are not looked up. ``None``: look up all.

    A worker's batched ack calls it once. The counters are updated once per shard touched,
    in one order (workflow, shard) for every transaction: two acks that touch the same shards
    wait for each other at most, never in a circle (a deadlock costs PostgreSQL a second to
    detect, and the batch its retry; MariaDB/MySQL detect one at once).
    """
    counts: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])  # -> [succeeded, failed]
    work = list(settled)
    lookup = parents
    while work:
        for job_id, workflow_id, status, _ in work:
            counts[(workflow_id, job_id % WORKFLOW_COUNTER_SHARDS)][
                0 if status == JobStatus.SUCCEEDED else 1
            ] += 1
        ids = [job_id for job_id, *_ in work if lookup is None or job_id in lookup]
        # Members cancelled on the way were not read by a write that settled them: look them all up.
        lookup = None
        children: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for parent, child, name in store.workflow_children(alias, ids) if ids else ():
            children[parent].append((child, name))
        found: list[tuple[int, int, str, str | None]] = []
        for job_id, _, status, result_json in work:
            if job_id not in children:
                continue
            if status == JobStatus.SUCCEEDED:
                _release(alias, job_id, children[job_id], result_json)
            else:
                found.extend(
                    _cancel_dependents(alias, job_id, status, [child for child, _ in children[job_id]])
                )
        work = found
    # Every row touched in one store call, in (workflow, shard) order: its rows are locked
    # in that order. Every row exists (its members joined).
    rows = [
        (workflow_id, shard, -(ok + failed), ok, failed)
        for (workflow_id, shard), (ok, failed) in sorted(counts.items())
    ]
    emptied = {workflow_id for workflow_id, pending in store.add_workflow_counts(alias, rows) if pending == 0}
    for workflow_id in sorted(emptied):
        _maybe_finish(alias, workflow_id)


def _release(alias: str, parent_id: int, children: list[tuple[int, str]], result_json: str | None) -> None:
    receivers = [(child, name) for child, name in children if name]
    if receivers and result_json is not None:
        result = json.loads(result_json)
        for child, name in receivers:
            kwargs = Job.objects.using(alias).filter(pk=child).values_list("kwargs", flat=True).first()
            if kwargs is not None:
                Job.objects.using(alias).filter(pk=child, status=JobStatus.WAITING).update(
                    kwargs={**kwargs, name: result}
                )
    ids = [child for child, _ in children]
    # One statement per child set: each row's decrement is atomic under its row lock, and the
    # completion that takes the count to zero is the one that queues the job.
    with connections[alias].cursor() as cursor:
        # waiting_on last: MariaDB/MySQL apply assignments left to right, each seeing the
        # ones before it (PostgreSQL and SQLite read the old row throughout).
        cursor.execute(
            f"UPDATE {_JOB} SET status = CASE WHEN waiting_on = 1 THEN 'queued' ELSE status END, "
            f"run_after = CASE WHEN waiting_on = 1 THEN {_now(alias)} ELSE run_after END, "
            "waiting_on = waiting_on - 1 "
            f"WHERE id IN ({', '.join(['%s'] * len(ids))}) AND status = 'waiting'",
            ids,
        )


def _now(alias: str) -> str:
    return store.dialect_of(alias).CLOCK.now


def _cancel_dependents(
    alias: str, parent_id: int, status: str, children: list[int]
) -> list[tuple[int, int, str, str | None]]:
    """Cancel the waiting dependents of a parent that failed; the members to account for."""
    verb = "was dead-lettered" if status == JobStatus.DEAD else f"was {status}"
    reason = f"upstream failed: job #{parent_id} {verb}"
    rows = list(
        Job.objects.using(alias)
        .select_for_update()
        .filter(pk__in=children, status=JobStatus.WAITING)
        .values_list("pk", "workflow_id")
    )
    if not rows:
        return []
    ids = [pk for pk, _ in rows]
    Job.objects.using(alias).filter(pk__in=ids, status=JobStatus.WAITING).update(
        status=JobStatus.CANCELLED, finished_at=Now(), last_error=reason
    )
    key_rows.release_for_jobs(alias, ids)
    logger.info("jobs_upstream_failed parent=%s count=%d ids=%s", parent_id, len(ids), ids[:20])
    return [
        (pk, workflow_id, JobStatus.CANCELLED, None) for pk, workflow_id in rows if workflow_id is not None
    ]


def finish_if_settled(alias: str, workflow_id: int) -> None:
    """Finish a closed workflow whose members have all settled (callbacks enqueued once); else nothing."""
    _maybe_finish(alias, workflow_id)


def _maybe_finish(alias: str, workflow_id: int) -> None:
    """Finish the workflow if it is closed and every member settled; enqueue its callbacks once."""
    totals = store.workflow_totals(alias, workflow_id)  # locks the workflow's row, then sums
    if totals is None:
        return
    state, pending, succeeded, failed = totals
    if state != WorkflowState.CLOSED or pending:
        return
    workflow = Workflow.objects.using(alias).get(pk=workflow_id)
    Workflow.objects.using(alias).filter(pk=workflow_id, state=WorkflowState.CLOSED).update(
        state=WorkflowState.FINISHED, finished_at=Now()
    )
    summary = Progress(workflow_id, WorkflowState.FINISHED, succeeded + failed, succeeded, failed, 0)
    whens = ["complete", "dead" if failed else "success"]
    # A workflow reopened by a replay finishes again; a callback that ran already stays run.
    done = set(
        WorkflowCallback.objects.using(alias).filter(workflow_id=workflow_id).values_list("when", flat=True)
    )
    for when in whens:
        stored = workflow.callbacks.get(when)
        if stored is None or when in done:
            continue
        fields = dict(stored["fields"])
        if stored.get("result_as"):
            fields["kwargs"] = {**fields["kwargs"], stored["result_as"]: summary.as_dict()}
        (inserted,) = store.insert_jobs(alias, [fields])
        WorkflowCallback.objects.using(alias).create(workflow_id=workflow_id, when=when, job_id=inserted[0])
        events.emit(events.JobEnqueued(fields["queue_name"], fields["task_name"]))
        transaction.on_commit(
            functools.partial(events.emit, events.WorkflowCallbackEnqueued(workflow.kind, when)), using=alias
        )
        logger.info("workflow_callback workflow_id=%s when=%s job_id=%s", workflow_id, when, inserted[0])
    logger.info(
        "workflow_finished workflow_id=%s kind=%s succeeded=%d failed=%d",
        workflow_id,
        workflow.kind,
        summary.succeeded,
        failed,
    )


# -- replays -------------------------------------------------------------------------------


def replayed(alias: str, dead_job_id: int, replay_job_id: int) -> None:
    """A dead member was replayed as ``replay_job_id``: it takes the dead job's place.

    Called in the transaction that creates the replay. The replay joins the workflow in the
    dead job's stead (no longer counted failed, pending again), and the jobs cancelled as
    "upstream failed" because of it wait again, for the replay: a replayed chain step resumes
    the chain from there. A job that also waits for another failed job stays cancelled.
    """
    workflow_id = (
        Job.objects.using(alias).filter(pk=dead_job_id).values_list("workflow_id", flat=True).first()
    )
    if workflow_id is None:
        return
    Job.objects.using(alias).filter(pk=replay_job_id).update(workflow_id=workflow_id)
    moves: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # shard -> [pending, failed] changes
    moves[dead_job_id % WORKFLOW_COUNTER_SHARDS][1] -= 1
    moves[replay_job_id % WORKFLOW_COUNTER_SHARDS][0] += 1
    links = list(
        JobDependency.objects.using(alias).filter(parent_id=dead_job_id).values_list("child_id", "result_as")
    )
    _depend(alias, [JobDependency(parent_id=replay_job_id, child_id=c, result_as=name) for c, name in links])
    replaced = {dead_job_id: replay_job_id}
    restored: set[int] = set()
    frontier = [(dead_job_id, child) for child, _ in links]
    while frontier:
        parent_id, child_id = frontier.pop(0)
        row = (
            Job.objects.using(alias)
            .filter(pk=child_id)
            .values_list("status", "last_error", "workflow_id")
            .first()
        )
        if row is None or child_id in restored:
            continue
        status, last_error, child_workflow = row
        if status != JobStatus.CANCELLED or not last_error.startswith(f"upstream failed: job #{parent_id} "):
            continue
        parents = list(
            JobDependency.objects.using(alias).filter(child_id=child_id).values_list("parent_id", flat=True)
        )
        parents = sorted({replaced.get(pk, pk) for pk in parents})
        states = dict(Job.objects.using(alias).filter(pk__in=parents).values_list("pk", "status"))
        if any(
            states.get(pk) in (JobStatus.DEAD, JobStatus.CANCELLED) and pk not in restored for pk in parents
        ):
            continue  # it also waits for a job that failed and was not replayed
        waiting_on = sum(1 for pk in parents if states.get(pk) != JobStatus.SUCCEEDED or pk in restored)
        Job.objects.using(alias).filter(pk=child_id, status=JobStatus.CANCELLED).update(
            status=JobStatus.WAITING,
            waiting_on=waiting_on,
            finished_at=None,
            last_error=f"waiting again: job #{dead_job_id} was replayed as job #{replay_job_id}",
        )
        restored.add(child_id)
        if child_workflow is not None:
            moves[child_id % WORKFLOW_COUNTER_SHARDS][1] -= 1
            moves[child_id % WORKFLOW_COUNTER_SHARDS][0] += 1
        frontier.extend(
            (child_id, grandchild)
            for grandchild in JobDependency.objects.using(alias)
            .filter(parent_id=child_id)
            .values_list("child_id", flat=True)
        )
    # The replay's shard may have no row yet.
    add_to_counters(
        alias, workflow_id, {shard: (pending, failed) for shard, (pending, failed) in moves.items()}
    )
    Workflow.objects.using(alias).filter(pk=workflow_id, state=WorkflowState.FINISHED).update(
        state=WorkflowState.CLOSED, finished_at=None
    )
    logger.info(
        "workflow_member_replayed workflow_id=%s dead_job_id=%s job_id=%s waiting_again=%d",
        workflow_id,
        dead_job_id,
        replay_job_id,
        len(restored),
    )
