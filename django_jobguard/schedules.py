"""Recurring jobs: tick computation, syncing declarations to rows, and the scheduler pass.

Schedules are declared in code (``@task(schedule="*/5 * * * *")``) or in
``JOBGUARD["SCHEDULES"]``, and live as :class:`~django_jobguard.models.Schedule` rows. Every
worker runs :func:`run_once` about once a second. For each schedule that is due by the
**database clock**, one transaction locks the row (``FOR UPDATE SKIP LOCKED`` where the
database has it), advances ``next_tick_at`` by a compare-and-set on its old value, and
inserts the tick's job with the idempotency key ``schedule:<name>:<tick in UTC ISO>``
through the normal enqueue service. Two schedulers that both see the tick due can both
try; only one compare-and-set matches, so only one job commits, however many hosts run
workers. A scheduler killed mid-tick rolls back, and the tick stays due for the next one.

Ticks come from cronsim (five fields, or six with seconds first) in the schedule's time
zone (``zoneinfo``). Daylight saving follows cronsim, which follows Debian cron: a job at
a fixed time that falls in a skipped hour runs once, at the first valid minute after it;
one in a repeated hour runs once, in the first pass. Expressions with wildcard hours
(``*/5 * * * *``) follow real time, so each real tick runs once.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import itertools
import logging
import uuid
import zoneinfo
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from cronsim import CronSim, CronSimError
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db import connections, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from django.db.models.functions import Now

from . import _faults, events, store
from .conf import ScheduleConfig, get_settings
from .encryption import DecryptionError, is_encrypted
from .encryption.payloads import ARGS, KWARGS, open_json, seal_json, seals
from .exceptions import IdempotencyConflict, InvalidArgumentsError, InvalidScheduleError
from .models import Schedule
from .registry import registry

if TYPE_CHECKING:
    from .models import Job, Schedule
    from .task import Task

logger = logging.getLogger("django_jobguard.schedules")

__all__ = [
    "SchedulerPass",
    "SyncResult",
    "TickPlan",
    "declared_schedules",
    "next_tick",
    "pause",
    "plan_ticks",
    "resume",
    "run_now",
    "run_once",
    "shortest_interval",
    "sync",
    "tick_key",
    "validate",
]

#: Ticks one pass walks through at most for one schedule after an outage; past that it
#: jumps to the ticks of the last MISSED_AFTER seconds (a one-second schedule down for a
#: day has 86,400 missed ticks: never walked one by one, never enqueued one by one).
MAX_TICKS_SCANNED = 10_000
#: Ticks looked at to find a schedule's shortest interval (for the expected-duration check).
INTERVAL_SAMPLES = 50
#: Compares unequal to every definition's value (a stored value the sync must write again).
_CHANGED = object()


# -- pure tick computation ---------------------------------------------------------------


def _zone(timezone: str) -> zoneinfo.ZoneInfo:
    try:
        return zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidScheduleError(
            f"time zone {timezone!r} is not an IANA time zone (such as 'Europe/Jakarta')."
        ) from None


def validate(cron: str, timezone: str = "UTC") -> None:
    """Raise :class:`InvalidScheduleError` (saying what is wrong) unless ``cron`` can tick."""
    zone = _zone(timezone)
    try:
        next(CronSim(cron, datetime.datetime(2000, 1, 1, tzinfo=zone)))
    except CronSimError as exc:
        raise InvalidScheduleError(f"cron expression {cron!r} is invalid: {exc}.") from None
    except StopIteration:
        raise InvalidScheduleError(f"cron expression {cron!r} never matches a date.") from None


def _ticks_after(cron: str, timezone: str, after: datetime.datetime) -> Iterator[datetime.datetime]:
    """The ticks of ``cron`` strictly after ``after``, in UTC, each later than the one before."""
    if after.tzinfo is None:
        raise ValueError("ticks are computed from an aware datetime")
    zone = _zone(timezone)
    try:
        ticks = CronSim(cron, after.astimezone(zone))
        last = after
        for local in ticks:
            tick = local.astimezone(datetime.UTC)
            # In the second pass of a repeated hour, a fixed-time tick maps to its first
            # pass, which is behind us: it has run, so it is passed over, not run twice.
            if tick > last:
                last = tick
                yield tick
    except CronSimError as exc:
        raise InvalidScheduleError(f"cron expression {cron!r} is invalid: {exc}.") from None


def next_tick(cron: str, timezone: str, after: datetime.datetime) -> datetime.datetime:
    """The first tick of ``cron`` strictly after ``after`` (aware), in UTC. Pure: pass ``after``.

    Ticks are computed in ``timezone``; cronsim maps a fixed-time tick in a skipped hour
    forward and one in a repeated hour to its first pass.
    """
    for tick in _ticks_after(cron, timezone, after):
        return tick
    raise InvalidScheduleError(f"cron expression {cron!r} matches no date in the next 50 years.")


def shortest_interval(cron: str, timezone: str, start: datetime.datetime) -> float:
    """Seconds between the two closest of the first :data:`INTERVAL_SAMPLES` ticks after ``start``."""
    ticks = [next_tick(cron, timezone, start)]
    for _ in range(INTERVAL_SAMPLES):
        ticks.append(next_tick(cron, timezone, ticks[-1]))
    return min((b - a).total_seconds() for a, b in itertools.pairwise(ticks))


@dataclasses.dataclass(frozen=True, slots=True)
class TickPlan:
    """What one pass does for one due schedule."""

    #: Ticks to enqueue a job for, oldest first.
    ticks: tuple[datetime.datetime, ...]
    #: Due ticks that get no job (missed, by the schedule's policy).
    missed: int
    #: The first tick after ``now``: the schedule's new ``next_tick_at``.
    next_tick_at: datetime.datetime


def plan_ticks(
    cron: str,
    timezone: str,
    due_at: datetime.datetime,
    now: datetime.datetime,
    *,
    missed: str = "run_once",
    missed_after: float = 60.0,
    catch_up_max: int = 100,
) -> TickPlan:
    """Which due ticks (``due_at`` up to ``now``) get a job. Pure: ``now`` is passed in.

    A tick at most ``missed_after`` seconds old is on time and always enqueued. Older ones
    are missed: ``skip`` enqueues none of them; ``run_once`` enqueues the latest one if no
    tick is on time (one job stands for all of them, not a burst); ``catch_up`` enqueues
    each, the latest ``catch_up_max`` at most.
    """
    cutoff = now - datetime.timedelta(seconds=missed_after)
    on_time: list[datetime.datetime] = []
    late: collections.deque[datetime.datetime] = collections.deque(maxlen=max(1, catch_up_max))
    late_count = 0
    tick = previous = due_at
    upcoming = _ticks_after(cron, timezone, due_at)
    while tick <= now:
        if tick > cutoff:
            on_time.append(tick)
        else:
            late.append(tick)
            late_count += 1
            if late_count % MAX_TICKS_SCANNED == 0:
                # A long outage of a frequent schedule: jump to just before the last
                # catch_up_max missed ticks (at the latest spacing), so those are the ones
                # kept. The ticks jumped over are not counted: the count is a lower bound.
                resume_at = cutoff - (tick - previous) * (max(1, catch_up_max) + 1)
                upcoming = _ticks_after(cron, timezone, max(tick, resume_at))
        previous = tick
        tick = next(upcoming, None) or _never(cron)

    chosen: list[datetime.datetime]
    if missed == "skip":
        chosen = on_time
    elif missed == "catch_up":
        chosen = [*late, *on_time]
    elif on_time or not late:
        chosen = on_time
    else:
        chosen = [late[-1]]
    return TickPlan(ticks=tuple(chosen), missed=late_count + len(on_time) - len(chosen), next_tick_at=tick)


def _never(cron: str) -> datetime.datetime:
    raise InvalidScheduleError(f"cron expression {cron!r} matches no date in the next 50 years.")


def tick_key(name: str, tick: datetime.datetime) -> str:
    """The idempotency key of a schedule's tick: ``schedule:<name>:<tick in UTC ISO>``."""
    return f"schedule:{name}:{tick.astimezone(datetime.UTC).isoformat()}"


