"""Retention: what may be deleted, and when. Every pruning rule of the app lives here.

Old finished jobs (per final status and queue: ``JOBGUARD["RETENTION"]`` and each queue's
``retention``), expired idempotency keys, idle lock rows (their SQL in
:mod:`django_jobguard.store.locks`), old attempt history, and the console's per-minute and
worker rows (:func:`prune_console_rows`, from :mod:`django_jobguard.store.beats`: the
worker's beat prunes them, and monitoring sits below maintenance, so their rule lives in the
store both import).

The elected worker deletes old finished jobs in batches (:func:`prune_retained_jobs`, from
:mod:`.job_pruner`); ``manage.py jobguard_prune`` calls :func:`prune`, with the same rules;
the worker prunes keys on its own when ``JOBGUARD["IDEMPOTENCY"]["PRUNE_IN_WORKER"]`` is on.
Nothing that a queued or running job needs goes: a key stays while a job that owns or carries
it is queued or running, and a finished job stays while a live key answers with it, while its
dead letter is not replayed yet, while it is a dead letter's replay, or while it belongs to a
workflow that has not finished. What the admin may delete by hand is stricter
(:func:`deletable_jobs`, :func:`deletable_keys`): no job any dead letter names.

Settled outbox messages go by the same pass (:func:`prune_outbox_messages`): delivered and
skipped ones past ``RETENTION["OUTBOX_DELIVERED"]`` / ``["OUTBOX_SKIPPED"]``, and only once
their key's relay passed them; pending and dead messages (a held key's included) stay.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import models, transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from ..conf import RETENTION_STATUSES, Settings, get_settings
from ..models import (
    TERMINAL_STATUSES,
    DeadLetter,
    FlowRate,
    IdempotencyKey,
    IdempotencyStatus,
    Job,
    JobStatus,
    OutboxCursor,
    OutboxKey,
    OutboxMessage,
    OutboxState,
    ReplayState,
    Schedule,
    Workflow,
    WorkflowState,
)
from ..outbox.publisher import outbox_alias
from ..store import FLOW_TURN_KEY
from ..store import locks as lock_rows
from ..store.beats import CONSOLE_ROWS_KEPT_FOR_SECONDS, prune_console_rows

__all__ = [
    "CONSOLE_ROWS_KEPT_FOR_SECONDS",
    "JOB_DELETION_RULE",
    "KEY_DELETION_RULE",
    "LOCK_ROWS_KEPT_FOR",
    "OUTBOX_RETENTION_RULE",
    "RETENTION_RULE",
    "OutboxPrune",
    "OutboxScope",
    "PruneReport",
    "RetainedPrune",
    "RetentionScope",
    "deletable_jobs",
    "deletable_keys",
    "delete_jobs",
    "delete_keys",
    "outbox_scopes",
    "prunable_jobs",
    "prunable_keys",
    "prune",
    "prune_attempt_history",
    "prune_console_rows",
    "prune_expired_keys",
    "prune_finished_jobs",
    "prune_outbox_messages",
    "prune_retained_jobs",
    "retained",
    "retention_scopes",
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
    #: Finished jobs deleted (None: not asked for).
    jobs: int | None
    dry_run: bool
    #: Rows of database locks released or expired more than :data:`LOCK_ROWS_KEPT_FOR` ago.
    locks: int = 0
    #: Finished jobs whose attempt history was trimmed (None: not asked for).
    histories: int | None = None
    #: Flow-control rate keys idle for more than :data:`FLOW_RATE_ROWS_KEPT_FOR`.
    flow_rates: int = 0
    #: The finished jobs deleted, per final status (empty: not asked for).
    jobs_by_status: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Settled outbox messages deleted, per state (delivered, skipped; None: not asked for).
    outbox: dict[str, int] | None = None


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


def retained(jobs: Any) -> Any:
    """``jobs`` without those that stay whatever their age (the rule of :data:`RETENTION_RULE`).

    A live idempotency key answers resends with its job; a dead letter not replayed yet needs
    its job to be replayed (the replay takes its workflow place and its key); a replay is the
    record of what its dead letter became; a workflow that has not finished may retry its
    cancelled members and reads its members' states. The foreign keys into the jobs table from
    an expired key, a replayed dead letter and a schedule's last job are set to NULL by the
    delete, in its transaction.
    """
    unfinished_workflow = Workflow.objects.filter(pk=OuterRef("workflow_id")).exclude(
        state=WorkflowState.FINISHED
    )
    return (
        jobs.exclude(Exists(IdempotencyKey.objects.filter(job_id=OuterRef("pk"), expires_at__gt=Now())))
        .exclude(
            Exists(
                DeadLetter.objects.filter(job_id=OuterRef("pk")).exclude(replay_state=ReplayState.REPLAYED)
            )
        )
        .exclude(Exists(DeadLetter.objects.filter(replay_job_id=OuterRef("pk"))))
        .exclude(Exists(unfinished_workflow))
    )


#: What retention keeps whatever its age, for the docs and the command's help.
RETENTION_RULE = (
    "A finished job is kept, whatever its age, while a live idempotency key answers with it, "
    "while its dead letter is not replayed, while it is a dead letter's replay, and while its "
    "workflow has not finished."
)


def prunable_jobs(alias: str, finished_before: datetime.datetime) -> Any:
    """Finished jobs older than ``finished_before`` that retention does not keep (:func:`retained`)."""
    return retained(
        Job.objects.using(alias).filter(status__in=TERMINAL_STATUSES, finished_at__lt=finished_before)
    )


@dataclasses.dataclass(frozen=True, slots=True)
class RetentionScope:
    """Finished jobs of one status, in some queues, kept ``seconds`` after they finished."""

    status: str
    seconds: float
    #: The queues whose retention this is; with ``others``, every queue but these.
    queues: tuple[str, ...] = ()
    others: bool = True

    def jobs(self, alias: str, now: datetime.datetime) -> Any:
        """The scope's jobs old enough to go, before :func:`retained` keeps some."""
        jobs = Job.objects.using(alias).filter(
            status=self.status, finished_at__lt=now - datetime.timedelta(seconds=self.seconds)
        )
        if not self.others:
            return jobs.filter(queue_name__in=self.queues)
        return jobs.exclude(queue_name__in=self.queues) if self.queues else jobs


