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

Building (:mod:`.build`: :class:`chain`, :func:`group`, :class:`Batch`, ``after=``) is apart
from settling (:mod:`.settle`); both write the counters and dependencies of
:mod:`.bookkeeping`, and their raw SQL is the store's (:mod:`django_jobguard.store.dependants`).
Every name imports from ``django_jobguard.workflows``.
"""

from .bookkeeping import Progress, add_to_counters, progress
from .build import CALLBACK_WHENS, MAX_WORKFLOW_NAME_LENGTH, Batch, chain, enqueue_after, group
from .settle import finish_if_settled, job_settled, jobs_settled, replayed

__all__ = [
    "CALLBACK_WHENS",
    "MAX_WORKFLOW_NAME_LENGTH",
    "Batch",
    "Progress",
    "add_to_counters",
    "chain",
    "enqueue_after",
    "finish_if_settled",
    "group",
    "job_settled",
    "jobs_settled",
    "progress",
    "replayed",
]
