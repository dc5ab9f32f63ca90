"""Jobs, idempotency keys, dead letters and their replay audit trail, database locks."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from .encryption.payloads import ARGS, ERROR, KWARGS, TRACEBACK, open_json, open_progress, open_text
from .exceptions import ErrorCategory, JobNotFound, WaitTimeout


class JobStatus(models.TextChoices):
    """Life cycle of a job: (waiting →) queued → running → succeeded | dead (| cancelled)."""

    #: A workflow step whose dependencies have not all succeeded: never claimed (the claim
    #: and its indexes take queued rows only), queued when the last of them succeeds.
    WAITING = "waiting", _("waiting")
    QUEUED = "queued", _("queued")
    RUNNING = "running", _("running")
    SUCCEEDED = "succeeded", _("succeeded")
    DEAD = "dead", _("dead")
    CANCELLED = "cancelled", _("cancelled")


TERMINAL_STATUSES = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)
#: Seconds between two reads of a watched job's row (``Job.watch()``), and the longest allowed.
WATCH_INTERVAL_SECONDS = 0.5
MAX_WATCH_INTERVAL_SECONDS = 60.0


class JobQuerySet(models.QuerySet["Job"]):
    """Named states of jobs."""

    def queued(self) -> JobQuerySet:
        return self.filter(status=JobStatus.QUEUED)

    def due(self) -> JobQuerySet:
        """Queued jobs whose ``run_after`` has passed (database clock)."""
        return self.filter(status=JobStatus.QUEUED, run_after__lte=Now())

    def scheduled(self) -> JobQuerySet:
        """Queued jobs that may not start yet."""
        return self.filter(status=JobStatus.QUEUED, run_after__gt=Now())

    def waiting_for_retry(self) -> JobQuerySet:
        """Scheduled jobs that failed before: waiting out a retry backoff."""
        return self.scheduled().filter(first_failed_at__isnull=False)

    def running(self) -> JobQuerySet:
        return self.filter(status=JobStatus.RUNNING)

    def leased(self) -> JobQuerySet:
        """Running jobs whose lease is still live (database clock)."""
        return self.filter(status=JobStatus.RUNNING, lease_expires_at__gte=Now())

    def expired_leases(self) -> JobQuerySet:
        """Running jobs whose lease ran out (database clock): their worker is gone or stuck."""
        return self.filter(status=JobStatus.RUNNING, lease_expires_at__lt=Now())

    def finished(self) -> JobQuerySet:
        return self.filter(status__in=TERMINAL_STATUSES)


class Job(models.Model):
    """One enqueued run of a task, and the lease of the worker running it."""

    id = models.BigAutoField(primary_key=True)
    task_name = models.CharField(_("task"), max_length=255, help_text=_("Dotted path of the task."))
    queue_name = models.CharField(_("queue"), max_length=100, default="default")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=0, help_text=_("-100 to 100; higher runs first."))
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    run_after = models.DateTimeField(db_default=Now(), help_text=_("The job does not start before this."))
    attempts = models.PositiveIntegerField(default=0, help_text=_("Attempts started (claims)."))
    max_attempts = models.PositiveIntegerField(default=5)
    visibility_timeout = models.FloatField(
        default=60, help_text=_("Seconds a claim lasts without a heartbeat.")
    )
    # NULL, not "", so the check constraint can say "running iff leased".
    lease_token = models.CharField(max_length=32, null=True, blank=True, editable=False)  # noqa: DJ001
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    worker_id = models.CharField(max_length=128, blank=True, default="")
    enqueued_at = models.DateTimeField(db_default=Now(), editable=False)
    started_at = models.DateTimeField(null=True, blank=True, help_text=_("Claim time of the last attempt."))
    finished_at = models.DateTimeField(null=True, blank=True)
    first_failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    reappearances = models.PositiveIntegerField(
        default=0, help_text=_("Times the lease expired and the job became visible again.")
    )
    lock_contentions = models.PositiveIntegerField(
        default=0, help_text=_("Times the job was put back because its lock was taken.")
    )
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    lock_key = models.CharField(max_length=255, blank=True, default="")
    handler_version = models.CharField(max_length=64, blank=True, default="")
    trace_context = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("W3C trace context of the enqueue (with OPENTELEMETRY on); NULL without."),
    )
    result = models.JSONField(null=True, blank=True)
    # What the handler last reported through ``context.report_progress``: done, total,
    # message and when. Written about once a second by the worker's heartbeat thread.
    progress = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("Last progress the handler reported; NULL if none."),
    )
    # Set by a waiter (``Job.wait``) before it sleeps: only such a job's settlement notifies,
    # so a job nobody waits on costs the worker nothing more.
    waited = models.BooleanField(
        default=False,
        db_default=False,
        editable=False,
        help_text=_("Somebody waits on the outcome: settling it sends a wake-up."),
    )
    checkpoints = models.JSONField(default=dict, blank=True)
    # Appended to by the claim and the failure statements that run anyway, so keeping it
    # costs a successful job no extra statement (see the store package).
    attempt_history = models.JSONField(
        default=list,
        # A database default too, so rows inserted by hand (bulk loads, benchmarks) get [].
        db_default=[],
        blank=True,
        editable=False,
        help_text=_(
            "One entry per attempt: worker_id, started_at, and for a failed one finished_at, "
            "error_class, error and traceback."
        ),
    )
    flow_keys = models.JSONField(
        default=list,
        db_default=[],
        blank=True,
        editable=False,
        help_text=_(
            "The job's keyed flow-control limits, formatted at enqueue: c:<task>|<key> for a "
            "concurrency limit, r:<task>|<key> for a rate."
        ),
    )
    cancel_requested = models.BooleanField(
        db_default=False,
        help_text=_("An operator asked to cancel this running job; its heartbeat tells the handler."),
    )
    # A plain column, not a foreign key: the workflow's record outlives its jobs' pruning.
    workflow_id = models.BigIntegerField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("The workflow (chain, group, batch or dependency graph) this job belongs to."),
    )
    waiting_on = models.PositiveIntegerField(
        db_default=0,
        editable=False,
        help_text=_("Dependencies of this waiting job that have not succeeded yet."),
    )
    # Read back by the ack that marks the job succeeded (a fenced UPDATE, so it sees a
    # dependant added while the job ran): an ack of jobs that nobody waits for skips the
    # dependency lookup, which is most acks of a batch's members. The store inserts jobs
    # with False and a dependency sets its parent's; a row written any other way (the ORM,
    # an older release in a rolling upgrade) gets the default, True, and is looked up.
    has_dependants = models.BooleanField(
        db_default=True,
        editable=False,
        help_text=_(
            "Another job may wait for this one to succeed (a chain's next step, or after=); "
            "its ack then looks its dependants up."
        ),
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        permissions = [
            ("cancel_job", _("Can cancel queued jobs")),
            ("retry_job", _("Can make queued jobs due now")),
        ]
        indexes = [
            # The claim scans only queued rows, so it stays flat however many finished
            # rows pile up.
            models.Index(
                F("queue_name"),
                F("priority").desc(),
                F("run_after"),
                F("id"),
                name="jobguard_job_due_idx",
                condition=Q(status=JobStatus.QUEUED),
            ),
            # The same order for workers that take every queue.
            models.Index(
                F("priority").desc(),
                F("run_after"),
                F("id"),
                name="jobguard_job_due_all_idx",
                condition=Q(status=JobStatus.QUEUED),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="jobguard_job_lease_idx",
                condition=Q(status=JobStatus.RUNNING),
            ),
            # Partial, so that the claim and ack updates of jobs without a key, and of jobs
            # not yet finished, write no entries into these indexes.
            models.Index(
                fields=["idempotency_key"],
                name="jobguard_job_idem_idx",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.Index(
                fields=["status", "finished_at"],
                name="jobguard_job_finished_idx",
                condition=Q(status__in=TERMINAL_STATUSES),
            ),
            # The admin's "enqueued" filter (and its count) at millions of rows; the column
            # never changes after the insert, so only the enqueue writes an entry.
            models.Index(fields=["enqueued_at"], name="jobguard_job_enqueued_idx"),
            # The admin's search by lock key; partial, so jobs without a lock write no entry.
            models.Index(fields=["lock_key"], name="jobguard_job_lock_idx", condition=~Q(lock_key="")),
            # A workflow's members; partial, so plain jobs write no entry.
            models.Index(
                fields=["workflow_id"],
                name="jobguard_job_workflow_idx",
                condition=Q(workflow_id__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100), name="jobguard_job_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(attempts__lte=F("max_attempts")), name="jobguard_job_attempts_le_max"
            ),
            # A running job always holds a lease; no other state does.
            models.CheckConstraint(
                condition=(
                    Q(status=JobStatus.RUNNING, lease_token__isnull=False, lease_expires_at__isnull=False)
                    | (~Q(status=JobStatus.RUNNING) & Q(lease_token__isnull=True))
                ),
                name="jobguard_job_lease_iff_running",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_name}#{self.pk} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def watch(
        self, timeout: float | None = None, *, interval: float = WATCH_INTERVAL_SECONDS
    ) -> Iterator[dict[str, Any]]:
        """Yield the job's :attr:`progress` each time it changes, until the job finishes.

        ``for progress in job.watch(timeout=600): print(progress["done"], progress["total"])``.
        On PostgreSQL the row is read when the worker's write of a new progress (or the
        job's settlement) is notified, through the process's one LISTEN connection (and every
        few seconds as a backstop); on SQLite and MariaDB/MySQL, or inside a transaction, it is
        read every ``interval`` seconds here, so the caller does not poll (the worker writes
        progress about once a second: a shorter interval sees nothing sooner).
        When the job finishes, its last progress is yielded if it changed, the job's fields
        are read again (``status``, ``result``, ``last_error``, ...) and the loop ends.
        Raises :class:`~django_jobguard.exceptions.WaitTimeout` (a ``TimeoutError``) if
        ``timeout`` seconds pass first (None: no limit), and
        :class:`~django_jobguard.exceptions.JobNotFound` if the row is deleted meanwhile.
        Watch outside a transaction: inside one, MariaDB/MySQL's repeatable read would show
        the same row every time.
        """
        rows = self._watched(timeout, interval)
        return self._watch(rows, timeout, interval)

    def awatch(
        self, timeout: float | None = None, *, interval: float = WATCH_INTERVAL_SECONDS
    ) -> AsyncIterator[dict[str, Any]]:
        """:meth:`watch` for async code, without blocking the event loop.

        ``async for progress in job.awatch(timeout=600): ...``: the row is read with the
        async ORM and the waits are ``asyncio.sleep``.
        """
        rows = self._watched(timeout, interval)
        return self._awatch(rows, timeout, interval)

    def _watched(self, timeout: float | None, interval: float) -> JobQuerySet:
        """The job's row to read, once the arguments are known to be good."""
        if self.pk is None:
            raise ValueError("watch(): the job is not saved; enqueue it first")
        if timeout is not None and (not isinstance(timeout, int | float) or not timeout >= 0):
            raise ValueError(
                f"watch(): timeout must be a number of seconds of at least 0, or None; not {timeout!r}"
            )
        if not isinstance(interval, int | float) or not 0 < interval <= MAX_WATCH_INTERVAL_SECONDS:
            raise ValueError(
                f"watch(): interval must be more than 0 and at most {MAX_WATCH_INTERVAL_SECONDS} seconds, "
                f"not {interval!r}"
            )
        return type(self).objects.using(self._state.db).filter(pk=self.pk)

    def _watch_step(self, found: tuple[str, Any] | None, seen: Any) -> tuple[Any, bool]:
        """After one read: the progress to yield (None: nothing new), and whether the job finished."""
        if found is None:
            raise JobNotFound(f"Job {self.pk} was deleted while watched.", job_id=self.pk)
        status, stored = found
        progress = open_progress(stored)  # a message stored encrypted is yielded in clear
        fresh = progress if progress is not None and progress != seen else None
        if fresh is not None:
            self.progress = fresh
        return fresh, status in TERMINAL_STATUSES

    def _watch_wait(self, deadline: float | None, timeout: float | None, interval: float) -> float:
        """Seconds to sleep before the next read; WaitTimeout once the deadline passed."""
        if deadline is None:
            return interval
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"Job {self.pk} did not finish within {timeout:g} s; it may still run.", job_id=self.pk
            )
        return min(interval, left)

    def _watch(self, rows: JobQuerySet, timeout: float | None, interval: float) -> Iterator[dict[str, Any]]:
        # On PostgreSQL the row is read when its progress or settlement is notified; the
        # wake-up sits above the models (it uses the store): imported when called.
        from .results import watch_wakeup

        deadline = None if timeout is None else time.monotonic() + timeout
        seen = open_progress(self.progress)
        if seen is not None:
            yield seen
        wakeup = watch_wakeup(rows.db, self.pk, math.inf if timeout is None else timeout)
        try:
            while True:
                fresh, finished = self._watch_step(rows.values_list("status", "progress").first(), seen)
                if fresh is not None:
                    seen = fresh
                    yield fresh
                if finished:
                    self.refresh_from_db()
                    return
                if wakeup is None:
                    time.sleep(self._watch_wait(deadline, timeout, interval))
                else:
                    wakeup.wait(self._watch_wait(deadline, timeout, math.inf))
        finally:
            if wakeup is not None:
                wakeup.close()

    async def _awatch(
        self, rows: JobQuerySet, timeout: float | None, interval: float
    ) -> AsyncIterator[dict[str, Any]]:
        from .results import awatch_wakeup

        deadline = None if timeout is None else time.monotonic() + timeout
        seen = open_progress(self.progress)
        if seen is not None:
            yield seen
        wakeup = await awatch_wakeup(rows.db, self.pk, math.inf if timeout is None else timeout)
        try:
            while True:
                fresh, finished = self._watch_step(
                    await rows.values_list("status", "progress").afirst(), seen
                )
                if fresh is not None:
                    seen = fresh
                    yield fresh
                if finished:
                    await self.arefresh_from_db()
                    return
                if wakeup is None:
                    await asyncio.sleep(self._watch_wait(deadline, timeout, interval))
                else:
                    await wakeup.wait(self._watch_wait(deadline, timeout, math.inf))
        finally:
            if wakeup is not None:
                wakeup.close()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the job settles and return its stored result.

        ``timeout``: seconds to wait at most (None: no limit; 0: look once). Raises
        :class:`~django_jobguard.exceptions.WaitTimeout` (a ``TimeoutError``) when it passes,
        :class:`~django_jobguard.exceptions.JobFailed` for a dead job (its final error's class
        and message), :class:`~django_jobguard.exceptions.JobCancelled`,
        :class:`~django_jobguard.exceptions.ResultExpired` for a result past its retention,
        :class:`~django_jobguard.exceptions.ResultNotStored` for a task that keeps none,
        :class:`~django_jobguard.exceptions.JobNotFound`. A job retried meanwhile (a worker
        lost mid-job) is waited for until its last attempt settles. Not inside an atomic
        block: the job's outcome could not be seen from there.
        """
        # The waiting service sits above the models (it uses the store): imported when called.
        from .results import wait

        return wait(self, timeout)

    async def await_result(self, timeout: float | None = None) -> Any:
        """:meth:`wait` from async code, without blocking the event loop.

        (Django would call it ``await``, after ``wait``, as it names ``arefresh`` after
        ``refresh``; ``await`` is a keyword.) Many coroutines of one process may wait at once:
        they share one LISTEN connection and one database connection.
        """
        from .results import await_result

        return await await_result(self, timeout)


class IdempotencyStatus(models.TextChoices):
    IN_PROGRESS = "in_progress", _("in progress")
    SUCCEEDED = "succeeded", _("succeeded")
    FAILED = "failed", _("failed")


class IdempotencyKeyQuerySet(models.QuerySet["IdempotencyKey"]):
    def live(self) -> IdempotencyKeyQuerySet:
        return self.filter(expires_at__gt=Now())

    def expired(self) -> IdempotencyKeyQuerySet:
        return self.filter(expires_at__lte=Now())


class IdempotencyKey(models.Model):
    """A business action's identity (``charge:order:123``), and what became of it."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=255)
    scope = models.CharField(max_length=255, help_text=_("The task name unless configured otherwise."))
    fingerprint = models.CharField(
        max_length=64, help_text=_("HMAC-SHA256 (keyed with SECRET_KEY) of the canonical arguments.")
    )
    status = models.CharField(
        max_length=16, choices=IdempotencyStatus.choices, default=IdempotencyStatus.IN_PROGRESS
    )
    result = models.JSONField(null=True, blank=True)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="idempotency_keys"
    )
    duplicates = models.PositiveIntegerField(default=0, help_text=_("Duplicates this key prevented."))
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    objects = IdempotencyKeyQuerySet.as_manager()

    class Meta:
        verbose_name = _("idempotency key")
        verbose_name_plural = _("idempotency keys")
        constraints = [
            # The final guard: two concurrent writers cannot both own one key. The key leads,
            # so the admin's search by key alone uses this index too.
            models.UniqueConstraint(fields=["key", "scope"], name="jobguard_idem_key_scope_uniq"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="jobguard_idem_expires_idx")]

    def __str__(self) -> str:
        # Not the key: it is made of the call's arguments, and titles and the admin log show this.
        return f"{self.scope} key #{self.pk} ({self.status})"