def retention_scopes(
    settings: Settings, older_than: datetime.timedelta | None = None
) -> list[RetentionScope]:
    """The scopes of a pass: one per status and retention (``RETENTION``, then each queue's own).

    ``older_than`` replaces every status's and queue's retention (``jobguard_prune
    --jobs-older-than``); a status kept for ever (None) is not pruned.
    """
    if older_than is not None:
        return [RetentionScope(status, older_than.total_seconds()) for status in RETENTION_STATUSES]
    own = {name: config.retention for name, config in settings.queues.items() if config.retention is not None}
    scopes = []
    for status in RETENTION_STATUSES:
        default = settings.retention.policy.for_status(status)
        differ = {
            name: policy.for_status(status)
            for name, policy in own.items()
            if policy.for_status(status) != default
        }
        if default is not None:
            scopes.append(RetentionScope(status, default, tuple(sorted(differ))))
        by_seconds: dict[float, list[str]] = {}
        for name, seconds in differ.items():
            if seconds is not None:
                by_seconds.setdefault(seconds, []).append(name)
        scopes += [
            RetentionScope(status, seconds, tuple(sorted(names)), others=False)
            for seconds, names in sorted(by_seconds.items())
        ]
    return scopes


#: Where a scope's sweep stands: the (finished_at, id) of the last job it looked at.
Cursor = tuple[datetime.datetime, int]


