"""A workflow's bookkeeping, written by building and settling alike: counters and dependencies.

- The counters: each workflow's members are counted pending, succeeded or failed in
  :data:`~django_jobguard.models.WORKFLOW_COUNTER_SHARDS` shards
  (:class:`~django_jobguard.models.WorkflowCounter`, picked by the job id), so concurrent
  completions rarely meet on one row; :func:`progress` sums them.
- The dependencies: a :class:`~django_jobguard.models.JobDependency` row per edge, and the
  parent's ``has_dependants`` mark, which makes its ack look its dependants up.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db.models import Sum

from .. import store
from ..conf import get_settings
from ..models import Job, JobDependency, Workflow, WorkflowCounter

__all__ = ["Progress", "add_to_counters", "depend", "progress"]


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


def depend(alias: str, links: list[JobDependency]) -> None:
    """Store dependencies and mark their parents, whose acks then look their dependants up.

    Callers hold the parents' rows (new in this transaction, or locked): a parent's ack,
    a fenced write of that row, waits for this commit and reads the mark it made.
    """
    if not links:
        return
    JobDependency.objects.using(alias).bulk_create(links)
    parents = sorted({link.parent_id for link in links})
    Job.objects.using(alias).filter(pk__in=parents, has_dependants=False).update(has_dependants=True)
