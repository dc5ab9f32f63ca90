"""Operator actions on jobs: cancel, ask a running job to stop, make waiting jobs due now.

The admin and the REST API call these, never the ORM.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from .. import workflows
from ..conf import get_settings
from ..models import IdempotencyKey, Job, JobStatus
from ..store import key_rows

logger = logging.getLogger("django_jobguard.jobs")

__all__ = ["cancel", "request_cancel", "requeue_cancelled", "retry_now", "run_now"]


def _lock_and_update(
    alias: str, match: dict[str, Any], *, skip_locked: bool = True, **changes: Any
) -> list[int]:
    """Lock the jobs that ``match`` and update them to ``changes``; their ids.

    Call it inside a transaction (the caller's, which may write more in the same one).

    The update repeats the match's status (not its other conditions, which the lock made
    true), so a row whose status moved on between the two statements is left alone.
    """

    ids = list(
        Job.objects.using(alias)
        .select_for_update(skip_locked=skip_locked)
        .filter(**match)
        .values_list("pk", flat=True)
    )
    if ids:
        status = {"status__in": match["status__in"]} if "status__in" in match else {"status": match["status"]}
        Job.objects.using(alias).filter(pk__in=ids, **status).update(**changes)
    return ids


def cancel(job_ids: Iterable[int], *, reason: str = "", using: str | None = None) -> list[int]:
    """Cancel the given jobs that are still queued (or waiting), or stuck; the ids cancelled.

    Running jobs with a live lease are left alone (:func:`request_cancel` asks them): a
    handler cannot be stopped safely from outside, and its lease already decides who may
    finish it. A *stuck* job, running with an expired lease, has no heartbeat left to carry
    a request: it is cancelled outright, as the reaper would have taken it back, and its
    lease token is cleared, so a worker that was only frozen cannot ack it later. A
    cancelled job's idempotency key expires at
    once, so the same business action can be enqueued again later. The jobs waiting for a
    cancelled one are cancelled too ("upstream failed"), and its workflow counts it failed.
    """

    alias = using or get_settings().database_alias
    wanted = list(job_ids)
    if not wanted:
        return []
    with transaction.atomic(using=alias):
        # Lock the queued rows first (workers skip them), so only these are updated and
        # their keys released; a row a worker claims meanwhile is no longer queued here.
        ids = _lock_and_update(
            alias,
            {"pk__in": wanted, "status__in": [JobStatus.QUEUED, JobStatus.WAITING]},
            status=JobStatus.CANCELLED,
            finished_at=Now(),
            last_error=f"cancelled: {reason}" if reason else "cancelled",
        )
        # Stuck jobs: the lease's own expiry (database clock) is the reaper's condition too.
        ids += _lock_and_update(
            alias,
            {"pk__in": wanted, "status": JobStatus.RUNNING, "lease_expires_at__lt": Now()},
            status=JobStatus.CANCELLED,
            finished_at=Now(),
            lease_token=None,
            lease_expires_at=None,
            last_error=f"cancelled with its lease expired: {reason}"
            if reason
            else "cancelled with its lease expired",
        )
        if not ids:
            return []
        key_rows.release_for_jobs(alias, ids)
        members = Job.objects.using(alias).filter(pk__in=ids, workflow_id__isnull=False)
        settled = [
            (job_id, workflow_id, JobStatus.CANCELLED, None)
            for job_id, workflow_id in members.values_list("pk", "workflow_id")
            if workflow_id is not None
        ]
        if settled:
            # Together: each counter row once, every workflow row after every counter row (an
            # ack's order); one call per member would lock a workflow between two counters.
            workflows.jobs_settled(alias, settled)
    logger.info("jobs_cancelled count=%d ids=%s reason=%r", len(ids), ids[:20], reason or "-")
    return ids


def requeue_cancelled(job_ids: Iterable[int], *, reason: str = "", using: str | None = None) -> list[int]:
    """Put cancelled jobs back in their queue, due now; the ids re-queued (undoes :func:`cancel`).

    A cancelled job's idempotency key was released: a job whose key another job has taken
    since (or that was pruned) stays cancelled, since running it could repeat the action
    that key now guards. Its own key goes back to in progress, live again. Attempts are kept.
    """

    alias = using or get_settings().database_alias
    wanted = list(job_ids)
    if not wanted:
        return []
    with transaction.atomic(using=alias):
        rows = list(
            Job.objects.using(alias)
            .select_for_update()
            # A workflow counted its cancelled member already: re-running it would count it twice.
            .filter(pk__in=wanted, status=JobStatus.CANCELLED, workflow_id__isnull=True)
            .values_list("pk", "idempotency_key")
        )
        own_keys = set(
            IdempotencyKey.objects.using(alias)
            .filter(job_id__in=[pk for pk, key in rows if key])
            .values_list("job_id", flat=True)
        )
        ids = [pk for pk, key in rows if not key or pk in own_keys]
        if not ids:
            return []
        Job.objects.using(alias).filter(pk__in=ids, status=JobStatus.CANCELLED).update(
            status=JobStatus.QUEUED,
            run_after=Now(),
            finished_at=None,
            cancel_requested=False,
            last_error=f"re-queued after a cancel: {reason}" if reason else "re-queued after a cancel",
        )
        ttl = datetime.timedelta(seconds=get_settings().idempotency.ttl)
        key_rows.renew_for_jobs(alias, ids, expires_at=timezone.now() + ttl)
    logger.info("jobs_requeued count=%d ids=%s reason=%r", len(ids), ids[:20], reason or "-")
    return ids


def request_cancel(job_ids: Iterable[int], *, reason: str = "", using: str | None = None) -> list[int]:
    """Ask the given running jobs with a live lease to stop; the ids flagged.

    Never a kill: the worker's heartbeat delivers the request to the handler as
    ``context.cancel_requested``, and the handler decides where stopping is safe. A
    handler that ignores it runs to its end and is acked as usual. A job whose lease
    expired gets no heartbeat to carry the request: :func:`cancel` cancels it outright.
    """

    alias = using or get_settings().database_alias
    wanted = list(job_ids)
    if not wanted:
        return []
    with transaction.atomic(using=alias):
        # No skip_locked: a running row its worker holds a moment (a heartbeat) is waited for.
        ids = _lock_and_update(
            alias,
            {
                "pk__in": wanted,
                "status": JobStatus.RUNNING,
                "cancel_requested": False,
                "lease_expires_at__gte": Now(),
            },
            skip_locked=False,
            cancel_requested=True,
        )
    if ids:
        logger.info("cancel_requested count=%d ids=%s reason=%r", len(ids), ids[:20], reason or "-")
    return ids


def retry_now(job_ids: Iterable[int], *, reason: str = "", using: str | None = None) -> list[int]:
    """Make the given queued jobs that wait (a retry backoff or a later ``run_after``) due now.

    Jobs already due, running or finished are left alone: the ids changed. The attempt
    count is kept, so a job near its ``max_attempts`` is not given more tries.
    """

    alias = using or get_settings().database_alias
    wanted = list(job_ids)
    if not wanted:
        return []
    with transaction.atomic(using=alias):
        # Workers skip locked rows, so none is claimed between the select and the update.
        ids = _lock_and_update(
            alias, {"pk__in": wanted, "status": JobStatus.QUEUED, "run_after__gt": Now()}, run_after=Now()
        )
    if ids:
        logger.info("jobs_made_due count=%d ids=%s reason=%r", len(ids), ids[:20], reason or "-")
    return ids


def run_now(job_ids: Iterable[int], *, using: str | None = None) -> list[int]:
    """:func:`retry_now`, answering with the ids still queued (those already due included).

    The REST API's ``retry`` verb: a job that is queued runs as soon as a worker is free,
    whether it waited or was due already; running and finished jobs are not returned.
    """

    alias = using or get_settings().database_alias
    wanted = list(job_ids)
    retry_now(wanted, using=alias)
    return list(
        Job.objects.using(alias).filter(pk__in=wanted, status=JobStatus.QUEUED).values_list("pk", flat=True)
    )