@dataclasses.dataclass(frozen=True, slots=True)
class RetainedPrune:
    """What a pruning pass deleted (or, in a dry run, would delete) per status, and how long it took."""

    deleted: dict[str, int]
    seconds: float = 0.0
    #: Transactions that deleted (each at most a batch of jobs).
    batches: int = 0
    #: The pass stopped at its deadline: old jobs may be left for the next one.
    more: bool = False

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def _window(
    alias: str, scope: RetentionScope, now: datetime.datetime, after: Cursor | None, size: int
) -> list[Cursor]:
    """The next ``size`` jobs of ``scope`` in (finished_at, id) order, after ``after``.

    A range of the (status, finished_at) index from where the sweep stands: the rows a pass
    deleted, dead until vacuumed, are not walked again, nor those it had to keep.
    """
    jobs = scope.jobs(alias, now)
    if after is not None:
        jobs = jobs.filter(finished_at__gte=after[0]).exclude(finished_at=after[0], pk__lte=after[1])
    return [
        (finished_at, pk)
        for finished_at, pk in jobs.order_by("finished_at", "pk").values_list("finished_at", "pk")[:size]
    ]


def _delete(alias: str, scope: RetentionScope, now: datetime.datetime, ids: list[int]) -> int:
    """Delete those of ``ids`` that ``scope`` and :func:`retained` still let go, in one transaction."""
    with transaction.atomic(using=alias):
        # Locked with their conditions read again: a job re-queued, replayed or given a live
        # key since the window was read stays, and one an operator holds is left for later.
        locked = list(
            retained(scope.jobs(alias, now).filter(pk__in=ids))
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)
        )
        if not locked:
            return 0
        references = _references()
        if references is None:  # a foreign key that is not SET_NULL: the ORM's collector decides
            _, per_model = Job.objects.using(alias).filter(pk__in=locked).only("pk").delete()
            return int(per_model.get(Job._meta.label, 0))
        # What on_delete=SET_NULL does, one UPDATE per foreign key (an expired key's job, a
        # replayed dead letter's, a schedule's last job), then one DELETE: the collector would
        # load the jobs as objects and delete them 100 at a time, three times the statements.
        for model, field in references:
            models.QuerySet(model, using=alias).filter(**{f"{field}__in": locked}).update(**{field: None})
        # The collector's own statement for a delete nothing else depends on (none does now).
        return int(Job.objects.using(alias).filter(pk__in=locked)._raw_delete(alias))  # noqa: SLF001


def _references() -> list[tuple[Any, str]] | None:
    """The foreign keys into the jobs table as (model, field name), all SET_NULL; None if any is not."""
    references = []
    for relation in Job._meta.get_fields(include_hidden=True):
        if not (
            relation.auto_created and not relation.concrete and (relation.one_to_many or relation.one_to_one)
        ):
            continue
        if relation.on_delete is not models.SET_NULL:  # type: ignore[union-attr]
            return None
        references.append((relation.related_model, relation.field.name))  # type: ignore[union-attr]
    return references


def prune_retained_jobs(
    alias: str | None = None,
    scopes: list[RetentionScope] | None = None,
    *,
    batch_size: int | None = None,
    deadline: float | None = None,
    cursors: dict[RetentionScope, Cursor] | None = None,
    stop: Callable[[], bool] | None = None,
    dry_run: bool = False,
) -> RetainedPrune:
    """Delete the finished jobs past their retention, a batch per transaction; what went per status.

    ``scopes`` defaults to the settings' (:func:`retention_scopes`). The scopes take turns, a
    batch each, so a status that is always behind does not starve the others. ``deadline``
    (``time.monotonic()``) ends the pass early, with ``more`` set; ``cursors`` (kept by the
    caller across passes) make the next pass go on where this one stopped. A scope whose sweep
    reached its end starts again from its oldest job at the next pass, so a job kept until now
    (its dead letter replayed since, its workflow finished) goes then.
    """
    conf = get_settings()
    alias = alias or conf.database_alias
    scopes = retention_scopes(conf) if scopes is None else scopes
    size = batch_size or conf.retention.batch_size
    started = time.monotonic()
    now = timezone.now()
    deleted = dict.fromkeys(RETENTION_STATUSES, 0)
    if dry_run:
        for scope in scopes:
            deleted[scope.status] += int(retained(scope.jobs(alias, now)).count())
        return RetainedPrune(deleted, time.monotonic() - started)
    cursors = {} if cursors is None else cursors
    batches = 0
    for scope, ids in _turns(alias, scopes, now, cursors, size, deadline, stop):
        if ids is None:
            return RetainedPrune(deleted, time.monotonic() - started, batches, more=True)
        count = _delete(alias, scope, now, ids)
        deleted[scope.status] += count
        batches += 1 if count else 0
    return RetainedPrune(deleted, time.monotonic() - started, batches)


