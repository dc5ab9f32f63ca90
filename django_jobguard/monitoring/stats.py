"""Queue statistics read from the database: what ``jobguard_status`` prints and the queue gauges export.

One function, :func:`queue_stats`, computes every number so the command and the
Prometheus collector cannot disagree. It runs a fixed number of queries whatever the
number of queues or rows (:data:`QUERIES` without the last-hour counts,
:data:`QUERIES_WITH_RECENT` with them), and each is served by an index:

- queued jobs, grouped by queue: an index-only scan of the partial index on queued rows
  (``jobguard_job_due_idx``), so finished history costs nothing and the cost grows with the
  backlog only;
- running jobs, grouped by queue: a few rows, found through ``status`` (the partial lease
  index or the status index);
- unresolved dead letters (not replayed, not rejected), grouped by queue: the replay-state
  index;
- paused queues: the few rows of the partial index on paused queue states;
- with ``recent=True``: jobs finished in the last hour, a range of the
  ``(status, finished_at)`` index.

Times come from the database clock, like every time the worker compares against.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, DurationField, ExpressionWrapper, Min, Q, QuerySet
from django.db.models.functions import Now

from .. import flow, store
from ..conf import get_settings
from ..models import (
    Breaker,
    BreakerState,
    DeadLetter,
    Job,
    JobStatus,
    QueueState,
    ReplayState,
    Schedule,
    WorkerBeat,
    Workflow,
    WorkflowState,
)
from ..registry import registry

__all__ = [
    "QUERIES",
    "QUERIES_WITH_RECENT",
    "RECENT_WINDOW_SECONDS",
    "WORKFLOW_QUERIES",
    "BreakerStats",
    "EventLoopStats",
    "LimitStats",
    "QueueStats",
    "ScheduleStats",
    "WorkflowStats",
    "breaker_stats",
    "event_loop_stats",
    "limit_stats",
    "oldest_due_ages",
    "queue_stats",
    "schedule_stats",
    "waiting_keys",
    "workflow_stats",
]

#: Window of the "succeeded / failed in the last hour" counts, in seconds.
RECENT_WINDOW_SECONDS = 3600
#: Queries :func:`queue_stats` runs without, and with, the last-hour counts.
QUERIES = 4
QUERIES_WITH_RECENT = 5
#: Queries :func:`workflow_stats` runs (the workflow gauges, beside the queue gauges).
WORKFLOW_QUERIES = 1


@dataclasses.dataclass(slots=True)
class QueueStats:
    """The numbers of one queue at one moment."""

    queue: str
    #: Queued jobs that are due (``run_after`` has passed): the work waiting for a worker.
    depth: int = 0
    #: Queued jobs that may not start yet (a future ``run_after``: retries, delayed jobs).
    scheduled: int = 0
    #: Of the scheduled jobs, those that failed before: waiting out a retry backoff.
    waiting_for_retry: int = 0
    #: Running jobs whose lease is live (database clock): the job list's *running* state.
    in_flight: int = 0
    #: Running jobs whose lease expired (database clock), not in :attr:`in_flight`: the
    #: job list's *stuck* state, until the reaper hands them back.
    stuck: int = 0
    #: Seconds the oldest due job has waited since its ``run_after`` (0 when none is due).
    oldest_age_seconds: float = 0.0
    #: Dead letters of this queue not replayed and not rejected.
    dead_letters: int = 0
    #: Dead letters whose replay was requested and awaits approval.
    pending_approvals: int = 0
    #: Whether the queue is paused (workers do not claim from it; enqueues still work).
    paused: bool = False
    #: Jobs that succeeded in the last hour (None when not computed).
    succeeded_last_hour: int | None = None
    #: Jobs that ended dead (dead-lettered) in the last hour (None when not computed).
    failed_last_hour: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``--json`` output of ``jobguard_status``)."""
        return dataclasses.asdict(self)


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, datetime.timedelta):
        return max(0.0, value.total_seconds())
    # SQLite returns the difference as microseconds when the converter is bypassed.
    return max(0.0, float(value) / 1_000_000)