# -- declarations and rows ---------------------------------------------------------------


def declared_schedules() -> dict[str, ScheduleConfig]:
    """Every schedule this process declares: tasks' ``schedule=``, then ``JOBGUARD["SCHEDULES"]``.

    A settings entry with the name of a code schedule replaces it (check ``jobguard.W014``).
    """
    specs: dict[str, ScheduleConfig] = {}
    for name in registry.names():
        task = registry.find(name)
        if task is not None and task.schedule:
            specs[name] = ScheduleConfig(name=name, task=name, cron=task.schedule, source="code")
    specs.update(get_settings().schedules)
    return specs


def _definition(spec: ScheduleConfig) -> dict[str, Any]:
    return {
        "task_name": spec.task,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "args": list(spec.args),
        "kwargs": dict(spec.kwargs),
        "queue_name": spec.queue_name or "",
        "missed": spec.missed,
        "source": spec.source,
    }


def _seals(task_name: str) -> bool:
    """Whether a schedule's arguments are stored sealed: its task encrypts (and keys exist;
    without them the system checks say so, and the scheduler keeps running)."""
    try:
        return seals(registry.find(task_name), get_settings())
    except ImproperlyConfigured:
        return False


def _stored(row: Schedule, field: str, sealed: bool) -> Any:
    """A schedule row's field as compared with its definition: arguments opened; a row
    sealed otherwise than it should be compares unequal, so the sync writes it again."""
    value = getattr(row, field)
    if field not in ("args", "kwargs"):
        return value
    if is_encrypted(value) != sealed:
        return _CHANGED
    try:
        return open_json(value, field, f"schedule.{field}")
    except DecryptionError:
        return _CHANGED