class DeadLetterReason(models.TextChoices):
    """Why a job was dead-lettered."""

    PERMANENT_ERROR = "permanent_error", _("permanent error")
    RETRIES_EXHAUSTED = "retries_exhausted", _("retries exhausted")
    LEASE_EXPIRED = "lease_expired", _("lease expired on the last attempt")
    UNKNOWN_TASK = "unknown_task", _("task not registered")
    INVALID_PAYLOAD = "invalid_payload", _("payload does not fit the task")
    INVALID_RESULT = "invalid_result", _("return value refused (not JSON, or too large)")
    HARD_TIMEOUT = "hard_timeout", _("ran past its hard timeout")


class ReplayState(models.TextChoices):
    NONE = "none", _("none")
    REQUESTED = "requested", _("requested")
    APPROVED = "approved", _("approved")
    REJECTED = "rejected", _("rejected")
    REPLAYED = "replayed", _("replayed")


class DeadLetterQuerySet(models.QuerySet["DeadLetter"]):
    def pending_approval(self) -> DeadLetterQuerySet:
        return self.filter(replay_state=ReplayState.REQUESTED)

    def awaiting_redrive(self) -> DeadLetterQuerySet:
        return self.filter(replay_state=ReplayState.APPROVED)


class DeadLetter(models.Model):
    """A job that will not be retried again, kept whole for diagnosis and approved replay."""

    id = models.BigAutoField(primary_key=True)
    job = models.OneToOneField(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="dead_letter"
    )
    task_name = models.CharField(max_length=255)
    queue_name = models.CharField(max_length=100)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveIntegerField()
    max_attempts = models.PositiveIntegerField()
    reason = models.CharField(max_length=32, choices=DeadLetterReason.choices)
    category = models.CharField(max_length=16, choices=ErrorCategory.choices)
    error_class = models.CharField(max_length=255, blank=True, default="")
    error_message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    first_failed_at = models.DateTimeField()
    last_failed_at = models.DateTimeField()
    handler_version = models.CharField(max_length=64, blank=True, default="")
    worker_id = models.CharField(max_length=128, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL: no key
    lock_key = models.CharField(max_length=255, blank=True, default="")
    trace_context = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text=_("The dead job's trace context; a replay links to it."),
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    replay_state = models.CharField(max_length=16, choices=ReplayState.choices, default=ReplayState.NONE)
    replay_args = models.JSONField(null=True, blank=True, help_text=_("Corrected args for the replay."))
    replay_kwargs = models.JSONField(null=True, blank=True, help_text=_("Corrected kwargs for the replay."))
    replay_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    replay_requested_at = models.DateTimeField(null=True, blank=True)
    replay_reason = models.TextField(blank=True, default="")
    replay_decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    replay_decided_at = models.DateTimeField(null=True, blank=True)
    replay_job = models.OneToOneField(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="replayed_from"
    )
    replayed_at = models.DateTimeField(null=True, blank=True)

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        verbose_name = _("dead letter")
        verbose_name_plural = _("dead letters")
        ordering = ["-created_at", "-id"]
        permissions = [
            ("request_replay", _("Can request a dead-letter replay")),
            ("approve_replay", _("Can approve or reject a dead-letter replay")),
            ("view_payload", _("Can view job payloads and tracebacks")),
        ]
        indexes = [
            models.Index(fields=["replay_state", "replay_decided_at"], name="jobguard_dl_replay_idx"),
            models.Index(fields=["queue_name", "created_at"], name="jobguard_dl_queue_idx"),
            models.Index(fields=["task_name", "created_at"], name="jobguard_dl_task_idx"),
            # The admin's search (whole values): error class, lock key, idempotency key.
            models.Index(fields=["error_class"], name="jobguard_dl_error_idx"),
            models.Index(fields=["lock_key"], name="jobguard_dl_lock_idx", condition=~Q(lock_key="")),
            models.Index(
                fields=["idempotency_key"],
                name="jobguard_dl_idem_idx",
                condition=Q(idempotency_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} dead letter #{self.pk} ({self.reason})"

    @property
    def payload(self) -> dict[str, Any]:
        """The job's arguments in clear, opened if its task stores them encrypted (the fields
        hold what is stored: ciphertexts then). Raises DecryptionError without their key."""
        return {
            "args": open_json(self.args, ARGS, "dead_letter.args"),
            "kwargs": open_json(self.kwargs, KWARGS, "dead_letter.kwargs"),
        }

    @property
    def clear_error(self) -> tuple[str, str]:
        """``(error_message, traceback)`` in clear, opened if they are stored encrypted."""
        return (
            open_text(self.error_message, ERROR, "dead_letter.error_message"),
            open_text(self.traceback, TRACEBACK, "dead_letter.traceback"),
        )


class ReplayAction(models.TextChoices):
    REQUESTED = "requested", _("requested")
    APPROVED = "approved", _("approved")
    REJECTED = "rejected", _("rejected")
    REPLAYED = "replayed", _("replayed")


class ReplayEvent(models.Model):
    """One step of a dead letter's replay: who, when, why. Append-only."""

    id = models.BigAutoField(primary_key=True)
    dead_letter = models.ForeignKey(DeadLetter, on_delete=models.CASCADE, related_name="replay_events")
    action = models.CharField(max_length=16, choices=ReplayAction.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(
        max_length=150, blank=True, default="", help_text=_("Kept if the user goes.")
    )
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("replay event")
        verbose_name_plural = _("replay events")
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_name or 'system'}"


class ReplayRateChange(models.Model):
    """One change of the redrive rate from the console: who, when, why. Append-only.

    The newest row is the rate in force (``rate_per_minute`` NULL: back to
    ``JOBGUARD["REPLAY"]["RATE_PER_MINUTE"]``); every redrive pass reads it, so a change
    reaches every worker within one ``REAPER_INTERVAL``. No row: the setting.
    """

    id = models.BigAutoField(primary_key=True)
    rate_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Redrives a minute across all workers; empty: the setting.")
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(
        max_length=150, blank=True, default="", help_text=_("Kept if the user goes.")
    )
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("redrive rate change")
        verbose_name_plural = _("redrive rate changes")
        ordering = ["-id"]

    def __str__(self) -> str:
        rate = "the setting" if self.rate_per_minute is None else f"{self.rate_per_minute}/min"
        return f"redrive rate {rate} by {self.actor_name or 'system'}"


class Lock(models.Model):
    """A lock of the database lock back end: one row per key, kept to carry the fencing counter."""

    key = models.CharField(max_length=255, primary_key=True)
    token = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001 - NULL: free
    expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("lock")
        verbose_name_plural = _("locks")
        permissions = [("force_release_lock", _("Can force the release of a stuck lock"))]

    def __str__(self) -> str:
        return self.key


class MissedPolicy(models.TextChoices):
    """What a schedule does with ticks no scheduler enqueued in time (after an outage)."""

    SKIP = "skip", _("skip: enqueue none of them")
    RUN_ONCE = "run_once", _("run once: one job for the latest")
    CATCH_UP = "catch_up", _("catch up: one job for each (bounded)")


class ScheduleSource(models.TextChoices):
    CODE = "code", _("code (@task schedule=)")
    SETTINGS = "settings", _("settings (JOBGUARD['SCHEDULES'])")


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    """Named states of schedules."""

    def active(self) -> ScheduleQuerySet:
        """Declared and not paused: the scheduler ticks these."""
        return self.filter(paused=False, removed_at__isnull=True)

    def due(self) -> ScheduleQuerySet:
        """Active schedules whose next tick has come (database clock)."""
        return self.active().filter(next_tick_at__lte=Now())

    def removed(self) -> ScheduleQuerySet:
        """Rows whose schedule is no longer declared anywhere: never ticked, kept to be seen."""
        return self.filter(removed_at__isnull=False)


class Schedule(models.Model):
    """A recurring job: its definition (synced from code and settings) and where its ticks stand.

    Every worker's scheduler may tick it; the one that advances ``next_tick_at`` (a
    compare-and-set in the transaction that inserts the tick's job) is the only one whose
    job commits.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200, unique=True)
    task_name = models.CharField(_("task"), max_length=255)
    cron = models.CharField(
        max_length=255, help_text=_("Cron expression (five fields, or six with seconds).")
    )
    timezone = models.CharField(
        max_length=64, default="UTC", help_text=_("IANA time zone of the cron fields.")
    )
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue_name = models.CharField(
        _("queue"), max_length=100, blank=True, default="", help_text=_("Empty: the task's queue.")
    )
    missed = models.CharField(max_length=16, choices=MissedPolicy.choices, default=MissedPolicy.RUN_ONCE)
    source = models.CharField(max_length=16, choices=ScheduleSource.choices, default=ScheduleSource.SETTINGS)
    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    next_tick_at = models.DateTimeField(null=True, blank=True, help_text=_("The next tick to enqueue (UTC)."))
    last_tick_at = models.DateTimeField(null=True, blank=True, help_text=_("The last tick enqueued (UTC)."))
    last_job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    removed_at = models.DateTimeField(
        null=True, blank=True, help_text=_("When a worker found the schedule no longer declared.")
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ["name"]
        permissions = [
            ("pause_schedule", _("Can pause and resume schedules")),
            ("run_schedule", _("Can run a schedule now (an extra job)")),
        ]
        indexes = [
            models.Index(
                fields=["next_tick_at"],
                name="jobguard_schedule_due_idx",
                condition=Q(paused=False, removed_at__isnull=True),
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def state(self) -> str:
        """``removed``, ``paused`` or ``active``."""
        if self.removed_at is not None:
            return "removed"
        return "paused" if self.paused else "active"


class QueueState(models.Model):
    """Whether a queue is paused, and who paused it when and why: one row per queue ever paused.

    Every claim reads the paused rows (on PostgreSQL, inside the claim statement), so a pause
    reaches every host within one poll. A queue without a row is running.
    """

    queue_name = models.CharField(_("queue"), max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_by_name = models.CharField(
        max_length=150, blank=True, default="", help_text=_("Kept if the user goes.")
    )
    changed_at = models.DateTimeField(db_default=Now())
    reason = models.TextField(blank=True, default="")

    class Meta:
        # The admin lists this model as "Queues": its page is the queue health page.
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        permissions = [("pause_queue", _("Can pause and resume queues"))]
        indexes = [
            # The workers' per-poll read: only the few paused rows.
            models.Index(fields=["queue_name"], name="jobguard_queue_paused_idx", condition=Q(paused=True)),
        ]

    def __str__(self) -> str:
        return f"{self.queue_name} ({'paused' if self.paused else 'running'})"


class QueueAction(models.TextChoices):
    PAUSED = "paused", _("paused")
    RESUMED = "resumed", _("resumed")


class QueueEvent(models.Model):
    """One pause or resume of a queue: who, when, why. Append-only."""

    id = models.BigAutoField(primary_key=True)
    queue_name = models.CharField(_("queue"), max_length=100)
    action = models.CharField(max_length=16, choices=QueueAction.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(
        max_length=150, blank=True, default="", help_text=_("Kept if the user goes.")
    )
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("queue event")
        verbose_name_plural = _("queue events")
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["queue_name", "created_at"], name="jobguard_queue_event_idx")]

    def __str__(self) -> str:
        return f"{self.queue_name} {self.action} by {self.actor_name or 'system'}"


class QueueMinute(models.Model):
    """Outcomes of one queue in one minute, and the oldest due job's age then: the health charts.

    Workers count outcomes in memory and add them here once per beat interval (one
    statement for all queues, never one per job); a worker also samples the oldest due
    age once a minute. Rows older than a day are pruned by the same writer.
    """

    id = models.BigAutoField(primary_key=True)
    queue_name = models.CharField(_("queue"), max_length=100)
    minute = models.DateTimeField(help_text=_("Start of the minute (UTC)."))
    succeeded = models.PositiveIntegerField(db_default=0)
    failed = models.PositiveIntegerField(db_default=0, help_text=_("Failed attempts."))
    retried = models.PositiveIntegerField(db_default=0, help_text=_("Failed attempts scheduled for a retry."))
    dead_lettered = models.PositiveIntegerField(db_default=0)
    oldest_age_seconds = models.FloatField(
        null=True, blank=True, help_text=_("Largest sample in the minute.")
    )

    class Meta:
        verbose_name = _("queue minute")
        verbose_name_plural = _("queue minutes")
        constraints = [
            models.UniqueConstraint(fields=["queue_name", "minute"], name="jobguard_queue_minute_uniq"),
        ]
        indexes = [models.Index(fields=["minute"], name="jobguard_queue_minute_idx")]

    def __str__(self) -> str:
        return f"{self.queue_name} {self.minute:%H:%M}"


class WorkerBeat(models.Model):
    """One worker process as its last beat reported it (one upsert per beat interval)."""

    worker_id = models.CharField(max_length=128, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.CharField(max_length=1000, help_text=_("Comma-separated; * for every queue."))
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_beat_at = models.DateTimeField(help_text=_("Database clock."))
    jobs_in_hand = models.PositiveIntegerField(default=0, help_text=_("Jobs claimed and not yet settled."))
    async_slots = models.PositiveIntegerField(
        default=0, help_text=_("Coroutines it runs at once on its event loop (--async-slots); 0: none.")
    )
    async_in_use = models.PositiveIntegerField(default=0, help_text=_("Coroutines running at its last beat."))
    loop_lag_ms = models.PositiveIntegerField(
        default=0, help_text=_("The event loop's worst lag since the beat before, in milliseconds.")
    )

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering = ["-last_beat_at"]
        indexes = [models.Index(fields=["last_beat_at"], name="jobguard_worker_beat_idx")]

    def __str__(self) -> str:
        return self.worker_id


class LockRelease(models.Model):
    """One forced release of a database lock by an operator: who, when, why. Append-only."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=255)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(
        max_length=150, blank=True, default="", help_text=_("Kept if the user goes.")
    )
    reason = models.TextField()
    fencing_token = models.BigIntegerField(help_text=_("The key's fencing counter after the release."))
    holder_job_id = models.BigIntegerField(
        null=True, blank=True, help_text=_("The job that held it, if known.")
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("forced lock release")
        verbose_name_plural = _("forced lock releases")
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.key} released by {self.actor_name or 'system'}"


class FlowRate(models.Model):
    """The rate state of one flow-control rate key: its theoretical arrival time (GCRA).

    Written by the claim, under the flow-control claims' lock, for the keys it admitted
    jobs of; a row whose time has passed holds no state (the key is idle) and may be deleted.
    On MariaDB/MySQL one row, ``flow:turn`` (``tat`` 0), is that lock: it is kept.
    """

    key = models.CharField(max_length=255, primary_key=True)
    #: Seconds since the epoch, on the database clock: when the key's next start is due at
    #: the steady rate (starts run ahead of it by up to the burst).
    tat = models.FloatField()

    class Meta:
        verbose_name = _("flow-control rate")
        verbose_name_plural = _("flow-control rates")
        indexes = [models.Index(fields=["tat"], name="jobguard_flowrate_tat_idx")]

    def __str__(self) -> str:
        return self.key


class WorkflowKind(models.TextChoices):
    CHAIN = "chain", _("chain")
    GROUP = "group", _("group")
    BATCH = "batch", _("batch")
    GRAPH = "graph", _("dependency graph")


class WorkflowState(models.TextChoices):
    """open (members may still be added) → closed (the set is final) → finished (all settled)."""

    OPEN = "open", _("open")
    CLOSED = "closed", _("closed")
    FINISHED = "finished", _("finished")


#: Counter rows per workflow, at most: a member's completion updates the row of
#: ``job id % SHARDS``, so concurrent completions rarely wait on one another's row. A row
#: is written when its first member joins: a three-step chain has three, a large batch 256.
WORKFLOW_COUNTER_SHARDS = 256


class Workflow(models.Model):
    """A set of jobs settled together: a chain, a group, a batch or a dependency graph.

    Its progress lives in :class:`WorkflowCounter` rows; its callbacks (prepared job rows)
    are enqueued once, by whichever completion settles its last member.
    """

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=WorkflowKind.choices)
    state = models.CharField(max_length=16, choices=WorkflowState.choices, default=WorkflowState.OPEN)
    name = models.CharField(max_length=255, blank=True, default="")
    callbacks = models.JSONField(
        default=dict,
        blank=True,
        help_text=_("Prepared callback jobs by when they run: success, complete, dead."),
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    closed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        indexes = [
            models.Index(
                fields=["created_at"],
                name="jobguard_workflow_unfinished",
                condition=~Q(state="finished"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}#{self.pk} ({self.state})"


class WorkflowCounter(models.Model):
    """One shard of a workflow's progress: members not settled yet, succeeded, failed."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="counters")
    shard = models.PositiveSmallIntegerField()
    pending = models.IntegerField(default=0)
    succeeded = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow", "shard"], name="jobguard_wfcounter_unique"),
        ]

    def __str__(self) -> str:
        return f"workflow {self.workflow_id} shard {self.shard}"


class WorkflowCallback(models.Model):
    """A callback that was enqueued: unique per (workflow, when), so it is enqueued once."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="callbacks_run")
    when = models.CharField(max_length=16)
    job_id = models.BigIntegerField()
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow", "when"], name="jobguard_wfcallback_unique"),
        ]

    def __str__(self) -> str:
        return f"workflow {self.workflow_id} on_{self.when}: job {self.job_id}"


class JobDependency(models.Model):
    """``child`` waits until ``parent`` succeeded (plain ids: jobs may be pruned first)."""

    parent_id = models.BigIntegerField()
    child_id = models.BigIntegerField()
    #: The child's keyword argument that receives the parent's result, "*" for its first
    #: positional argument (``receives()`` with no name), or "" for none.
    result_as = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["parent_id", "child_id"], name="jobguard_jobdep_unique"),
        ]
        indexes = [models.Index(fields=["child_id"], name="jobguard_jobdep_child_idx")]

    def __str__(self) -> str:
        return f"job {self.child_id} after job {self.parent_id}"


class BreakerState(models.TextChoices):
    CLOSED = "closed", _("closed")
    OPEN = "open", _("open")
    HALF_OPEN = "half_open", _("half-open")


class Breaker(models.Model):
    """A named limit's circuit breaker and retry budget: one row per ``JOBGUARD["LIMITS"]`` entry.

    Every limited claim reads these rows under the flow-control claims' lock: an open breaker's
    jobs are left queued (no attempt charged), a half-open one admits its probes, a spent
    budget leaves retries queued. Outcomes of the dependency's jobs update the window counts.
    Times are seconds since the epoch on the database clock.
    """

    name = models.CharField(_("limit"), max_length=100, primary_key=True)
    state = models.CharField(max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED)
    #: When an open breaker half-opens; None while it is held open by hand.
    open_until = models.FloatField(null=True, blank=True)
    #: Opened or closed by an operator: the counts do not move it until it is changed again.
    manual = models.BooleanField(default=False)
    #: Half-open: probes admitted so far, and since when it is half-open.
    probes = models.IntegerField(default=0)
    half_open_since = models.FloatField(null=True, blank=True)
    #: The breaker's current window: its start, the attempts that ended in it, the failed ones.
    window_start = models.FloatField(default=0)
    calls = models.IntegerField(default=0)
    failures = models.IntegerField(default=0)
    #: The retry budget's current window: its start, first attempts and retries started in it.
    budget_start = models.FloatField(default=0)
    first_attempts = models.IntegerField(default=0)
    retries = models.IntegerField(default=0)
    changed_at = models.DateTimeField(db_default=Now())
    changed_by_name = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = _("circuit breaker")
        verbose_name_plural = _("circuit breakers")
        permissions = [("operate_breaker", _("Can open and close circuit breakers"))]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class BreakerEvent(models.Model):
    """One state change of a breaker, by the fleet or by an operator: who, when, why. Append-only."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("limit"), max_length=100)
    from_state = models.CharField(max_length=16, choices=BreakerState.choices)
    to_state = models.CharField(max_length=16, choices=BreakerState.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(
        max_length=150, blank=True, default="", help_text=_("Kept if the user goes; 'system' for the fleet.")
    )
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("breaker event")
        verbose_name_plural = _("breaker events")
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["name", "created_at"], name="jobguard_breaker_event_idx")]

    def __str__(self) -> str:
        return f"{self.name} {self.from_state} -> {self.to_state} by {self.actor_name or 'system'}"


class OutboxState(models.TextChoices):
    """Life cycle of an outbox message: pending → delivered | dead (→ pending again, or skipped)."""

    PENDING = "pending", _("pending")
    DELIVERED = "delivered", _("delivered")
    #: Out of attempts, or refused for good by its destination: waits for an operator
    #: (replay or skip) with ON_FAILURE "hold"; set aside with "skip".
    DEAD = "dead", _("dead")
    #: A dead message an operator chose not to deliver: its key moved on.
    SKIPPED = "skipped", _("skipped")


class OutboxMessage(models.Model):
    """One message ``publish()`` wrote in its caller's transaction, for the relay to deliver.

    ``seq`` is the message's place in its (destination, key) commit order: 1, 2, 3, ... with
    no gap, since the number is taken under the key's row lock and a rolled-back publish takes
    its number back with it. ``message_id`` never changes: a consumer deduplicates on it.
    """

    id = models.BigAutoField(primary_key=True)
    message_id = models.UUIDField(unique=True, editable=False)
    destination = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    seq = models.BigIntegerField()
    payload = models.JSONField()
    headers = models.JSONField(default=dict, blank=True)
    published_at = models.DateTimeField(db_default=Now(), editable=False)
    state = models.CharField(max_length=16, choices=OutboxState.choices, default=OutboxState.PENDING)
    #: Sends tried so far (the next one's Envelope.attempt is this plus one).
    attempts = models.IntegerField(default=0)
    #: A retry's earliest time (database clock); None: at once.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    #: The operator's last decision on a dead message ("replayed" or "skipped"), who and why.
    resolution = models.CharField(max_length=16, blank=True, default="")
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolution_reason = models.TextField(blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        constraints = [
            models.UniqueConstraint(fields=["destination", "key", "seq"], name="jobguard_outbox_seq_uniq"),
        ]
        indexes = [
            # The relay's claim finds keys with work from their pending messages (oldest first):
            # an index as small as the backlog, however many delivered messages are kept.
            models.Index(
                fields=["destination", "key", "id"],
                name="jobguard_outbox_pending",
                condition=Q(state="pending"),
            ),
            # Dead messages by destination, for the metrics and the health page: a scrape
            # reads these few rows, not the whole table of delivered ones.
            models.Index(
                fields=["destination", "id"],
                name="jobguard_outbox_dead",
                condition=Q(state="dead"),
            ),
        ]
        permissions = [("operate_outbox", _("Can replay and skip outbox messages"))]

    def __str__(self) -> str:
        return f"{self.destination}/{self.key}#{self.seq} ({self.state})"


class OutboxKey(models.Model):
    """The publish side of a (destination, key): the last ``seq`` given out.

    ``publish()`` increments it with one upsert and holds the row's lock until its transaction
    ends, so a key's publishers commit one after the other, in ``seq`` order; other keys' never
    wait. The relay never writes this row, so it never blocks a publisher.
    """

    id = models.BigAutoField(primary_key=True)
    destination = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    last_seq = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = _("outbox key")
        verbose_name_plural = _("outbox keys")
        constraints = [
            models.UniqueConstraint(fields=["destination", "key"], name="jobguard_outbox_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.destination}/{self.key}@{self.last_seq}"


class OutboxCursor(models.Model):
    """The relay side of a (destination, key): how far it was delivered, its lease, its hold.

    Created by the relay the first time it takes the key. ``delivered_seq`` is the last
    message settled (delivered, or dead and passed over); ``held_seq`` the dead message that
    holds the key, if any; a lease (owner token and expiry, database clock) gives the key to
    one relay thread at a time; ``retry_at`` is the earliest time the next message may be tried.
    """

    id = models.BigAutoField(primary_key=True)
    destination = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    delivered_seq = models.BigIntegerField(default=0)
    held_seq = models.BigIntegerField(null=True, blank=True)
    lease_token = models.CharField(max_length=64, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("outbox cursor")
        verbose_name_plural = _("outbox cursors")
        constraints = [
            models.UniqueConstraint(fields=["destination", "key"], name="jobguard_outbox_cursor_uniq"),
        ]
        indexes = [
            # The keys a relay holds, by destination: a destination that names a limit with a
            # concurrency has them counted at each claim (store/outbox.py), in the few leased
            # rows, not in every key it ever had (51 ms at 200,000 keys without it, 0.6 ms with).
            models.Index(fields=["destination"], name="jobguard_outbox_leased", condition=~Q(lease_token="")),
        ]

    def __str__(self) -> str:
        held = f" held at {self.held_seq}" if self.held_seq is not None else ""
        return f"{self.destination}/{self.key}@{self.delivered_seq}{held}"
