"""Settling: what a member's end does to its workflow, and a dead member's replay.

Whatever settles a member (the ack, the dead letter, a cancel) calls :func:`job_settled`
in the same transaction: its dependants are released or cancelled, and one shard of the
workflow's counters is updated. The completion that empties a shard locks the workflow row
and sums the shards; the one that finds every member settled marks the workflow finished
and enqueues its callbacks, each with a unique
:class:`~django_jobguard.models.WorkflowCallback` row: exactly once, however the workers
crash (a crash rolls the whole settling back with the ack).
"""

from __future__ import annotations

import functools
import json
import logging
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any

from django.db import transaction
from django.db.models.functions import Now, Substr

from .. import events, store
from ..encryption import is_encrypted
from ..encryption.payloads import ARGS, ERROR, KWARGS, RESULT, open_json, open_text, seal_json
from ..models import (
    WORKFLOW_COUNTER_SHARDS,
    DeadLetter,
    Job,
    JobDependency,
    JobStatus,
    Workflow,
    WorkflowCallback,
    WorkflowState,
)
from ..store import dependants, key_rows
from ..task import POSITIONAL
from .bookkeeping import Progress, add_to_counters, depend

# The workflows' logger, shared with building (see the loggers reference).
logger = logging.getLogger("django_jobguard.workflows")

__all__ = [
    "FAILED_MEMBER_ERROR_CHARS",
    "failed_member",
    "finish_if_settled",
    "job_settled",
    "jobs_settled",
    "replayed",
]

#: Characters of a failed member's error that its callback's results carry.
FAILED_MEMBER_ERROR_CHARS = 500


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
        # An encrypted parent's result is opened here and handed on sealed if the parent's
        # was, or if the child's own arguments are (so the child keeps them encrypted).
        stored = json.loads(result_json)
        result = open_json(stored, RESULT, "job.result")
        for child, name in receivers:
            row = Job.objects.using(alias).filter(pk=child).values_list("args", "kwargs").first()
            if row is None:
                continue
            stored_args, stored_kwargs = row
            sealed = is_encrypted(stored) or is_encrypted(stored_args) or is_encrypted(stored_kwargs)
            args = open_json(stored_args, ARGS, "job.args")
            kwargs = open_json(stored_kwargs, KWARGS, "job.kwargs")
            waiting = Job.objects.using(alias).filter(pk=child, status=JobStatus.WAITING)
            if name == POSITIONAL:
                # The step was stored with a placeholder there (Signature.prepared), so a
                # replayed parent's result replaces the first one rather than adding another.
                args = [result, *args[1:]]
                waiting.update(args=seal_json(args, ARGS) if sealed else args)
            else:
                kwargs = {**kwargs, name: result}
                waiting.update(kwargs=seal_json(kwargs, KWARGS) if sealed else kwargs)
    dependants.release(alias, [child for child, _ in children])


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
    members: list[Any] | None = None
    sealed_members: bool | None = None
    for when in whens:
        stored = workflow.callbacks.get(when)
        if stored is None or when in done:
            continue
        fields = dict(stored["fields"])
        fields["args"] = open_json(fields["args"], ARGS, "workflow.callbacks.args")
        fields["kwargs"] = open_json(fields["kwargs"], KWARGS, "workflow.callbacks.kwargs")
        if stored.get("results_as"):
            results = members if members is not None else _member_results(alias, workflow_id)
            members = results  # a second callback asking for them reads them once
            _give(fields, stored["results_as"], results)
            if sealed_members is None:
                sealed_members = _any_sealed(alias, workflow_id)
            if sealed_members:
                fields["encrypt"] = True  # the members' results stay encrypted in the callback's job
        if stored.get("result_as"):
            _give(fields, stored["result_as"], summary.as_dict())
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


def _give(fields: dict[str, Any], slot: str, value: Any) -> None:
    """Put a received value in a callback's stored arguments, where its placeholder is."""
    if slot == POSITIONAL:
        fields["args"] = [value, *fields["args"][1:]]
    else:
        fields["kwargs"] = {**fields["kwargs"], slot: value}


def _member_results(alias: str, workflow_id: int) -> list[Any]:
    """Every member's result, in member order (the order they were enqueued in).

    One query over the workflow's members (its partial index); a second, over its dead
    letters, only if a member is dead: a replay takes its dead job's place. A member that
    did not succeed is marked in its place (:func:`failed_member`). Members pruned before the
    workflow finished are left out.
    """
    rows = list(
        Job.objects.using(alias)
        .filter(workflow_id=workflow_id)
        .order_by("pk")
        .values_list("pk", "status", "result", Substr("last_error", 1, FAILED_MEMBER_ERROR_CHARS))
    )
    replaced: dict[int, int] = {}
    if any(status == JobStatus.DEAD for _, status, _, _ in rows):
        replaced = dict(
            DeadLetter.objects.using(alias)
            .filter(job__workflow_id=workflow_id, replay_job__isnull=False)
            .values_list("job_id", "replay_job_id")
        )
    by_id = {row[0]: row for row in rows}
    replays = {new for old, new in replaced.items() if old in by_id}
    results: list[Any] = []
    for member, *_ in rows:
        if member in replays:
            continue  # in the place of the job it replays
        last = member  # the last replay of a replay of ... the member
        while replaced.get(last) in by_id and replaced[last] != member:
            last = replaced[last]
        _, status, result, error = by_id[last]
        if status == JobStatus.SUCCEEDED:
            results.append(open_json(result, RESULT, "job.result"))
        else:
            results.append(failed_member(last, status, _member_error(alias, last, error)))
    return results


def _member_error(alias: str, job_id: int, clipped: str) -> str:
    """A failed member's error as its callback sees it: an encrypted one (which the clipped read
    cut through) read whole, opened, then clipped."""
    if not is_encrypted(clipped):
        return clipped
    whole = Job.objects.using(alias).filter(pk=job_id).values_list("last_error", flat=True).first() or ""
    return open_text(whole, ERROR, "job.last_error")[:FAILED_MEMBER_ERROR_CHARS]


def _any_sealed(alias: str, workflow_id: int) -> bool:
    """Whether a member of the workflow stores its data encrypted (its results are payload too)."""
    rows = Job.objects.using(alias).filter(workflow_id=workflow_id).values_list("result", "last_error")
    return any(is_encrypted(result) or is_encrypted(error) for result, error in rows)


def failed_member(job_id: int, status: str, error: str) -> dict[str, Any]:
    """How a member that did not succeed shows in its callback's results."""
    return {"jobguard_failed": True, "job_id": job_id, "status": status, "error": error}


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
    depend(alias, [JobDependency(parent_id=replay_job_id, child_id=c, result_as=name) for c, name in links])
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
