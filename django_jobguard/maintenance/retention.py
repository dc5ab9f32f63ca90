"""Retention: what may be deleted, and when. Every pruning rule of the app lives here.

Expired idempotency keys, old finished jobs, idle lock rows (their SQL in
:mod:`django_jobguard.store.locks`), old attempt history, and the console's per-minute and
worker rows (:func:`prune_console_rows`, from :mod:`django_jobguard.store.beats`: the
worker's beat prunes them, and monitoring sits below maintenance, so their rule lives in the
store both import).

``manage.py jobguard_prune`` calls :func:`prune`; the worker prunes keys on its own when
``JOBGUARD["IDEMPOTENCY"]["PRUNE_IN_WORKER"]`` is on. Nothing that a queued or running job
needs goes: a key stays while a job that owns or carries it is queued or running, and a
job stays while a live key or a dead letter refers to it. The same rules, without the age,
say what the admin may delete by hand (:func:`deletable_jobs`, :func:`deletable_keys`).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from ..conf import get_settings
from ..models import (
    TERMINAL_STATUSES,
    DeadLetter,
    FlowRate,
    IdempotencyKey,
    IdempotencyStatus,
    Job,
    JobStatus,
    Schedule,
)
from ..store import FLOW_TURN_KEY
from ..store import locks as lock_rows
from ..store.beats import CONSOLE_ROWS_KEPT_FOR_SECONDS, prune_console_rows

__all__ = [
    "CONSOLE_ROWS_KEPT_FOR_SECONDS",
    "JOB_DELETION_RULE",
    "KEY_DELETION_RULE",
    "LOCK_ROWS_KEPT_FOR",
    "PruneReport",
    "deletable_jobs",
    "deletable_keys",
    "delete_jobs",
    "delete_keys",
    "prunable_jobs",
    "prunable_keys",
    "prune",
    "prune_attempt_history",
    "prune_console_rows",
    "prune_expired_keys",
    "prune_finished_jobs",
]

#: Keys deleted per statement when pruning, so no statement holds many row locks.
KEY_BATCH_SIZE = 1000
#: With JOBGUARD["IDEMPOTENCY"]["PRUNE_IN_WORKER"]: seconds between a worker's prune passes,
#: and keys deleted per pass (one batch, so the claim loop is never held up for long).
WORKER_PRUNE_INTERVAL_SECONDS = 60.0
WORKER_PRUNE_BATCH_SIZE = 500

#: Jobs deleted per transaction: small enough that no batch holds locks for long.
JOB_BATCH_SIZE = 500
#: How long a database lock's row is kept after its release (or its expiry): a key used
#: again within it reuses its row.
LOCK_ROWS_KEPT_FOR = datetime.timedelta(days=1)
#: How long a flow-control rate key's row is kept after its arrival time passed: a row in the
#: past holds no state (the key is idle), so deleting it only costs its next start an insert.
FLOW_RATE_ROWS_KEPT_FOR = datetime.timedelta(hours=1)


@dataclasses.dataclass(frozen=True, slots=True)
class PruneReport:
    """What :func:`prune` deleted (or, in a dry run, would delete)."""

    keys: int
    jobs: int | None
    dry_run: bool
    #: Rows of database locks released or expired more than :data:`LOCK_ROWS_KEPT_FOR` ago.
    locks: int = 0
    #: Finished jobs whose attempt history was trimmed (None: not asked for).
    histories: int | None = None
    #: Flow-control rate keys idle for more than :data:`FLOW_RATE_ROWS_KEPT_FOR`.
    flow_rates: int = 0


#: The rule of :func:`deletable_jobs`, for the surfaces that refuse a deletion.
JOB_DELETION_RULE = (
    "Only a finished job (succeeded, dead or cancelled) that no dead letter and no live "
    "idempotency key refers to can be deleted; the others are kept for the audit trail, "
    "replays and deduplication."
)
#: The rule of :func:`deletable_keys`.
KEY_DELETION_RULE = (
    "An idempotency key that a queued or running job owns or carries, or a live key of an "
    "action that succeeded, cannot be deleted: either would let the action run twice."
)


def deletable_jobs(alias: str) -> Any:
    """Jobs that may be deleted by hand: finished, and no live key or dead letter refers to them.

    Deleting one cannot break what :func:`~django_jobguard.monitoring.audit.audit` checks: it is not
    running, no dead letter loses its job (or its replay job), and no live key loses the job
    it answers resends with.
    """

    return (
        Job.objects.using(alias)
        .filter(status__in=TERMINAL_STATUSES)
        # A live key answers resends with this job; a dead letter's history needs its job
        # and the job that replayed it.
        .exclude(Exists(IdempotencyKey.objects.filter(job_id=OuterRef("pk"), expires_at__gt=Now())))
        .exclude(Exists(DeadLetter.objects.filter(job_id=OuterRef("pk"))))
        .exclude(Exists(DeadLetter.objects.filter(replay_job_id=OuterRef("pk"))))
    )


def deletable_keys(alias: str) -> Any:
    """Idempotency keys that may be deleted by hand without letting an action run twice.

    Neither a queued or running job owns or carries the key (a duplicate would run beside
    it), nor is it a live record of a succeeded action (a resend would run it again).
    Expired keys, and failed or stuck keys of finished jobs (what the audit asks to fix),
    may go.
    """

    active = (JobStatus.QUEUED, JobStatus.RUNNING)
    return (
        IdempotencyKey.objects.using(alias)
        .exclude(status=IdempotencyStatus.SUCCEEDED, expires_at__gt=Now())
        .exclude(Exists(Job.objects.filter(pk=OuterRef("job_id"), status__in=active)))
        .exclude(Exists(Job.objects.filter(idempotency_key=OuterRef("key"), status__in=active)))
    )


def delete_jobs(ids: Any, alias: str | None = None) -> int:
    """Delete those of ``ids`` that :func:`deletable_jobs` allows (checked by the DELETE); the number."""

    alias = alias or get_settings().database_alias
    with transaction.atomic(using=alias):
        _, per_model = deletable_jobs(alias).filter(pk__in=list(ids)).delete()
    return int(per_model.get(Job._meta.label, 0))


def delete_keys(ids: Any, alias: str | None = None) -> int:
    """Delete those of ``ids`` that :func:`deletable_keys` allows; the number deleted."""

    alias = alias or get_settings().database_alias
    with transaction.atomic(using=alias):
        _, per_model = deletable_keys(alias).filter(pk__in=list(ids)).delete()
    return int(per_model.get(IdempotencyKey._meta.label, 0))


def prunable_jobs(alias: str, finished_before: datetime.datetime) -> Any:
    """Finished jobs older than ``finished_before`` that no live key or dead letter refers to."""
    return deletable_jobs(alias).filter(finished_at__lt=finished_before)


def prune_finished_jobs(
    alias: str | None = None,
    *,
    older_than: datetime.timedelta,
    batch_size: int = JOB_BATCH_SIZE,
    dry_run: bool = False,
) -> int:
    """Delete finished jobs older than ``older_than`` (see :func:`prunable_jobs`); the number deleted."""

    alias = alias or get_settings().database_alias
    finished_before = timezone.now() - older_than
    if dry_run:
        return int(prunable_jobs(alias, finished_before).count())
    deleted = 0
    while True:
        ids = list(
            prunable_jobs(alias, finished_before).order_by("pk").values_list("pk", flat=True)[:batch_size]
        )
        if not ids:
            return deleted
        # Re-checked by the delete; the ORM sets expired keys' job to NULL in the same transaction.
        _, per_model = prunable_jobs(alias, finished_before).filter(pk__in=ids).only("pk").delete()
        deleted += int(per_model.get(Job._meta.label, 0))
        if len(ids) < batch_size:
            return deleted


def _long_histories(alias: str, finished_before: datetime.datetime) -> Any:
    # More than one attempt, or one that still carries its traceback: what trimming shrinks.
    return Job.objects.using(alias).filter(
        Q(attempt_history__1__isnull=False) | Q(attempt_history__0__traceback__isnull=False),
        status__in=TERMINAL_STATUSES,
        finished_at__lt=finished_before,
    )


def prune_attempt_history(
    alias: str | None = None,
    *,
    older_than: datetime.timedelta,
    batch_size: int = JOB_BATCH_SIZE,
    dry_run: bool = False,
) -> int:
    """Trim the attempt history of jobs finished more than ``older_than`` ago; how many jobs.

    Each keeps its last attempt (worker, times, error class and message) without the
    traceback: every attempt's error text is stored in the row, so a job that failed many
    times, kept for its dead letter (which has its own copy of the last error and traceback),
    would otherwise hold them all forever. The job's timeline then shows that last attempt.
    """
    alias = alias or get_settings().database_alias
    finished_before = timezone.now() - older_than
    if dry_run:
        return int(_long_histories(alias, finished_before).count())
    trimmed = 0
    while True:
        rows = list(
            _long_histories(alias, finished_before)
            .order_by("pk")
            .values_list("pk", "attempt_history")[:batch_size]
        )
        if not rows:
            return trimmed
        with transaction.atomic(using=alias):
            for pk, history in rows:
                last = {key: value for key, value in history[-1].items() if key != "traceback"}
                # Only while still finished: a job replayed or re-queued since keeps its history.
                trimmed += (
                    Job.objects.using(alias)
                    .filter(pk=pk, status__in=TERMINAL_STATUSES)
                    .update(attempt_history=[last])
                )
        if len(rows) < batch_size:
            return trimmed


def prunable_keys(alias: str) -> Any:
    """Expired keys that no queued or running job owns or carries."""
    active = (JobStatus.QUEUED, JobStatus.RUNNING)
    return (
        IdempotencyKey.objects.using(alias)
        .filter(expires_at__lte=Now())
        .exclude(Exists(Job.objects.filter(pk=OuterRef("job_id"), status__in=active)))
        # A job created outside enqueue (a replay, a resend) may carry the key without owning it.
        .exclude(Exists(Job.objects.filter(idempotency_key=OuterRef("key"), status__in=active)))
    )


def prune_expired_keys(
    alias: str | None = None,
    *,
    batch_size: int = KEY_BATCH_SIZE,
    max_batches: int | None = None,
    dry_run: bool = False,
) -> int:
    """Delete expired keys whose job is not queued or running, in batches; the number deleted.

    ``dry_run`` counts them instead. ``max_batches`` bounds the work of one call (the
    worker prunes a batch at a time between claims).
    """

    alias = alias or get_settings().database_alias
    if dry_run:
        return int(prunable_keys(alias).count())
    deleted = 0
    batches = 0
    while max_batches is None or batches < max_batches:
        ids = list(prunable_keys(alias).order_by("expires_at").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        # The conditions are checked again by the DELETE itself: a key taken over since the
        # SELECT (fresh expiry, a new queued job) is no longer expired and stays.
        count, _ = prunable_keys(alias).filter(pk__in=ids).delete()
        deleted += count
        batches += 1
        if len(ids) < batch_size:
            break
    return deleted


def prune(
    alias: str | None = None,
    *,
    jobs_older_than: datetime.timedelta | None = None,
    history_older_than: datetime.timedelta | None = None,
    batch_size: int | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete expired keys, idle lock and rate rows, then old finished jobs and attempt history if asked."""
    alias = alias or get_settings().database_alias
    keys = prune_expired_keys(alias, batch_size=batch_size or KEY_BATCH_SIZE, dry_run=dry_run)
    locks = lock_rows.prune_released(alias, LOCK_ROWS_KEPT_FOR.total_seconds(), dry_run=dry_run)
    flow_rates = prune_idle_flow_rates(alias, dry_run=dry_run)
    jobs = None
    if jobs_older_than is not None:
        jobs = prune_finished_jobs(
            alias, older_than=jobs_older_than, batch_size=batch_size or JOB_BATCH_SIZE, dry_run=dry_run
        )
    histories = None
    if history_older_than is not None:
        histories = prune_attempt_history(
            alias, older_than=history_older_than, batch_size=batch_size or JOB_BATCH_SIZE, dry_run=dry_run
        )
    return PruneReport(
        keys=keys, jobs=jobs, dry_run=dry_run, locks=locks, histories=histories, flow_rates=flow_rates
    )


