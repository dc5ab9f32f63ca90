"""Operator actions on a whole workflow: cancel it, retry its failed members.

The admin's workflow page and the REST API call these, never the ORM. The rules are the
ones operators already know from single jobs and dead letters:

- :func:`cancel` cancels every queued or waiting member (``jobguard.cancel_job``, checked by
  the caller as for jobs), asks running ones to stop, and closes an open batch, so the
  workflow finishes once its running members settle. Dependents of a cancelled member are
  cancelled with "upstream failed" in their last error, as for any cancel.
- :func:`retry_failed` puts failed members back. A **dead** member goes through the
  dead-letter queue's replay: its replay is *requested* (``jobguard.request_replay``), and
  another user approves it as for any dead letter (the two-person rule); a worker redrives
  it, the replay takes the member's place, and the members cancelled because of it wait
  again. A **cancelled** member whose dependencies are all succeeded, or are retried with
  it, is re-queued at once (``jobguard.retry_job``): a cancel was an operator's decision,
  and undoing it needs no second person, as ``requeue_cancelled`` for single jobs.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections import defaultdict
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from .. import dlq, workflows
from ..actors import User
from ..conf import get_settings
from ..exceptions import InvalidArgumentsError
from ..models import (
    WORKFLOW_COUNTER_SHARDS,
    DeadLetter,
    IdempotencyKey,
    IdempotencyStatus,
    Job,
    JobDependency,
    JobStatus,
    ReplayState,
    Workflow,
    WorkflowState,
)
from . import jobs

logger = logging.getLogger("django_jobguard.workflow_ops")

__all__ = ["CHUNK", "CancelResult", "RetryResult", "cancel", "retry_failed"]

#: Members per transaction of :func:`cancel`: each chunk holds its row locks until it commits.
CHUNK = 1000

#: The permissions each action needs (the job admin's, and the dead-letter queue's).
CANCEL_PERMISSION = "jobguard.cancel_job"
RETRY_PERMISSION = "jobguard.retry_job"
REPLAY_PERMISSION = dlq.PERMISSIONS[dlq.REQUEST]


@dataclasses.dataclass(frozen=True)
class CancelResult:
    """What :func:`cancel` did: members cancelled, running ones asked to stop, the batch closed."""

    workflow_id: int
    cancelled: list[int]
    asked_to_stop: list[int]
    closed: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RetryResult:
    """What :func:`retry_failed` did.

    ``requeued``: cancelled members queued (or waiting) again; ``replays_requested``: dead
    letters of dead members whose replay now awaits another user's approval;
    ``awaiting_approval``: dead letters whose replay was requested or approved already;
    ``refused``: each member left alone, with why.
    """

    workflow_id: int
    requeued: list[int]
    replays_requested: list[int]
    awaiting_approval: list[int]
    refused: list[tuple[int, str]]

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["refused"] = [{"job_id": pk, "reason": why} for pk, why in self.refused]
        return data


def _workflow(alias: str, workflow_id: int) -> Workflow:
    try:
        return Workflow.objects.using(alias).get(pk=workflow_id)
    except Workflow.DoesNotExist:
        raise InvalidArgumentsError(f"No workflow #{workflow_id}.") from None


def cancel(workflow_id: int, *, reason: str = "", using: str | None = None) -> CancelResult:
    """Cancel a workflow: its queued and waiting members, a stop request to running ones.

    An open batch is closed first (no member can join a cancelled batch), so the workflow
    finishes, and its ``on_dead`` and ``on_complete`` callbacks run, once the members still
    running settle. Finished members are left as they are.
    """
    alias = using or get_settings().database_alias
    _workflow(alias, workflow_id)
    with transaction.atomic(using=alias):
        closed = bool(
            Workflow.objects.using(alias)
            .filter(pk=workflow_id, state=WorkflowState.OPEN)
            .update(state=WorkflowState.CLOSED, closed_at=Now())
        )
        if closed:
            workflows.finish_if_settled(alias, workflow_id)
    why = f"workflow #{workflow_id} cancelled" + (f": {reason}" if reason else "")
    members = Job.objects.using(alias).filter(workflow_id=workflow_id)
    cancelled: list[int] = []
    # Chunks by id, each its own transaction: a 100,000-member batch does not hold every lock
    # at once. A chain's first step cancels the rest down the chain ("upstream failed").
    # Stuck members (running, lease expired) too: no heartbeat would carry a stop request.
    pending = list(
        members.filter(
            Q(status__in=[JobStatus.QUEUED, JobStatus.WAITING])
            | Q(status=JobStatus.RUNNING, lease_expires_at__lt=Now())
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for start in range(0, len(pending), CHUNK):
        cancelled += jobs.cancel(pending[start : start + CHUNK], reason=why, using=alias)
    running = list(members.filter(status=JobStatus.RUNNING).order_by("pk").values_list("pk", flat=True))
    asked = jobs.request_cancel(running, reason=why, using=alias)
    logger.info(
        "workflow_cancelled workflow_id=%s cancelled=%d asked_to_stop=%d closed=%s",
        workflow_id,
        len(cancelled),
        len(asked),
        closed,
    )
    return CancelResult(workflow_id, cancelled, asked, closed)


def retry_failed(workflow_id: int, user: User, reason: str, *, using: str | None = None) -> RetryResult:
    """Put the workflow's failed members back: cancelled ones re-queued, dead ones' replays requested.

    ``user`` needs ``jobguard.retry_job`` for the cancelled members and
    ``jobguard.request_replay`` for the dead ones; what a missing permission leaves alone is
    in ``refused`` with the reason, and the rest goes on. A replay requested here still
    waits for another user's approval (``JOBGUARD["REPLAY"]["ALLOW_SELF_APPROVAL"]`` aside).
    """
    reason = (reason or "").strip()
    if not reason:
        raise InvalidArgumentsError(
            "reason: say why the failed members are retried; it goes into the audit trail."
        )
    alias = using or get_settings().database_alias
    _workflow(alias, workflow_id)
    refused: list[tuple[int, str]] = []
    members = Job.objects.using(alias).filter(workflow_id=workflow_id)

    cancelled_ids = list(members.filter(status=JobStatus.CANCELLED).values_list("pk", flat=True))
    requeued: list[int] = []
    if cancelled_ids:
        if user.is_authenticated and user.has_perm(RETRY_PERMISSION):
            requeued, left = _requeue_cancelled(alias, workflow_id, reason, user.get_username())
            refused += left
        else:
            why = (
                f"{user.get_username()} may not re-queue cancelled jobs: "
                f"that needs the {RETRY_PERMISSION} permission."
            )
            refused += [(pk, why) for pk in cancelled_ids]

    letters = dict(
        DeadLetter.objects.using(alias)
        .filter(job__workflow_id=workflow_id, job__status=JobStatus.DEAD)
        .values_list("pk", "job_id")
    )
    states = dict(DeadLetter.objects.using(alias).filter(pk__in=letters).values_list("pk", "replay_state"))
    open_letters = [pk for pk in letters if states[pk] in dlq.ALLOWED_FROM[dlq.REQUEST]]
    awaiting = sorted(pk for pk in letters if states[pk] in (ReplayState.REQUESTED, ReplayState.APPROVED))
    requested: list[int] = []
    if open_letters:
        decision = dlq.decide_many(dlq.REQUEST, open_letters, user, reason)
        requested = decision.moved
        refused += [(letters[pk], why) for pk, why in decision.refused]
    dead_without_letter = members.filter(status=JobStatus.DEAD).exclude(pk__in=list(letters.values()))
    refused += [
        (pk, f"Job #{pk} is dead but has no dead letter (pruned?): nothing to replay.")
        for pk in dead_without_letter.values_list("pk", flat=True)
    ]
    logger.info(
        "workflow_retry_failed workflow_id=%s requeued=%d replays_requested=%d refused=%d",
        workflow_id,
        len(requeued),
        len(requested),
        len(refused),
    )
    return RetryResult(workflow_id, requeued, sorted(requested), awaiting, sorted(refused))


def _requeue_cancelled(
    alias: str, workflow_id: int, reason: str, username: str
) -> tuple[list[int], list[tuple[int, str]]]:
    """Re-queue the cancelled members that can run again, in one transaction.

    A member can if each of its dependencies succeeded, is live (it waits for it), or is
    re-queued with it; one that waits for a dead member comes back with that member's replay.
    A member whose idempotency key another job holds now stays cancelled (running it could
    repeat that job's action), as for single jobs.
    """
    with transaction.atomic(using=alias):
        # Members first, then their dependencies, then the counters, then the workflow row:
        # the order an ack takes them in, so the two never wait for each other in a circle.
        rows = dict(
            Job.objects.using(alias)
            .select_for_update()
            .filter(workflow_id=workflow_id, status=JobStatus.CANCELLED)
            .order_by("pk")
            .values_list("pk", "idempotency_key")
        )
        if not rows:
            return [], []
        refused: list[tuple[int, str]] = []
        keyed = [pk for pk, key in rows.items() if key]
        own = set(
            IdempotencyKey.objects.using(alias).filter(job_id__in=keyed).values_list("job_id", flat=True)
        )
        for pk in keyed:
            if pk not in own:
                refused.append(
                    (
                        pk,
                        f"Job #{pk}'s idempotency key belongs to another job now: "
                        "running it could repeat that action.",
                    )
                )
        parents: dict[int, list[int]] = defaultdict(list)
        for parent, child in (
            JobDependency.objects.using(alias)
            .filter(child_id__in=list(rows))
            .values_list("parent_id", "child_id")
        ):
            parents[child].append(parent)
        outside = sorted({pk for ids in parents.values() for pk in ids} - set(rows))
        # Locked: a dependency's ack cannot slip between this read and the members' new state.
        states = dict(
            Job.objects.using(alias)
            .select_for_update()
            .filter(pk__in=outside)
            .order_by("pk")
            .values_list("pk", "status")
        )
        chosen = {pk for pk in rows if pk not in {pk for pk, _ in refused}}
        changed = True
        while changed:  # drop members that wait for a failed job not coming back with them
            changed = False
            for pk in sorted(chosen):
                for parent in parents.get(pk, []):
                    if parent in chosen:
                        continue
                    status = states.get(parent, JobStatus.CANCELLED if parent in rows else None)
                    if status in (JobStatus.DEAD, JobStatus.CANCELLED):
                        chosen.discard(pk)
                        changed = True
                        refused.append(
                            (
                                pk,
                                f"Job #{pk} waits for job #{parent}, which is {status}: "
                                "it comes back with that job.",
                            )
                        )
                        break
        if not chosen:
            return [], refused
        waiting_on = {
            pk: sum(
                1
                for parent in parents.get(
                    pk, []
                )  # a pruned dependency had finished: only finished jobs are pruned, and a failed one
                # would have cancelled this member for good
                if parent in chosen or states.get(parent, JobStatus.SUCCEEDED) != JobStatus.SUCCEEDED
            )
            for pk in chosen
        }
        note = f"re-queued with its workflow's failed members by {username}: {reason}"
        due = sorted(pk for pk, count in waiting_on.items() if count == 0)
        Job.objects.using(alias).filter(pk__in=due, status=JobStatus.CANCELLED).update(
            status=JobStatus.QUEUED,
            run_after=Now(),
            finished_at=None,
            cancel_requested=False,
            last_error=note,
        )
        by_count: dict[int, list[int]] = defaultdict(list)
        for pk, count in waiting_on.items():
            if count:
                by_count[count].append(pk)
        for count, ids in by_count.items():
            Job.objects.using(alias).filter(pk__in=ids, status=JobStatus.CANCELLED).update(
                status=JobStatus.WAITING,
                waiting_on=count,
                finished_at=None,
                cancel_requested=False,
                last_error=note,
            )
        ttl = datetime.timedelta(seconds=get_settings().idempotency.ttl)
        IdempotencyKey.objects.using(alias).filter(job_id__in=sorted(chosen)).update(
            status=IdempotencyStatus.IN_PROGRESS, expires_at=timezone.now() + ttl, updated_at=Now()
        )
        per_shard: dict[int, int] = defaultdict(int)
        for pk in chosen:
            per_shard[pk % WORKFLOW_COUNTER_SHARDS] += 1
        workflows.add_to_counters(alias, workflow_id, {shard: (n, -n) for shard, n in per_shard.items()})
        # A finished workflow runs again; callbacks that ran already stay run.
        Workflow.objects.using(alias).filter(pk=workflow_id, state=WorkflowState.FINISHED).update(
            state=WorkflowState.CLOSED, finished_at=None
        )
    return sorted(chosen), refused