def queue_stats(
    alias: str | None = None, *, recent: bool = False, queues: Iterable[str] | None = None
) -> list[QueueStats]:
    """Statistics of every queue, sorted by name.

    Every queue named in ``JOBGUARD["QUEUES"]``, the default queue, and every queue that
    has queued or running jobs or unresolved dead letters or is paused get a row (zeros included, so a
    queue that empties does not vanish from dashboards). ``queues`` restricts the rows
    (and the queries) to those names. ``recent`` adds the last-hour success and failure
    counts, at the cost of one more query.
    """

    conf = get_settings()
    alias = alias or conf.database_alias
    wanted = sorted(set(queues)) if queues is not None else None
    jobs = Job.objects.using(alias).order_by()
    letters = DeadLetter.objects.using(alias).order_by()
    if wanted is not None:
        jobs = jobs.filter(queue_name__in=wanted)
        letters = letters.filter(queue_name__in=wanted)

    names = set(wanted) if wanted is not None else {*conf.queues, conf.default_queue}
    rows: dict[str, QueueStats] = {}
    _count_queued(jobs, rows)
    _count_running(jobs, rows)
    _count_dead_letters(letters, rows)
    _mark_paused(alias, wanted, rows)
    if recent:
        _count_recent(jobs, rows)

    for name in names:
        _row(rows, name)
    if recent:
        for stats in rows.values():
            stats.succeeded_last_hour = stats.succeeded_last_hour or 0
            stats.failed_last_hour = stats.failed_last_hour or 0
    return [rows[name] for name in sorted(rows)]


def _row(rows: dict[str, QueueStats], name: str) -> QueueStats:
    """The row of queue ``name``, created with zeros on first sight."""
    if name not in rows:
        rows[name] = QueueStats(queue=name)
    return rows[name]


def _count_queued(jobs: QuerySet[Job], rows: dict[str, QueueStats]) -> None:
    """Depth, scheduled and retry-waiting counts and the oldest due job's age: one query."""
    due = Q(run_after__lte=Now())
    queued = (
        jobs.filter(status=JobStatus.QUEUED)
        .values("queue_name")
        .annotate(
            depth=Count("pk", filter=due),
            scheduled=Count("pk", filter=~due),
            waiting_for_retry=Count("pk", filter=~due & Q(first_failed_at__isnull=False)),
            oldest_age=ExpressionWrapper(Now() - Min("run_after", filter=due), output_field=DurationField()),
        )
    )
    for item in queued:
        stats = _row(rows, item["queue_name"])
        stats.depth = item["depth"]
        stats.scheduled = item["scheduled"]
        stats.waiting_for_retry = item["waiting_for_retry"]
        stats.oldest_age_seconds = _seconds(item["oldest_age"]) if item["depth"] else 0.0


def _count_running(jobs: QuerySet[Job], rows: dict[str, QueueStats]) -> None:
    """Running jobs per queue, live leases apart from expired ones: one query.

    The split is the job list's (``JobQuerySet.leased`` and ``expired_leases``): a stuck
    job is not in flight, whatever page counts it.
    """
    live = Q(lease_expires_at__gte=Now())
    running = (
        jobs.filter(status=JobStatus.RUNNING)
        .values("queue_name")
        .annotate(n=Count("pk", filter=live), stuck=Count("pk", filter=~live))
    )
    for run in running:
        stats = _row(rows, run["queue_name"])
        stats.in_flight, stats.stuck = run["n"], run["stuck"]


def _count_dead_letters(letters: QuerySet[DeadLetter], rows: dict[str, QueueStats]) -> None:
    """Unresolved dead letters and pending approvals per queue: one query."""
    # Dead letters that still sit in the dead-letter queue: nobody rejected them and no
    # replay has taken them out yet.
    unresolved_states = (ReplayState.NONE, ReplayState.REQUESTED, ReplayState.APPROVED)
    unresolved = (
        letters.filter(replay_state__in=unresolved_states)
        .values("queue_name")
        .annotate(n=Count("pk"), pending=Count("pk", filter=Q(replay_state=ReplayState.REQUESTED)))
    )
    for letter in unresolved:
        stats = _row(rows, letter["queue_name"])
        stats.dead_letters = letter["n"]
        stats.pending_approvals = letter["pending"]