def prune_idle_flow_rates(alias: str, *, dry_run: bool = False) -> int:
    """Delete the rate keys whose arrival time passed more than :data:`FLOW_RATE_ROWS_KEPT_FOR` ago.

    Safe while workers claim: a claim that starts such a key's job writes its row again.
    """
    idle_before = timezone.now().timestamp() - FLOW_RATE_ROWS_KEPT_FOR.total_seconds()
    # The turn row of MariaDB/MySQL's limited claims holds no rate: it stays.
    rows = FlowRate.objects.using(alias).filter(tat__lt=idle_before).exclude(key=FLOW_TURN_KEY)
    if dry_run:
        return rows.count()
    return int(rows.delete()[0])


SCHEDULE_DELETION_RULE = (
    "Only a schedule marked removed (no longer declared in code or settings) may be deleted: a "
    "declared one would be recreated at the next worker start, with its tick history lost."
)


def deletable_schedules(alias: str) -> Any:
    """Schedules that may be deleted by hand: those no longer declared (marked removed)."""

    return Schedule.objects.using(alias).filter(removed_at__isnull=False)


def delete_schedules(ids: Any, alias: str | None = None) -> int:
    """Delete those of ``ids`` that :func:`deletable_schedules` allows; the number deleted."""

    alias = alias or get_settings().database_alias
    with transaction.atomic(using=alias):
        _, per_model = deletable_schedules(alias).filter(pk__in=list(ids)).delete()
    return int(per_model.get(Schedule._meta.label, 0))