def _turns(
    alias: str,
    scopes: list[RetentionScope],
    now: datetime.datetime,
    cursors: dict[RetentionScope, Cursor],
    size: int,
    deadline: float | None,
    stop: Callable[[], bool] | None,
) -> Iterator[tuple[RetentionScope, list[int] | None]]:
    """Each scope's next window of ids in turn, until every sweep reached its end; None: stop now."""
    active = list(scopes)
    while active:
        for scope in list(active):
            if (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop()):
                yield scope, None
                return
            window = _window(alias, scope, now, cursors.get(scope), size)
            if len(window) < size:
                cursors.pop(scope, None)  # the end: the next pass starts from the oldest again
                active.remove(scope)
            else:
                cursors[scope] = window[-1]
            if window:
                yield scope, [pk for _, pk in window]


def prune_finished_jobs(
    alias: str | None = None,
    *,
    older_than: datetime.timedelta,
    batch_size: int = JOB_BATCH_SIZE,
    dry_run: bool = False,
) -> int:
    """Delete finished jobs older than ``older_than`` (see :func:`prunable_jobs`); the number deleted."""

    scopes = retention_scopes(get_settings(), older_than)
    return prune_retained_jobs(alias, scopes, batch_size=batch_size, dry_run=dry_run).total


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
    jobs: bool = True,
    jobs_older_than: datetime.timedelta | None = None,
    history_older_than: datetime.timedelta | None = None,
    outbox: bool = True,
    outbox_older_than: datetime.timedelta | None = None,
    batch_size: int | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete expired keys, idle lock and rate rows, finished jobs and settled outbox messages
    past their retention, and attempt history if asked.

    Jobs go by ``JOBGUARD["RETENTION"]`` and each queue's ``retention``, as in the workers, or,
    with ``jobs_older_than``, once finished that long ago whatever their status and queue;
    :func:`retained` keeps the same jobs either way. ``jobs=False`` deletes no job. Delivered
    and skipped outbox messages go by ``RETENTION["OUTBOX_DELIVERED"]`` and
    ``["OUTBOX_SKIPPED"]``, or ``outbox_older_than``; ``outbox=False`` deletes none.
    """
    alias = alias or get_settings().database_alias
    keys = prune_expired_keys(alias, batch_size=batch_size or KEY_BATCH_SIZE, dry_run=dry_run)
    locks = lock_rows.prune_released(alias, LOCK_ROWS_KEPT_FOR.total_seconds(), dry_run=dry_run)
    flow_rates = prune_idle_flow_rates(alias, dry_run=dry_run)
    pruned = None
    if jobs:
        scopes = retention_scopes(get_settings(), jobs_older_than)
        pruned = prune_retained_jobs(alias, scopes, batch_size=batch_size, dry_run=dry_run)
    outbox_pruned = None
    if outbox:
        outbox_pruned = prune_outbox_messages(
            scopes=outbox_scopes(get_settings(), outbox_older_than), batch_size=batch_size, dry_run=dry_run
        )
    histories = None
    if history_older_than is not None:
        histories = prune_attempt_history(
            alias, older_than=history_older_than, batch_size=batch_size or JOB_BATCH_SIZE, dry_run=dry_run
        )
    return PruneReport(
        keys=keys,
        jobs=None if pruned is None else pruned.total,
        dry_run=dry_run,
        locks=locks,
        histories=histories,
        flow_rates=flow_rates,
        jobs_by_status={} if pruned is None else pruned.deleted,
        outbox=None if outbox_pruned is None else outbox_pruned.deleted,
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


# -- settled outbox messages -----------------------------------------------------------------

#: What outbox retention never deletes, for the docs and the command's help.
OUTBOX_RETENTION_RULE = (
    "A pending or dead outbox message (one that holds its key included) is never deleted, nor "
    "one its key's relay has not passed yet; a key keeps its own rows, so its sequence goes on."
)

#: Outbox states retention deletes, each with the time it counts from.
_OUTBOX_SETTLED = ((OutboxState.DELIVERED, "delivered_at"), (OutboxState.SKIPPED, "resolved_at"))


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxScope:
    """Outbox messages of one settled state, kept ``seconds`` after they settled."""

    state: str
    seconds: float
    #: The message's field the age is counted from.
    settled_field: str

    def messages(self, alias: str, now: datetime.datetime) -> Any:
        """The scope's messages old enough to go, whether or not their key's relay passed them."""
        return OutboxMessage.objects.using(alias).filter(
            state=self.state,
            **{f"{self.settled_field}__lt": now - datetime.timedelta(seconds=self.seconds)},
        )

    def prunable(self, alias: str, now: datetime.datetime) -> Any:
        """:meth:`messages` that the relay passed: at or below their key's ``delivered_seq``.

        A message above it is one the relay still reads (it steps over a skipped message in
        sequence): deleting it would leave a gap the key could not pass.
        """
        passed = OutboxCursor.objects.filter(
            destination=OuterRef("destination"), key=OuterRef("key"), delivered_seq__gte=OuterRef("seq")
        )
        return self.messages(alias, now).filter(Exists(passed))


def outbox_scopes(settings: Settings, older_than: datetime.timedelta | None = None) -> list[OutboxScope]:
    """The outbox scopes of a pass: delivered and skipped messages, by ``RETENTION`` or ``older_than``."""
    retention = {
        OutboxState.DELIVERED: settings.retention.outbox_delivered,
        OutboxState.SKIPPED: settings.retention.outbox_skipped,
    }
    scopes = []
    for state, field in _OUTBOX_SETTLED:
        seconds = older_than.total_seconds() if older_than is not None else retention[state]
        if seconds is not None:
            scopes.append(OutboxScope(str(state), seconds, field))
    return scopes


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxPrune:
    """What an outbox pruning pass deleted (or, in a dry run, would delete)."""

    #: Messages per state (delivered, skipped).
    deleted: dict[str, int]
    #: Keys of messages published without a key whose rows went with their message.
    keys: int = 0
    seconds: float = 0.0
    batches: int = 0
    #: The pass stopped at its deadline: old messages may be left for the next one.
    more: bool = False

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


@dataclasses.dataclass(slots=True)
class OutboxSweep:
    """Where a scope's sweep stands between passes: below ``bound`` (None: no bound), after ``after``."""

    bound: int | None
    after: int = 0