def _mark_paused(alias: str, wanted: list[str] | None, rows: dict[str, QueueStats]) -> None:
    """Flag the paused queues: one query."""
    states = QueueState.objects.using(alias).filter(paused=True)
    if wanted is not None:
        states = states.filter(queue_name__in=wanted)
    for name in states.values_list("queue_name", flat=True):
        _row(rows, name).paused = True


def _count_recent(jobs: QuerySet[Job], rows: dict[str, QueueStats]) -> None:
    """Successes and dead ends of the last hour per queue: one query."""
    finished = (
        jobs.filter(
            status__in=(JobStatus.SUCCEEDED, JobStatus.DEAD),
            finished_at__gte=Now() - datetime.timedelta(seconds=RECENT_WINDOW_SECONDS),
        )
        .values("queue_name", "status")
        .annotate(n=Count("pk"))
    )
    for done in finished:
        stats = _row(rows, done["queue_name"])
        if done["status"] == JobStatus.SUCCEEDED:
            stats.succeeded_last_hour = done["n"]
        else:
            stats.failed_last_hour = done["n"]


@dataclasses.dataclass(slots=True)
class ScheduleStats:
    """Where one schedule stands (``jobguard_status``, the admin's list shows the same)."""

    name: str
    task: str
    cron: str
    timezone: str
    #: ``active``, ``paused``, or ``removed`` (no longer declared: not ticked).
    state: str
    next_tick_at: datetime.datetime | None
    last_tick_at: datetime.datetime | None
    last_job_id: int | None
    #: Status of the last tick's job (None when it has none, or it was deleted).
    last_job_status: str | None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601)."""
        data = dataclasses.asdict(self)
        for field in ("next_tick_at", "last_tick_at"):
            value = data[field]
            data[field] = value.isoformat() if value is not None else None
        return data


@dataclasses.dataclass(frozen=True, slots=True)
class EventLoopStats:
    """One live worker's event loop (``--async-slots``) as its last beat reported it."""

    worker_id: str
    slots: int
    in_use: int
    #: The loop's worst lag over the beat interval before that beat, in milliseconds.
    lag_ms: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def event_loop_stats(alias: str | None = None, *, live_within: float = 15.0) -> list[EventLoopStats]:
    """The workers with async slots that beat in the last ``live_within`` seconds: one query."""
    alias = alias or get_settings().database_alias
    cutoff = ExpressionWrapper(Now() - datetime.timedelta(seconds=live_within), output_field=DurationField())
    rows = (
        WorkerBeat.objects.using(alias)
        .filter(async_slots__gt=0, last_beat_at__gte=cutoff)
        .order_by("worker_id")
        .values_list("worker_id", "async_slots", "async_in_use", "loop_lag_ms")
    )
    return [EventLoopStats(*row) for row in rows]


def schedule_stats(alias: str | None = None) -> list[ScheduleStats]:
    """Every schedule row, removed ones included, sorted by name: one query."""

    alias = alias or get_settings().database_alias
    rows = Schedule.objects.using(alias).select_related("last_job").order_by("name")
    return [
        ScheduleStats(
            name=row.name,
            task=row.task_name,
            cron=row.cron,
            timezone=row.timezone,
            state=row.state,
            next_tick_at=row.next_tick_at,
            last_tick_at=row.last_tick_at,
            last_job_id=row.last_job_id,
            last_job_status=row.last_job.status if row.last_job is not None else None,
        )
        for row in rows
    ]


def oldest_due_ages(alias: str | None = None) -> dict[str, float]:
    """Seconds the oldest due job of each queue with due jobs has waited (see the store's)."""
    return store.oldest_due_ages(alias or get_settings().database_alias)