def _arguments(row: Schedule) -> tuple[Any, Any]:
    """A schedule's arguments to enqueue with, opened if they are stored sealed."""
    return open_json(row.args, ARGS, "schedule.args"), open_json(row.kwargs, KWARGS, "schedule.kwargs")


def _first_tick(name: str, cron: str, timezone: str, now: datetime.datetime) -> datetime.datetime | None:
    try:
        return next_tick(cron, timezone, now)
    except InvalidScheduleError as exc:
        logger.error(
            "schedule_invalid name=%s error=%s; it will not run", name, exc, extra={"schedule": name}
        )
        return None


@dataclasses.dataclass(slots=True)
class SyncResult:
    """Names of the schedules :func:`sync` created, changed, restored and marked removed."""

    created: list[str] = dataclasses.field(default_factory=list)
    updated: list[str] = dataclasses.field(default_factory=list)
    restored: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)


def sync(*, using: str | None = None) -> SyncResult:
    """Make the rows match this process's declarations. Workers call it when they start.

    New schedules get a row whose first tick is the first one after now (database clock).
    A changed cron expression or time zone restarts the ticks from now; other changes
    (arguments, queue, policy) apply from the next tick. Rows no longer declared are
    marked removed (logged, shown in the admin and ``jobguard_status``) and never ticked
    again; declared again, they are restored. Pausing is the operators' and stays.
    """

    alias = using or get_settings().database_alias
    declared = declared_schedules()
    schedules = Schedule.objects.using(alias)
    rows = {row.name: row for row in schedules.all()}
    now = store.database_now(alias) if declared else None
    result = SyncResult()
    for name, spec in declared.items():
        assert now is not None  # noqa: S101 - declared is not empty here
        fields = _definition(spec)
        sealed = _seals(spec.task)
        row = rows.get(name)
        if row is None:
            if sealed:
                fields["args"], fields["kwargs"] = (
                    seal_json(fields["args"], ARGS),
                    seal_json(fields["kwargs"], KWARGS),
                )
            first = _first_tick(name, spec.cron, spec.timezone, now)
            # Another worker starting at the same moment may insert it first: that is fine.
            schedules.bulk_create([Schedule(name=name, next_tick_at=first, **fields)], ignore_conflicts=True)
            result.created.append(name)
            logger.info("schedule_created name=%s cron=%r next_tick_at=%s", name, spec.cron, first)
            continue
        changes = {field: value for field, value in fields.items() if _stored(row, field, sealed) != value}
        for field, kind in (("args", ARGS), ("kwargs", KWARGS)):
            if field in changes and sealed:
                changes[field] = seal_json(changes[field], kind)
        if row.removed_at is not None:
            changes["removed_at"] = None
            result.restored.append(name)
        if {"cron", "timezone"} & set(changes) or row.removed_at is not None or row.next_tick_at is None:
            changes["next_tick_at"] = _first_tick(name, spec.cron, spec.timezone, now)
        if changes:
            schedules.filter(pk=row.pk).update(**changes, updated_at=Now())
            if row.removed_at is None:
                result.updated.append(name)
            logger.info("schedule_synced name=%s changed=%s", name, ",".join(sorted(changes)))
    for name, row in rows.items():
        if name not in declared and row.removed_at is None:
            if schedules.filter(pk=row.pk, removed_at__isnull=True).update(
                removed_at=Now(), updated_at=Now()
            ):
                result.removed.append(name)
                logger.warning(
                    "schedule_removed name=%s task=%s; no longer declared, so it no longer runs",
                    name,
                    row.task_name,
                    extra={"schedule": name},
                )
    return result