def _sweep_bound(alias: str, scope: OutboxScope, now: datetime.datetime) -> int | None:
    """The first message published after the scope's cutoff: nothing from it on is old enough.

    Messages are numbered as they are published, so a sweep walks the primary key from the
    oldest up to here and never reads the day of recent messages; the read itself walks only
    the old rows still stored (those it will delete, and those kept: pending, dead).
    """
    cutoff = now - datetime.timedelta(seconds=scope.seconds)
    first: int | None = (
        OutboxMessage.objects.using(alias)
        .filter(published_at__gte=cutoff)
        .order_by("pk")
        .values_list("pk", flat=True)
        .first()
    )
    return first


def _outbox_window(
    alias: str, scope: OutboxScope, now: datetime.datetime, sweep: OutboxSweep, size: int
) -> list[int]:
    messages = scope.messages(alias, now).filter(pk__gt=sweep.after)
    if sweep.bound is not None:
        messages = messages.filter(pk__lt=sweep.bound)
    return list(messages.order_by("pk").values_list("pk", flat=True)[:size])


def _delete_outbox(alias: str, scope: OutboxScope, now: datetime.datetime, ids: list[int]) -> tuple[int, int]:
    """Delete those of ``ids`` that ``scope`` still lets go, in one transaction; (messages, keys)."""
    with transaction.atomic(using=alias):
        # Conditions read again under the rows' locks; a row another transaction holds waits
        # for the next pass.
        rows = list(
            scope.prunable(alias, now)
            .filter(pk__in=ids)
            .select_for_update(skip_locked=True)
            .values_list("pk", "destination", "key", "message_id")
        )
        if not rows:
            return 0, 0
        deleted = int(
            OutboxMessage.objects.using(alias).filter(pk__in=[row[0] for row in rows])._raw_delete(alias)  # noqa: SLF001
        )
        # A message published without a key had a key of its own (its id): no publisher will
        # take it again, so its two rows go with it rather than pile up one pair per message.
        own_keys = {(destination, key) for _, destination, key, message_id in rows if key == str(message_id)}
        return deleted, _delete_own_keys(alias, own_keys) if own_keys else 0