# -- flow-control limits --------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class LimitStats:
    """One declared flow-control limit at one moment."""

    #: ``queue:<name>``, ``task:<task>``, ``limit:<name>``, ``rate:task:<task>``,
    #: ``rate:limit:<name>``, or ``<task>[<key template>]`` for a keyed one.
    limit: str
    #: ``concurrency`` or ``rate``.
    kind: str
    #: The declared bound: jobs at once (per key for a keyed limit), or the rate.
    bound: str
    #: Running jobs counted under it (all keys together).
    running: int = 0
    #: Keys at their concurrency (0 or 1 for an unkeyed limit; always 0 for a rate).
    full_keys: int = 0
    #: Due queued jobs that count under it: what waits on it when it is full.
    waiting: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _rate_text(interval: float, burst: int) -> str:
    per_second = 1.0 / interval
    return f"{per_second:g}/s burst {burst}"


def limit_stats(alias: str | None = None) -> list[LimitStats]:
    """Every declared limit with its use now: two grouped reads of the limited queues' jobs.

    Empty, with no query, when nothing is limited.
    """
    plan = registry.flow_plan()
    if plan is None:
        return []
    alias = alias or get_settings().database_alias
    running, waiting = store.flow_usage(alias, plan)
    rows: dict[str, LimitStats] = {}
    for key, capacity in plan.capacities.items():
        rows[key] = LimitStats(key, "concurrency", str(capacity))
    for key, rate in plan.rates.items():
        rows[key] = LimitStats(key, "rate", _rate_text(rate.interval, rate.burst))
    for task_name, capacity in plan.keyed_capacity.items():
        family = f"c:{task_name}"
        rows[family] = LimitStats(
            f"{task_name}[{plan.templates.get(family, '')}]", "concurrency", f"{capacity} per key"
        )
    for task_name, rate in plan.keyed_rates.items():
        family = f"r:{task_name}"
        rows[family] = LimitStats(
            f"{task_name}[{plan.templates.get(family, '')}]",
            "rate",
            f"{_rate_text(rate.interval, rate.burst)} per key",
        )
    for key, count in running.items():
        row = rows.get(flow.family(key))
        if row is None:
            continue
        row.running += count
        bound = plan.capacity(key)
        if bound is not None and count >= bound:
            row.full_keys += 1
    for key, count in waiting.items():
        row = rows.get(flow.family(key))
        if row is not None:
            row.waiting += count
    return sorted(rows.values(), key=lambda row: (row.kind, row.limit))


@dataclasses.dataclass(slots=True)
class WorkflowStats:
    """Unfinished workflows of one kind: how many, and how long the oldest has been open."""

    kind: str
    #: Workflows not finished: open batches, and closed ones with members still pending.
    open: int = 0
    #: Seconds since the oldest of them was created (0 when there is none).
    oldest_age_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def workflow_stats(alias: str | None = None) -> list[WorkflowStats]:
    """Unfinished workflows per kind (chain, group, batch, graph): one query.

    Served by the partial index on unfinished workflows (``jobguard_workflow_unfinished``):
    finished ones, however many, cost nothing. Every kind is listed, 0 when none is open.
    """
    alias = alias or get_settings().database_alias
    rows = {kind: WorkflowStats(kind) for kind in ("chain", "group", "batch", "graph")}
    found = (
        Workflow.objects.using(alias)
        .exclude(state=WorkflowState.FINISHED)
        .values("kind")
        .annotate(
            n=Count("pk"),
            oldest_age=ExpressionWrapper(Now() - Min("created_at"), output_field=DurationField()),
        )
    )
    for item in found:
        row = rows.setdefault(item["kind"], WorkflowStats(item["kind"]))
        row.open = item["n"]
        row.oldest_age_seconds = _seconds(item["oldest_age"])
    return list(rows.values())


def waiting_keys(alias: str | None = None, top: int = 20) -> list[tuple[str, int]]:
    """The limit keys with the most due jobs waiting, most first: where a backlog sits."""
    plan = registry.flow_plan()
    if plan is None:
        return []
    _, waiting = store.flow_usage(alias or get_settings().database_alias, plan)
    return sorted(waiting.items(), key=lambda item: (-item[1], item[0]))[:top]


# -- circuit breakers and retry budgets -----------------------------------------------------


