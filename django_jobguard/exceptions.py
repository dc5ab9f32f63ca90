"""Exceptions users raise from handlers and catch around enqueue and locks, and the error categories."""

from __future__ import annotations

import math

from django.core.exceptions import PermissionDenied
from django.db.models import TextChoices
from django.utils.translation import gettext_lazy as _


class ErrorCategory(TextChoices):
    """What a failed attempt's error is, so what comes next: a retry, a longer one, a dead letter.

    Defined here, once: the errors below declare theirs, :func:`django_jobguard.retry.classify`
    returns one, and the attempt history and dead letters store it (``DeadLetter.category``).
    """

    TRANSIENT = "transient", _("transient")
    RECOVERABLE = "recoverable", _("recoverable")
    PERMANENT = "permanent", _("permanent")


class JobguardError(Exception):
    """Base class of every exception django-jobguard raises."""


class TaskError(JobguardError):
    """Base class of the errors a handler raises to classify its own failure.

    ``retry_after`` (seconds) asks for a specific delay before the next attempt,
    for example the value of a rate limit's ``Retry-After`` header. A subclass may set
    ``category`` to ``"transient"``, ``"recoverable"`` or ``"permanent"`` (an :class:`ErrorCategory`).
    """

    # Plain strings (an ErrorCategory's value), as they are stored, logged and compared.
    category: str = ErrorCategory.TRANSIENT.value

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None and not (math.isfinite(retry_after) and retry_after >= 0):
            raise ValueError(
                f"retry_after must be a finite number of seconds, zero or more, not {retry_after!r}"
            )
        self.retry_after = retry_after


class TransientError(TaskError):
    """A passing failure (timeout, dropped connection): retry with backoff and jitter."""

    category = ErrorCategory.TRANSIENT.value


class RecoverableError(TaskError):
    """A dependency is degraded: retry on the longer recoverable schedule."""

    category = ErrorCategory.RECOVERABLE.value


class PermanentError(TaskError):
    """Retrying cannot help (invalid payload, broken invariant): dead-letter at once."""

    category = ErrorCategory.PERMANENT.value


class InvalidTaskError(JobguardError):
    """A task was declared with options that cannot work."""


class UnknownTaskError(JobguardError, LookupError):
    """No task is registered under that name."""


class TaskNotExposedError(JobguardError, LookupError):
    """The task is registered but not declared ``@task(api=True)``, so HTTP callers may not enqueue it."""


class InvalidArgumentsError(JobguardError, TypeError):
    """An enqueue was refused before anything was written; the message says why and what to change.

    Raised when the arguments do not bind to the task's signature, cannot be stored as JSON
    (an unsupported type, a NUL character or lone surrogate in a string, a reference cycle,
    nesting deeper than ``JOBGUARD["MAX_PAYLOAD_DEPTH"]``), or when a ``using()`` option is
    invalid.
    """


class PayloadTooLargeError(InvalidArgumentsError):
    """A job's arguments take more bytes as JSON than the configured limit allows."""

    def __init__(self, size: int | None, limit: int, setting: str = "JOBGUARD['MAX_PAYLOAD_BYTES']") -> None:
        if size is None:
            # More values than the limit has bytes (each takes one at least): too large for
            # sure, and not worth serialising to say by how much.
            took = f"hold more than {limit:,} values, so they take more than the limit of {limit:,} bytes"
        else:
            took = f"take {size:,} bytes as JSON, more than the limit of {limit:,} bytes"
        super().__init__(
            f"The job's arguments {took} ({setting}). Store large data elsewhere (a model, a file) "
            "and pass its id."
        )
        self.size = size
        self.limit = limit


class UnknownQueueError(InvalidArgumentsError, LookupError):
    """The queue is not declared in ``JOBGUARD["QUEUES"]``, so no worker would be sure to take its jobs."""


class IdempotencyConflict(JobguardError):  # noqa: N818 - public name fixed by the design
    """The idempotency key was used before with different arguments."""

    def __init__(self, key: str, scope: str, used: str = "with different arguments") -> None:
        super().__init__(
            f"Idempotency key {key!r} (scope {scope!r}) was already used {used}; "
            "use a new key for a different business action."
        )
        self.key = key
        self.scope = scope
        self.used = used


class IdempotencyScheduleConflict(IdempotencyConflict):
    """The key's job has not run yet and is due later than this enqueue asked, past the tolerance.

    A repeat asks for the key's action by a time (``run_after``, or now); a job that will not
    run until long after it does not stand for that action. ``JOBGUARD["IDEMPOTENCY"]
    ["SCHEDULE_TOLERANCE"]`` sets how much later is still a duplicate.
    """


