"""Redrive: approved replays become new jobs, under a throttle shared by every worker.

A pass holds the row lock of :data:`THROTTLE_LOCK_KEY` in ``jobguard_lock``, which
serialises passes across all workers (a worker that finds it taken skips its pass), and
each dead letter moves ``approved`` → ``replayed`` in a conditional update, so it yields
exactly one job. The throttle allows at most ``JOBGUARD["REPLAY"]["RATE_PER_MINUTE"]`` (or
the rate last set in the console, :mod:`.rate`) redrives in any :data:`RATE_WINDOW_SECONDS`
and a sixth of that (rounded up) in any :data:`BURST_WINDOW_SECONDS`, counted on the
database clock.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import logging
import math
import warnings
from typing import Any

from django.db import DatabaseError, transaction
from django.db.models import Count, Q
from django.db.models.functions import Now

from .. import events, idempotency, workflows
from ..conf import get_settings
from ..encryption import DecryptionError, is_encrypted
from ..encryption.payloads import ARGS, KWARGS, open_json, seal_json
from ..enqueue import prepare as prepare_fields
from ..exceptions import InvalidArgumentsError
from ..models import DeadLetter, Job, Lock, ReplayAction, ReplayEvent, ReplayState
from ..registry import registry
from ..task import Task
from .rate import rate_per_minute
from .transitions import announce_transition

# The package's logger: records keep the name they had before dlq became a package.
logger = logging.getLogger("django_jobguard.dlq")

__all__ = [
    "BURST_WINDOW_SECONDS",
    "RATE_WINDOW_SECONDS",
    "REDRIVE_LOOKAHEAD",
    "THROTTLE_LOCK_KEY",
    "RedriveEstimate",
    "RedrivePass",
    "RedriveSkip",
    "redrive",
    "redrive_estimate",
    "redrive_once",
]

#: The throttle counts redrives in this window against ``RATE_PER_MINUTE``...
RATE_WINDOW_SECONDS = 60
#: ...and in this one against a sixth of it (rounded up), so a minute's budget is spread out
#: instead of spent in one burst the moment a mass approval lands.
BURST_WINDOW_SECONDS = 10
#: Row of ``jobguard_lock`` whose row lock serialises redrive passes across all workers.
THROTTLE_LOCK_KEY = "jobguard:replay-throttle"
#: Candidates looked at past the budget, for when some must wait for their idempotency key.
REDRIVE_LOOKAHEAD = 20


class RedriveSkip(enum.StrEnum):
    """Why a pass redrove nothing without looking at any replay."""

    #: No replay is approved.
    NOTHING_APPROVED = "nothing_approved"
    #: Another process holds the throttle: it is redriving right now.
    BUSY = "busy"
    #: The throttle's budget is spent (or ``batch_size`` is 0).
    THROTTLED = "throttled"


@dataclasses.dataclass(frozen=True, slots=True)
class RedrivePass:
    """What one redrive pass did."""

    #: The jobs created, oldest approval first.
    jobs: tuple[Job, ...] = ()
    #: Redrives the throttle (and ``batch_size``) allowed this pass; 0 when the pass was skipped
    #: before the budget was counted.
    budget: int = 0
    #: Approved replays looked at but left for a later pass: their idempotency key is owned
    #: by another live job, they changed meanwhile, or their insert failed.
    deferred: int = 0
    #: Set when the pass looked at no replay at all.
    skipped: RedriveSkip | None = None


def redrive(
    *,
    batch_size: int | None = None,
    worker_id: str = "",
    using: str | None = None,
    limit: int | None = None,
) -> list[Job]:
    """Turn approved replays into new jobs, as many as the throttle allows now; the jobs created.

    Workers call this between claims (every ``REAPER_INTERVAL`` seconds); call it yourself
    to redrive without a worker. Any number of processes may call it at once: a pass holds
    a row lock that serialises passes (a worker that finds it taken skips its pass), and
    each dead letter moves ``approved`` → ``replayed`` in a conditional update, so it yields
    exactly one job. The throttle allows at most ``RATE_PER_MINUTE`` redrives in any 60
    seconds and a sixth of that (rounded up) in any 10, counted on the database clock.
    ``batch_size`` caps this pass below the throttle's budget (it never raises it).
    ``limit`` is the old name of ``batch_size``, deprecated.
    """
    batch_size = _batch_size(batch_size, limit, "redrive")
    return list(redrive_once(batch_size=batch_size, worker_id=worker_id, using=using).jobs)


def redrive_once(
    *,
    batch_size: int | None = None,
    worker_id: str = "",
    using: str | None = None,
    limit: int | None = None,
) -> RedrivePass:
    """One redrive pass, as :func:`redrive` makes it: what it created, allowed, deferred or why it skipped."""
    batch_size = _batch_size(batch_size, limit, "redrive_once")
    alias = using or get_settings().database_alias
    letters = DeadLetter.objects.using(alias)
    if not letters.awaiting_redrive().exists():
        return RedrivePass(skipped=RedriveSkip.NOTHING_APPROVED)
    _ensure_throttle_row(alias)
    redriven: list[tuple[int, Job]] = []
    with transaction.atomic(using=alias):
        if not _take_throttle(alias):
            return RedrivePass(skipped=RedriveSkip.BUSY)  # another worker is redriving right now
        budget = _budget(alias)
        if batch_size is not None:
            budget = min(budget, batch_size)
        if budget <= 0:
            logger.debug("replay_throttled worker_id=%s", worker_id)
            return RedrivePass(budget=max(budget, 0), skipped=RedriveSkip.THROTTLED)
        candidates = list(
            letters.awaiting_redrive()
            .select_for_update(skip_locked=True)
            .order_by("replay_decided_at", "id")[: budget + REDRIVE_LOOKAHEAD]
        )
        deferred = 0
        for letter in candidates:
            if len(redriven) >= budget:
                break
            job = _redrive_one(alias, letter, worker_id)
            if job is None:
                deferred += 1
            else:
                redriven.append((letter.pk, job))
        for letter_pk, job in redriven:
            transaction.on_commit(
                functools.partial(_announce_redrive, alias, letter_pk, job, worker_id), using=alias
            )
    return RedrivePass(jobs=tuple(job for _, job in redriven), budget=budget, deferred=deferred)


def _batch_size(batch_size: int | None, limit: int | None, caller: str) -> int | None:
    """``batch_size``, or the deprecated ``limit`` it replaced (one name for one thing: in
    jobguard a limit is flow control's), with a warning."""
    if limit is None:
        return batch_size
    if batch_size is not None:
        raise TypeError(f"dlq.{caller}() takes batch_size or its deprecated name limit, not both.")
    warnings.warn(
        f"dlq.{caller}(limit=...) is deprecated: pass batch_size=... (limit goes in the next release).",
        DeprecationWarning,
        stacklevel=3,
    )
    return limit


def _ensure_throttle_row(alias: str) -> None:
    locks = Lock.objects.using(alias)
    if not locks.filter(key=THROTTLE_LOCK_KEY).exists():
        # Insert-or-ignore: the first worker ever to redrive creates it; racing workers are fine.
        locks.bulk_create([Lock(key=THROTTLE_LOCK_KEY)], ignore_conflicts=True)


def _take_throttle(alias: str) -> bool:
    """Lock the throttle row for this transaction; False if another worker holds it.

    Databases without row locks (SQLite) serialise write transactions anyway.
    """
    rows = Lock.objects.using(alias).select_for_update(skip_locked=True).filter(key=THROTTLE_LOCK_KEY)
    return bool(list(rows.values_list("key", flat=True)))


@dataclasses.dataclass(frozen=True, slots=True)
class RedriveEstimate:
    """How long the throttle takes to redrive some replays once they are approved."""

    count: int
    #: Approved replays already waiting for a redrive: they go first.
    ahead: int
    rate_per_minute: int
    seconds: float


def redrive_estimate(count: int, *, using: str | None = None) -> RedriveEstimate:
    """The time the throttle needs for ``count`` more replays after those approved already.

    One query. A lower bound: workers redrive every ``REAPER_INTERVAL`` seconds, and only
    while some run.
    """
    alias = using or get_settings().database_alias
    rate = rate_per_minute(alias)
    ahead = DeadLetter.objects.using(alias).awaiting_redrive().count()
    return RedriveEstimate(count, ahead, rate, (ahead + count) * RATE_WINDOW_SECONDS / rate)


def _budget(alias: str) -> int:
    """Redrives the throttle allows now, from the ``replayed_at`` of recent replays.

    The rate is read on every pass (:func:`.rate.rate_per_minute`): a change made in the
    console reaches every worker at its next pass.
    """
    rate = rate_per_minute(alias)
    burst = math.ceil(rate * BURST_WINDOW_SECONDS / RATE_WINDOW_SECONDS)
    minute_ago = Now() - datetime.timedelta(seconds=RATE_WINDOW_SECONDS)
    burst_ago = Now() - datetime.timedelta(seconds=BURST_WINDOW_SECONDS)
    counts = (
        DeadLetter.objects.using(alias)
        .filter(replay_state=ReplayState.REPLAYED, replayed_at__gt=minute_ago)
        .aggregate(minute=Count("id"), burst=Count("id", filter=Q(replayed_at__gt=burst_ago)))
    )
    return min(rate - int(counts["minute"]), burst - int(counts["burst"]))


class _SkipRedriveError(Exception):
    """Undo this dead letter's redrive (savepoint) and leave it for a later pass."""


def _redrive_one(alias: str, letter: DeadLetter, worker_id: str) -> Job | None:
    """The replay's new job, or None when the dead letter is left for a later pass."""
    task = registry.find(letter.task_name)
    stored_args = letter.replay_args if letter.replay_args is not None else letter.args
    stored_kwargs = letter.replay_kwargs if letter.replay_kwargs is not None else letter.kwargs
    try:
        args = open_json(stored_args, ARGS, "dead_letter.args")
        kwargs = open_json(stored_kwargs, KWARGS, "dead_letter.kwargs")
    except DecryptionError:
        # Its key is not configured here: the replay's job carries the payload as stored, and
        # the worker that claims it dead-letters it again, naming the key, unless it has it.
        args, kwargs = stored_args, stored_kwargs
    try:
        # A savepoint per dead letter: one that fails does not undo the others of the pass.
        with transaction.atomic(using=alias):
            key_row, key_state = None, idempotency.REPLAY_NO_KEY
            if letter.idempotency_key:
                digest = idempotency.replay_fingerprint(task, letter.task_name, args, kwargs)
                key_row, key_state = idempotency.claim_for_replay(
                    alias,
                    idempotency.scope_of_name(letter.task_name),
                    letter.idempotency_key,
                    digest,
                    letter.job_id,
                )
                if key_state == idempotency.REPLAY_BUSY:
                    raise _SkipRedriveError
            job = Job(**_job_fields(task, letter, args, kwargs))
            job.save(force_insert=True, using=alias)
            if key_row is not None:
                idempotency.hand_to_replay(alias, key_row, job.pk, digest)
            if letter.job_id is not None:
                workflows.replayed(alias, letter.job_id, job.pk)
            moved = (
                DeadLetter.objects.using(alias)
                .filter(pk=letter.pk, replay_state=ReplayState.APPROVED, replay_job__isnull=True)
                .update(replay_state=ReplayState.REPLAYED, replay_job=job, replayed_at=Now())
            )
            if moved != 1:
                raise _SkipRedriveError  # rejected or redriven elsewhere since we read it
            ReplayEvent.objects.using(alias).create(
                dead_letter_id=letter.pk,
                action=ReplayAction.REPLAYED,
                reason=f"redriven by worker {worker_id}" if worker_id else "redriven",
                data={"job_id": job.pk, "worker_id": worker_id, "idempotency_key": key_state},
            )
    except _SkipRedriveError:
        return None
    except DatabaseError:
        # Leave it approved; the next pass tries again and the others are not held up.
        logger.exception("replay_redrive_failed dead_letter_id=%s", letter.pk)
        return None
    return job


def _job_fields(task: Task[Any, Any] | None, letter: DeadLetter, args: Any, kwargs: Any) -> dict[str, Any]:
    """The new job's row: today's task options, the dead letter's queue, the replay payload."""
    fields: dict[str, Any] | None = None
    if task is not None:
        try:
            fields = prepare_fields(task.using(queue_name=letter.queue_name), args, kwargs)
        except InvalidArgumentsError:
            fields = None  # the handler changed since approval: the worker dead-letters it, saying so
    if fields is None:
        queue = get_settings().queue(letter.queue_name)
        fields = {
            "task_name": letter.task_name,
            "queue_name": letter.queue_name,
            "args": args,
            "kwargs": kwargs,
            "priority": task.priority if task else 0,
            "max_attempts": (task.max_attempts if task else None) or queue.max_attempts,
            "visibility_timeout": (task.visibility_timeout if task else None) or queue.visibility_timeout,
            "lock_key": letter.lock_key,
            "handler_version": letter.handler_version,
        }
    fields["idempotency_key"] = letter.idempotency_key
    # The replay's run links to the original's enqueue and attempts (with tracing on).
    fields["trace_context"] = letter.trace_context
    # Saved through the ORM, not the store's insert: sealed here, as the letter's were or as
    # the task asks now.
    if fields.pop("encrypt", False) or is_encrypted(letter.args) or is_encrypted(letter.kwargs):
        fields["args"], fields["kwargs"] = (
            seal_json(fields["args"], ARGS),
            seal_json(fields["kwargs"], KWARGS),
        )
    return fields


def _announce_redrive(alias: str, letter_pk: int, job: Job, worker_id: str) -> None:
    logger.info(
        "replay_redriven dead_letter_id=%s job_id=%s task=%r worker_id=%s",
        letter_pk,
        job.pk,
        job.task_name,
        worker_id,
        extra={
            "dead_letter_id": letter_pk,
            "job_id": job.pk,
            "job_type": job.task_name,
            "queue": job.queue_name,
        },
    )
    events.emit(events.JobEnqueued(job.queue_name, job.task_name))
    announce_transition(alias, letter_pk, ReplayState.REPLAYED, None, job)
