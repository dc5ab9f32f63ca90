"""Operator actions on jobs: cancel, run now. The admin and the REST API call these, never the ORM."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction
from django.db.models.functions import Now

from .conf import get_settings

logger = logging.getLogger(__name__)

__all__ = ["cancel", "run_now"]


def cancel(job_ids: Iterable[int], *, reason: str = "", using: str | None = None) -> list[int]:
    """Cancel the given jobs that are still queued; the ids actually cancelled.

    Running jobs are left alone: a handler cannot be stopped safely from outside, and its
    lease already decides who may finish it. A cancelled job's idempotency key expires at
    once, so the same business action can be enqueued again later.
    """
    from .models import IdempotencyKey, Job, JobStatus

    alias = using or get_settings().database_alias
    wanted = list(job_ids)
    if not wanted:
        return []
    with transaction.atomic(using=alias):
        # Lock the queued rows first (workers skip them), so only these are updated and
        # their keys released; a row a worker claims meanwhile is no longer queued here.
        ids = list(
            Job.objects.using(alias)
            .select_for_update(skip_locked=True)
            .filter(pk__in=wanted, status=JobStatus.QUEUED)
            .values_list("pk", flat=True)
        )
        if not ids:
            return []
        Job.objects.using(alias).filter(pk__in=ids, status=JobStatus.QUEUED).update(
            status=JobStatus.CANCELLED,
            finished_at=Now(),
            last_error=f"cancelled: {reason}" if reason else "cancelled",
        )
        IdempotencyKey.objects.using(alias).filter(job_id__in=ids).update(
            status="failed", expires_at=Now(), updated_at=Now()
        )
    logger.info("jobs_cancelled count=%d ids=%s reason=%s", len(ids), ids[:20], reason or "-")
    return ids


def run_now(job_ids: Iterable[int], *, using: str | None = None) -> list[int]:
    """Make the given queued jobs due now (``run_after`` = the database's now); the ids still queued.

    A job waiting for its ``run_after`` (a delayed job, or a retry in its backoff) becomes
    claimable at once; attempts are not touched, so a retried job keeps its remaining
    attempts. Jobs that are due already stay as they are (and are returned: they run as soon
    as a worker is free); running and finished jobs are left alone and not returned.
    """
    from .models import Job, JobStatus

    alias = using or get_settings().database_alias
    wanted = list(job_ids)
    if not wanted:
        return []
    with transaction.atomic(using=alias):
        jobs = Job.objects.using(alias).filter(pk__in=wanted, status=JobStatus.QUEUED)
        moved = jobs.filter(run_after__gt=Now()).update(run_after=Now())
        ids = list(jobs.values_list("pk", flat=True))
    logger.info("jobs_run_now count=%d moved=%d ids=%s", len(ids), moved, ids[:20])
    return ids
