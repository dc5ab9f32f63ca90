"""The dead-letter queue: dead-lettering, and the replay workflow (request, approve, reject, redrive).

Admin, API and commands call these functions; the rules live here once.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import idempotency, leasing, metrics, signals
from .exceptions import LeaseLost

logger = logging.getLogger(__name__)

__all__ = ["dead_letter"]


def dead_letter(
    alias: str,
    job_id: int,
    lease_token: str,
    *,
    reason: str,
    category: str,
    error_class: str = "",
    error_message: str = "",
    traceback: str = "",
    worker_id: str = "",
    idempotency_scope: str | None = None,
) -> Any:
    """Mark the job dead and store its dead letter in one transaction, fenced by the lease.

    Raises :class:`LeaseLost` (and writes nothing) if the lease moved on.
    """
    from .models import DeadLetter, Job

    summary = f"{error_class}: {error_message}" if error_class else error_message
    with transaction.atomic(using=alias):
        if not leasing.mark_dead(alias, job_id, lease_token, summary):
            raise LeaseLost(f"job {job_id}: lease lost before dead-lettering")
        job = Job.objects.using(alias).get(pk=job_id)
        failed_at = job.finished_at or timezone.now()
        letter = DeadLetter.objects.using(alias).create(
            job=job,
            task_name=job.task_name,
            queue_name=job.queue_name,
            args=job.args,
            kwargs=job.kwargs,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            reason=reason,
            category=category,
            error_class=error_class[:255],
            error_message=error_message,
            traceback=traceback,
            first_failed_at=job.first_failed_at or failed_at,
            last_failed_at=failed_at,
            handler_version=job.handler_version,
            worker_id=worker_id or job.worker_id,
            idempotency_key=job.idempotency_key,
            lock_key=job.lock_key,
        )
        if job.idempotency_key:
            idempotency.record_failure(alias, idempotency_scope or job.task_name, job.idempotency_key, job.pk)
    metrics.job_dead_lettered(letter.queue_name, letter.task_name, reason)
    if signals.job_dead_lettered.has_listeners(None):
        signals.job_dead_lettered.send(sender=None, dead_letter=letter)
    return letter
