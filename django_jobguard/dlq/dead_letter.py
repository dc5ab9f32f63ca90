"""Writing a dead letter: the job marked dead and its letter stored, fenced by the lease."""

from __future__ import annotations

import builtins
import functools

from django.utils import timezone

from .. import _dispatch, events, exceptions, idempotency, signals, store, workflows
from .._text import clip
from ..conf import get_settings
from ..encryption.payloads import ERROR, seal_history_entry, seal_text
from ..exceptions import LeaseLost
from ..models import DeadLetter

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
    last_attempt_error: tuple[str, str] | None = None,
    encrypt: bool = False,
) -> DeadLetter:
    """Mark the job dead and store its dead letter in one transaction, fenced by the lease.

    Raises :class:`LeaseLost` (and writes nothing) if the lease moved on. The job's
    idempotency key, if any, is marked failed, so an approved replay may use it again.

    ``last_attempt_error`` (an error class and message) is what the last attempt's history
    entry records when it differs from the letter's error: the reaper files a handler's own
    error, and the attempt it dead-letters ended in a lost lease.
    """
    limit = get_settings().max_error_chars
    error_message, traceback = clip(error_message, limit), clip(traceback, limit)
    summary = f"{error_class}: {error_message}" if error_class else error_message
    last_error = (clip(last_attempt_error[1], limit), "") if last_attempt_error is not None else None
    if encrypt:
        summary = seal_text(summary, ERROR)
        error_message, traceback = seal_history_entry(error_message, traceback)
        if last_error is not None:
            last_error = seal_history_entry(*last_error)
    # On the in-memory store the job and its letter are the store's (store.atomic, load_job,
    # save_dead_letter): the same steps, in its transaction.
    with store.atomic(alias):
        attempt_error = (
            (_class_path(last_attempt_error[0]), *last_error)
            if last_attempt_error is not None and last_error is not None
            else (_class_path(error_class), error_message, traceback)
        )
        if not store.mark_dead(alias, job_id, lease_token, summary, attempt_error):
            raise LeaseLost(f"job {job_id}: lease lost before dead-lettering")
        job = store.load_job(alias, job_id)
        failed_at = job.finished_at or timezone.now()
        letter = DeadLetter(
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
            worker_id=(worker_id or job.worker_id)[:128],
            idempotency_key=job.idempotency_key,
            lock_key=job.lock_key,
            trace_context=job.trace_context,
        )
        store.save_dead_letter(alias, letter)
        if job.workflow_id is not None:
            workflows.job_settled(alias, job.pk, job.workflow_id, "dead")
        if job.idempotency_key:
            # The reaper has no task at hand; a task with its own idempotency_scope keeps its
            # keys there, so look it up rather than assume the task name.
            scope = idempotency_scope or idempotency.scope_of_name(job.task_name)
            idempotency.record_failure(alias, scope, job.idempotency_key, job.pk)
        store.on_commit(alias, functools.partial(_announce_dead_letter, letter))
    return letter


def _class_path(error_class: str) -> str:
    """The importable path of a recorded error class (Django's ``TaskError`` resolves it)."""
    if "." in error_class or not error_class:
        return error_class
    if error_class == "LeaseExpired":  # the reaper's name for a lost lease
        return f"{exceptions.__name__}.LeaseLost"
    if isinstance(getattr(builtins, error_class, None), type):
        return f"builtins.{error_class}"
    if isinstance(getattr(exceptions, error_class, None), type):
        return f"{exceptions.__name__}.{error_class}"
    return error_class


def _announce_dead_letter(letter: DeadLetter) -> None:
    events.emit(events.JobDeadLettered(letter.queue_name, letter.task_name, letter.reason))
    _dispatch.send(signals.job_dead_lettered, dead_letter=letter)