# -- the scheduler pass ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class EnqueuedTick:
    """One tick's job, enqueued by this pass."""

    schedule: str
    tick_at: datetime.datetime
    job_id: int


@dataclasses.dataclass(slots=True)
class SchedulerPass:
    """What :func:`run_once` did."""

    enqueued: list[EnqueuedTick] = dataclasses.field(default_factory=list)
    #: Missed ticks (not enqueued, by policy), per schedule.
    missed: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Due schedules another scheduler held or had already advanced.
    contended: int = 0
    #: Set when the pass synced first (a declared schedule had no row).
    synced: SyncResult | None = None
    #: Seconds (database clock) until the earliest next tick of the schedules this process
    #: ticks; None when it has none. Workers sleep until then, so all of them arrive at a
    #: tick together and its lag stays small.
    next_due_in: float | None = None


def run_once(*, using: str | None = None) -> SchedulerPass:
    """Enqueue the ticks that are due, each in its own transaction; return what was done.

    Only schedules this process declares (and whose task it has) are ticked, from their
    row's definition. Safe to run in any number of processes at once.
    """

    conf = get_settings()
    alias = using or conf.database_alias
    declared = declared_schedules()
    result = SchedulerPass()
    if not declared:
        return result  # nothing to tick here; removals are noted by sync() at start
    rows = list(
        Schedule.objects.using(alias).annotate(
            db_now=Now(),
            is_due=ExpressionWrapper(
                Q(next_tick_at__lte=Now(), paused=False, removed_at__isnull=True), output_field=BooleanField()
            ),
        )
    )
    if set(declared) - {row.name for row in rows}:
        result.synced = sync(using=alias)
    upcoming: list[datetime.datetime] = []
    for row in rows:
        if row.name not in declared or row.paused or row.removed_at is not None or row.next_tick_at is None:
            continue
        if row.task_name not in registry:
            continue  # a worker that has the task ticks it; do not wake for it
        if row.is_due:
            row.next_tick_at = _tick(row, alias, result) or row.next_tick_at
        # A row still due was taken by another scheduler (which commits it), so it needs no
        # early pass: a winner killed mid-tick leaves it to the next regular one.
        if row.next_tick_at > row.db_now:
            upcoming.append(row.next_tick_at)
    if upcoming:
        result.next_due_in = (min(upcoming) - rows[0].db_now).total_seconds()
    return result