def _delete_own_keys(alias: str, pairs: set[tuple[str, str]]) -> int:
    """Delete the key and cursor rows of ``pairs`` whose every message is gone and settled."""
    keys = sorted({key for _, key in pairs})
    cursors = {
        (destination, key): (pk, delivered_seq)
        for pk, destination, key, delivered_seq in OutboxCursor.objects.using(alias)
        .filter(key__in=keys, held_seq__isnull=True)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=Now()))
        .exclude(
            Exists(OutboxMessage.objects.filter(destination=OuterRef("destination"), key=OuterRef("key")))
        )
        .select_for_update(skip_locked=True)
        .values_list("pk", "destination", "key", "delivered_seq")
        if (destination, key) in pairs
    }
    key_rows = {
        (destination, key): pk
        for pk, destination, key, last_seq in OutboxKey.objects.using(alias)
        .filter(key__in=keys)
        .select_for_update(skip_locked=True)
        .values_list("pk", "destination", "key", "last_seq")
        if (destination, key) in cursors and last_seq <= cursors[(destination, key)][1]
    }
    if not key_rows:
        return 0
    cursor_ids = [cursors[pair][0] for pair in key_rows]
    OutboxCursor.objects.using(alias).filter(pk__in=cursor_ids)._raw_delete(alias)  # noqa: SLF001
    return int(OutboxKey.objects.using(alias).filter(pk__in=list(key_rows.values()))._raw_delete(alias))  # noqa: SLF001


def prune_outbox_messages(
    alias: str | None = None,
    scopes: list[OutboxScope] | None = None,
    *,
    batch_size: int | None = None,
    deadline: float | None = None,
    sweeps: dict[OutboxScope, OutboxSweep] | None = None,
    stop: Callable[[], bool] | None = None,
    dry_run: bool = False,
) -> OutboxPrune:
    """Delete delivered and skipped outbox messages past their retention, a batch per transaction.

    ``alias`` defaults to the outbox's database. Never a pending or dead message, nor one its
    key's relay has not passed (:meth:`OutboxScope.prunable`). ``deadline``, ``stop`` and
    ``sweeps`` (kept by the caller across passes) work as for :func:`prune_retained_jobs`.
    """
    conf = get_settings()
    alias = alias or outbox_alias()
    scopes = outbox_scopes(conf) if scopes is None else scopes
    size = batch_size or conf.retention.batch_size
    started = time.monotonic()
    now = timezone.now()
    deleted = {str(state): 0 for state, _ in _OUTBOX_SETTLED}
    if dry_run:
        for scope in scopes:
            deleted[scope.state] += int(scope.prunable(alias, now).count())
        return OutboxPrune(deleted, seconds=time.monotonic() - started)
    sweeps = {} if sweeps is None else sweeps
    keys = batches = 0
    active = list(scopes)
    while active:
        for scope in list(active):
            if (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop()):
                return OutboxPrune(deleted, keys, time.monotonic() - started, batches, more=True)
            sweep = sweeps.get(scope)
            if sweep is None:
                sweep = sweeps[scope] = OutboxSweep(_sweep_bound(alias, scope, now))
            ids = _outbox_window(alias, scope, now, sweep, size)
            if len(ids) < size:
                sweeps.pop(scope, None)  # the end: the next pass starts from the oldest again
                active.remove(scope)
            else:
                sweep.after = ids[-1]
            if ids:
                messages, own_keys = _delete_outbox(alias, scope, now, ids)
                deleted[scope.state] += messages
                keys += own_keys
                batches += 1 if messages else 0
    return OutboxPrune(deleted, keys, time.monotonic() - started, batches)