class LeaseLost(JobguardError):  # noqa: N818 - reads as a state, like Django's DoesNotExist
    """The worker's lease on a job expired and the job moved on: its writes must not commit."""


class LockUnavailable(JobguardError):  # noqa: N818 - public name fixed by the design
    """The lock back end cannot be reached, so the lock cannot be taken."""


class LockNotAcquired(JobguardError):  # noqa: N818 - reads as a state
    """The lock is held by another owner, or is no longer ours (it expired) to release."""


class ReplayError(JobguardError):
    """A replay transition is not allowed (wrong state, missing permission, self-approval)."""


class ReplayConflict(ReplayError):  # noqa: N818 - reads as a state, like IdempotencyConflict
    """The replay's payload changed since the approver reviewed it: nothing was approved."""


class ReplayReviewRequired(ReplayError):  # noqa: N818 - reads as a state, like ReplayConflict
    """An approval of a corrected payload came without the correction digest the approver reviewed.

    The admin and the API require it (the API answers 400 naming ``correction_digest``), so
    an approval cannot run a correction nobody looked at; nothing was approved.
    """


class ReplayPermissionDenied(ReplayError, PermissionDenied):  # noqa: N818 - after Django's PermissionDenied
    """The user may not make this replay transition; the admin and the API answer 403."""


class InvalidScheduleError(JobguardError, ValueError):
    """A recurring job's cron expression or time zone that cannot be used."""


class QueueError(JobguardError):
    """A queue cannot be paused or resumed as asked (bad name, no reason given)."""


class QueuePermissionDenied(QueueError, PermissionDenied):  # noqa: N818 - after Django's PermissionDenied
    """The user may not pause or resume queues; the admin and the API answer 403."""


class LockReleaseError(JobguardError):
    """A lock cannot be force-released as asked (free already, no reason given)."""


class LockReleasePermissionDenied(LockReleaseError, PermissionDenied):  # noqa: N818 - after PermissionDenied
    """The user may not force-release locks; the admin answers 403."""


class BreakerError(JobguardError):
    """A circuit breaker cannot be opened or closed as asked (no such breaker, no reason given)."""


class BreakerPermissionDenied(BreakerError, PermissionDenied):  # noqa: N818 - after Django's PermissionDenied
    """The user may not open or close circuit breakers; the admin and the API answer 403."""


class WaitError(JobguardError):
    """Base class of the errors ``Job.wait()`` raises instead of returning a result."""

    def __init__(self, message: str, *, job_id: int | None) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobFailed(WaitError):  # noqa: N818 - reads as the job's state, like LeaseLost
    """The job was dead-lettered: ``error_class`` and ``error_message`` are its final error's.

    The text is the dead letter's, as stored (after ``JOBGUARD["REDACT"]``): show it to people
    allowed to see dead letters (the ``view_payload`` permission), not to an end user.
    """

    def __init__(
        self,
        job_id: int,
        *,
        error_class: str,
        error_message: str,
        reason: str = "",
        dead_letter_id: int | None = None,
        replay_job_id: int | None = None,
    ) -> None:
        shown = f"{error_class}: {error_message}" if error_message else error_class or "(no error recorded)"
        super().__init__(f"Job {job_id} failed ({reason or 'dead'}): {shown}", job_id=job_id)
        self.error_class = error_class
        self.error_message = error_message
        self.reason = reason
        self.dead_letter_id = dead_letter_id
        #: The job an approved replay of the dead letter enqueued, if any: wait on it for a result.
        self.replay_job_id = replay_job_id


class JobCancelled(WaitError):  # noqa: N818 - reads as the job's state
    """The job was cancelled (by an operator, or as a workflow step whose upstream failed): no result."""


class ResultExpired(WaitError):  # noqa: N818 - reads as the result's state
    """The job succeeded, but its result is past its retention (or its row was pruned)."""


class ResultNotStored(WaitError):  # noqa: N818 - reads as the result's state
    """The job's task keeps no result to wait for (``@task(result_retention=0)``)."""


class JobNotFound(WaitError, LookupError):  # noqa: N818 - reads as a state, like Django's DoesNotExist
    """No job has this id: never enqueued (or not committed yet), or deleted."""


class WaitTimeout(WaitError, TimeoutError):  # noqa: N818 - a TimeoutError, as callers catch it
    """The job did not settle within the timeout; it may still run (nothing was changed)."""


class InvalidPublishError(InvalidArgumentsError):
    """A ``publish()`` was refused before anything was written; the message names the part and the limit."""


class UnknownDestinationError(InvalidPublishError, LookupError):
    """The destination is not declared in ``JOBGUARD["OUTBOX"]["DESTINATIONS"]``."""


class OutboxError(JobguardError):
    """An outbox message cannot be replayed or skipped as asked (wrong state, no reason given)."""