def _tick(row: Schedule, alias: str, result: SchedulerPass) -> datetime.datetime | None:
    """One due schedule, in one transaction: lock, plan, compare-and-set, enqueue.

    Returns the schedule's new next tick when this pass advanced it.
    """

    task = registry.find(row.task_name)
    if task is None:
        logger.debug("schedule_task_unknown name=%s task=%s", row.name, row.task_name)
        return None
    conf = get_settings().scheduler
    candidates = Schedule.objects.using(alias).filter(
        pk=row.pk, next_tick_at=row.next_tick_at, paused=False, removed_at__isnull=True
    )
    now: datetime.datetime = row.db_now  # type: ignore[attr-defined]
    assert row.next_tick_at is not None  # noqa: S101 - is_due implies a tick
    plan: TickPlan | None = None
    try:
        with transaction.atomic(using=alias):
            fresh = _locked_now(candidates, alias, now)
            if fresh is None:
                result.contended += 1
                return None
            now = fresh
            plan = plan_ticks(
                row.cron,
                row.timezone,
                row.next_tick_at,
                now,
                missed=row.missed,
                missed_after=conf.missed_after,
                catch_up_max=conf.catch_up_max,
            )
            changes: dict[str, Any] = {"next_tick_at": plan.next_tick_at, "updated_at": Now()}
            if plan.ticks:
                changes["last_tick_at"] = plan.ticks[-1]
            # The real guard: only one scheduler moves next_tick_at on from the value it read.
            if not candidates.update(**changes):
                result.contended += 1
                return None
            jobs = _enqueue_ticks(row, task, plan, alias)
            if _faults.ENABLED:
                _faults.maybe_crash("in_schedule_tick")
            transaction.on_commit(partial(_committed, row.name, plan, now, jobs), using=alias)
    except (InvalidArgumentsError, IdempotencyConflict, InvalidScheduleError) as exc:
        return _skip_failed_tick(row, candidates, plan, exc)
    for job, tick in zip(jobs, plan.ticks, strict=True):
        result.enqueued.append(EnqueuedTick(row.name, tick, job.pk))
    if plan.missed:
        result.missed[row.name] = plan.missed
    return plan.next_tick_at


def _locked_now(
    candidates: QuerySet[Schedule], alias: str, now: datetime.datetime
) -> datetime.datetime | None:
    """The database time with the schedule's row locked, or None when another scheduler holds it.

    ``now`` on a database that cannot skip locked rows (the compare-and-set still guards).
    """
    if not connections[alias].features.has_select_for_update_skip_locked:
        return now
    # Another scheduler holds the row: it is ticking this schedule right now.
    locked = candidates.select_for_update(skip_locked=True).annotate(db_now=Now())
    fresh: datetime.datetime | None = locked.values_list("db_now", flat=True).first()
    return fresh


def _enqueue_ticks(row: Schedule, task: Task, plan: TickPlan, alias: str) -> list[Job]:
    """One job per tick of ``plan`` (idempotent per tick); the schedule remembers the last."""
    args, kwargs = _arguments(row)
    jobs = [
        task.using(idempotency_key=tick_key(row.name, tick), queue_name=row.queue_name or None).enqueue(
            *args, **kwargs
        )
        for tick in plan.ticks
    ]
    if jobs:
        Schedule.objects.using(alias).filter(pk=row.pk).update(last_job=jobs[-1])
    return jobs


def _skip_failed_tick(
    row: Schedule, candidates: QuerySet[Schedule], plan: TickPlan | None, exc: Exception
) -> datetime.datetime | None:
    """Move past a tick that failed deterministically; its new next tick, or None if not moved."""
    # Deterministic: the same tick would fail again on every pass. Move past it.
    logger.error(
        "schedule_tick_failed name=%s task=%s error=%s; tick skipped",
        row.name,
        row.task_name,
        exc,
        extra={"schedule": row.name},
    )
    if plan is not None and candidates.update(next_tick_at=plan.next_tick_at, updated_at=Now()):
        events.emit(events.ScheduleTicksMissed(row.name, len(plan.ticks) + plan.missed))
        return plan.next_tick_at
    return None