@dataclasses.dataclass(slots=True)
class BreakerStats:
    """One named limit's breaker and retry budget at one moment."""

    limit: str
    #: ``closed``, ``open`` or ``half_open`` (``closed`` for a limit with a budget only).
    state: str = BreakerState.CLOSED
    #: Held open or closed by an operator.
    manual: bool = False
    #: Seconds until an open breaker half-opens (None: not open, or open by hand).
    opens_in: float | None = None
    #: The breaker's window so far: attempts that ended, and how many failed transiently.
    calls: int = 0
    failures: int = 0
    #: The declared breaker, as text ("" without one).
    breaker: str = ""
    #: The retry budget: the declared one as text, first attempts and retries started in the
    #: window, and the retries it still allows (None without a budget).
    budget: str = ""
    first_attempts: int = 0
    retries: int = 0
    budget_remaining: int | None = None
    #: Due jobs of the guarded tasks, and of those the retries.
    waiting: int = 0
    waiting_retries: int = 0
    changed_at: datetime.datetime | None = None
    changed_by: str = ""
    reason: str = ""

    @property
    def state_value(self) -> int:
        """0 closed, 1 half-open, 2 open (the ``jobguard_breaker_state`` gauge)."""
        return {"open": 2, "half_open": 1}.get(self.state, 0)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["changed_at"] = self.changed_at.isoformat() if self.changed_at is not None else None
        return data


def breaker_stats(alias: str | None = None) -> list[BreakerStats]:
    """Every named limit with a breaker or a retry budget that a task or an outbox destination
    names: two reads (their rows, their waiting jobs).

    Empty, with no query, when none is declared.
    """
    plan = registry.flow_plan()
    guards = dict(plan.guards) if plan is not None else {}
    guarded_tasks = plan.guarded_tasks if plan is not None else {}
    conf = get_settings()
    for destination in conf.outbox.destinations.values():
        # A destination's LIMIT guards its sends with the same breaker and budget.
        limit = conf.limits.get(destination.limit or "")
        if limit is not None and (limit.breaker is not None or limit.retry_budget is not None):
            guards.setdefault(limit.name, flow.BreakerGate(limit.breaker, limit.retry_budget))
    if not guards:
        return []
    alias = alias or conf.database_alias
    now = store.database_now(alias).timestamp()
    rows = {row.name: row for row in Breaker.objects.using(alias).filter(name__in=list(guards))}
    waiting = (
        Job.objects.using(alias)
        .filter(status=JobStatus.QUEUED, run_after__lte=Now(), task_name__in=list(guarded_tasks))
        .values("task_name")
        .annotate(total=Count("id"), retries=Count("id", filter=Q(attempts__gt=0)))
    )
    result: dict[str, BreakerStats] = {}
    for name, guard in sorted(guards.items()):
        stats = result[name] = BreakerStats(name)
        row = rows.get(name)
        if guard.breaker is not None:
            spec = guard.breaker
            stats.breaker = (
                f"{spec.failure_rate:.0%} of >= {spec.min_calls} calls in {spec.window:g}s; "
                f"open {spec.open_for:g}s; {spec.probes} probes"
            )
            if row is not None:
                stats.state, stats.manual = row.state, row.manual
                if row.state == BreakerState.OPEN and row.open_until is not None:
                    stats.opens_in = max(0.0, row.open_until - now)
                if now - row.window_start < spec.window:
                    stats.calls, stats.failures = row.calls, row.failures
                stats.changed_at, stats.changed_by = row.changed_at, row.changed_by_name
                stats.reason = row.reason
        if guard.budget is not None:
            budget = guard.budget
            stats.budget = (
                f"{budget.ratio:.0%} of first attempts, at least {budget.min_retries} per {budget.window:g}s"
            )
            if row is not None and now - row.budget_start < budget.window:
                stats.first_attempts, stats.retries = row.first_attempts, row.retries
            stats.budget_remaining = max(0, budget.allowed(stats.first_attempts) - stats.retries)
    for entry in waiting:
        stats_of = result.get(guarded_tasks.get(entry["task_name"], ""))
        if stats_of is not None:
            stats_of.waiting += entry["total"]
            stats_of.waiting_retries += entry["retries"]
    return list(result.values())