def _committed(name: str, plan: TickPlan, now: datetime.datetime, jobs: list[Job]) -> None:
    for job, tick in zip(jobs, plan.ticks, strict=True):
        lag = (now - tick).total_seconds()
        events.emit(events.ScheduleTicked(name, lag))
        logger.info(
            "schedule_tick_enqueued name=%s tick_at=%s job_id=%s lag=%.3fs",
            name,
            tick.isoformat(),
            job.pk,
            lag,
            extra={"schedule": name, "job_id": job.pk},
        )
    if plan.missed:
        events.emit(events.ScheduleTicksMissed(name, plan.missed))
        logger.warning(
            "schedule_ticks_missed name=%s missed=%d next_tick_at=%s",
            name,
            plan.missed,
            plan.next_tick_at.isoformat(),
            extra={"schedule": name},
        )


# -- operators' verbs --------------------------------------------------------------------


def _require(user: Any, permission: str, verb: str) -> None:
    if user is None or not user.has_perm(f"jobguard.{permission}"):
        raise PermissionDenied(f"Only users with the jobguard.{permission} permission can {verb} schedules.")


def _actor(user: Any) -> str:
    return str(user.get_username()) if user is not None and hasattr(user, "get_username") else "system"


def pause(schedule: Schedule, *, user: Any) -> bool:
    """Stop ticking ``schedule`` (needs ``jobguard.pause_schedule``). False if already paused."""

    _require(user, "pause_schedule", "pause")
    changed = (
        Schedule.objects.using(schedule._state.db)
        .filter(pk=schedule.pk, paused=False)
        .update(paused=True, paused_at=Now(), paused_by=user if user.pk else None, updated_at=Now())
    )
    if changed:
        logger.info(
            "schedule_paused name=%s user=%r", schedule.name, _actor(user), extra={"schedule": schedule.name}
        )
    return bool(changed)


def resume(schedule: Schedule, *, user: Any) -> bool:
    """Tick ``schedule`` again from its next tick after now; the paused ticks do not run."""

    _require(user, "pause_schedule", "resume")
    alias = schedule._state.db or get_settings().database_alias
    first = _first_tick(schedule.name, schedule.cron, schedule.timezone, store.database_now(alias))
    changed = (
        Schedule.objects.using(alias)
        .filter(pk=schedule.pk, paused=True)
        .update(paused=False, paused_at=None, paused_by=None, next_tick_at=first, updated_at=Now())
    )
    if changed:
        logger.info(
            "schedule_resumed name=%s user=%r next_tick_at=%s",
            schedule.name,
            _actor(user),
            first,
            extra={"schedule": schedule.name},
        )
    return bool(changed)


def run_now(schedule: Schedule, *, user: Any) -> Job:
    """Enqueue an extra job of ``schedule`` now, keyed ``schedule:<name>:manual:<uuid>``.

    Needs ``jobguard.run_schedule``. The regular ticks are not touched. Logged with the user
    (the admin also records it in the schedule's history).
    """
    _require(user, "run_schedule", "run")
    if schedule.removed_at is not None:
        raise InvalidArgumentsError(
            f"schedule {schedule.name!r} is removed (no longer declared); it cannot run."
        )
    task = registry.get(schedule.task_name)
    key = f"schedule:{schedule.name}:manual:{uuid.uuid4().hex}"
    args, kwargs = _arguments(schedule)
    job = task.using(idempotency_key=key, queue_name=schedule.queue_name or None).enqueue(*args, **kwargs)
    logger.info(
        "schedule_run_now name=%s user=%r job_id=%s key=%r",
        schedule.name,
        _actor(user),
        job.pk,
        key,
        extra={"schedule": schedule.name, "job_id": job.pk},
    )
    return job
