"""Queue health: the numbers, the causes and last-hour series the admin's health page shows.

:func:`queue_health` runs at most :data:`QUERIES` queries whatever the number of queues: the
queue statistics (:func:`django_jobguard.stats.queue_stats`), the jobs that finished in
the last hour per minute (a range of the partial index on finished rows,
``jobguard_job_finished_idx``), and the per-minute rows the workers write
(:class:`~django_jobguard.models.QueueMinute`: failed attempts, retries, oldest-age samples).

Beside the figures it names, per queue, why the queue is held back or needs a look
(:class:`Cause`): dead letters, leases past their end, no live worker, a pause (by whom), an
open breaker (when it probes next), a full concurrency limit, a lock its waiting jobs keep
running into while its holder is gone. Each cause has a severity, a sentence, the runbook to
follow and the filtered list that shows its jobs; :meth:`Health.triaged` ranks the queues by
them. The causes cost a few grouped reads (:data:`CAUSE_QUERIES` at most), never one per queue.

The outbox's destinations get causes of their own (:func:`outbox_causes`), from
:func:`django_jobguard.outbox.stats.destination_stats`: a key held by a dead message (critical:
nothing behind it is delivered), an oldest undelivered message older than
:func:`~django_jobguard.outbox.stats.warn_after` (300 s; a warning: the relay falls behind or does not run),
dead messages passed over and not yet settled, messages of a destination no longer declared.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from collections.abc import Mapping
from typing import Any

from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import Now, TruncMinute
from django.utils import timezone

from .. import store
from ..conf import get_settings
from ..exceptions import LockUnavailable
from ..flow import family
from ..locks.holders import held_locks
from ..models import Breaker, BreakerState, Job, JobStatus, QueueMinute, QueueState, WorkerBeat
from ..outbox import stats as outbox_stats
from ..registry import registry
from ..store.horizon import Holder, holders
from . import beats
from .stats import QUERIES_WITH_RECENT as STATS_QUERIES
from .stats import QueueStats, queue_stats

__all__ = [
    "CHART_MINUTES",
    "CRITICAL",
    "NOTE",
    "QUERIES",
    "SERIES",
    "WARNING",
    "Cause",
    "Health",
    "Pause",
    "destination_breakers",
    "outbox_causes",
    "queue_health",
]

#: Minutes the charts cover.
CHART_MINUTES = 60
#: Queries :func:`queue_health` runs whatever the queues: the statistics with the last hour's
#: counts, the charts' two, the live workers and the stuck jobs...
BASE_QUERIES = STATS_QUERIES + 2 + 2
#: The charted series: key, title, unit.
SERIES = (
    ("succeeded", "Succeeded per minute", "jobs"),
    ("failed", "Failed attempts per minute", "attempts"),
    ("retried", "Retries scheduled per minute", "attempts"),
    ("dead_lettered", "Dead-lettered per minute", "jobs"),
    ("oldest_age_seconds", "Oldest due job's age (largest sample per minute)", "seconds"),
)


@dataclasses.dataclass
class Health:
    """Every queue's figures now, and per-minute series over the last :data:`CHART_MINUTES`."""

    queues: list[QueueStats]
    #: Live workers (a beat within beats.STALE_AFTER_SECONDS) that serve each queue, by name.
    live_workers: dict[str, int]
    #: Running jobs whose lease has expired, by queue: no live worker holds them (the reaper
    #: hands them back; if none runs, nothing does).
    stuck: dict[str, int]
    #: Start of each charted minute, oldest first (UTC).
    minutes: list[datetime.datetime]
    #: One value per minute for each key of :data:`SERIES` (None: no sample that minute).
    series: dict[str, list[float | None]]
    generated_at: datetime.datetime
    #: Why each queue is held back or needs a look, most severe first (empty: nothing found).
    causes: dict[str, list[Cause]] = dataclasses.field(default_factory=dict)
    #: Who paused each paused queue, when and why.
    pauses: dict[str, Pause] = dataclasses.field(default_factory=dict)
    #: What has held PostgreSQL's vacuum horizon past ``HORIZON["WARN_AFTER"]``, oldest first:
    #: a cause of the whole cluster, not of one queue (the page shows it above the queues).
    horizon: list[HorizonHold] = dataclasses.field(default_factory=list)
    #: Each outbox destination's backlog (none when no destination is declared).
    outbox: list[outbox_stats.DestinationStats] = dataclasses.field(default_factory=list)
    #: Why each destination needs a look, most severe first (empty: nothing found).
    outbox_causes: dict[str, list[Cause]] = dataclasses.field(default_factory=dict)

    def severity(self, queue: str) -> int:
        """The queue's most severe cause (-1 with none)."""
        return max((cause.severity for cause in self.causes.get(queue, [])), default=-1)

    def triaged(self) -> list[QueueStats]:
        """The queues in trouble first (most severe cause, then the oldest due job), the rest by name."""
        return sorted(
            self.queues,
            key=lambda stats: (
                -max(self.severity(stats.queue), NOTE),
                -stats.oldest_age_seconds if self.severity(stats.queue) > NOTE else 0.0,
                stats.queue,
            ),
        )


def queue_health(alias: str | None = None, *, queue: str | None = None) -> Health:
    """The health of every queue, and the series of ``queue`` (all queues when None)."""

    alias = alias or get_settings().database_alias
    rows = queue_stats(alias, recent=True)
    live_workers = _live_workers(alias, [stats.queue for stats in rows])
    stuck = {
        item["queue_name"]: item["n"]
        for item in Job.objects.using(alias)
        .order_by()
        .filter(status=JobStatus.RUNNING, lease_expires_at__lt=Now())
        .values("queue_name")
        .annotate(n=Count("pk"))
    }
    now = timezone.now()
    last = now.replace(second=0, microsecond=0)
    minutes = [last - datetime.timedelta(minutes=n) for n in range(CHART_MINUTES - 1, -1, -1)]
    index = {minute: i for i, minute in enumerate(minutes)}
    series: dict[str, list[float | None]] = {key: [0.0] * CHART_MINUTES for key, _, _ in SERIES}
    series["oldest_age_seconds"] = [None] * CHART_MINUTES

    finished = (
        Job.objects.using(alias)
        .order_by()
        .filter(
            status__in=(JobStatus.SUCCEEDED, JobStatus.DEAD),
            finished_at__gte=Now() - datetime.timedelta(minutes=CHART_MINUTES),
        )
    )
    per_minute = QueueMinute.objects.using(alias).order_by().filter(minute__gte=minutes[0])
    if queue is not None:
        finished = finished.filter(queue_name=queue)
        per_minute = per_minute.filter(queue_name=queue)
    buckets = finished.annotate(at=TruncMinute("finished_at")).values("at", "status").annotate(n=Count("pk"))
    for bucket in buckets:
        i = _slot(index, bucket["at"])
        if i is not None:
            key = "succeeded" if bucket["status"] == JobStatus.SUCCEEDED else "dead_lettered"
            series[key][i] = float(bucket["n"])
    sums = per_minute.values("minute").annotate(
        failed=Sum("failed"), retried=Sum("retried"), oldest=Max("oldest_age_seconds")
    )
    for item in sums:
        i = _slot(index, item["minute"])
        if i is None:
            continue
        series["failed"][i] = float(item["failed"] or 0)
        series["retried"][i] = float(item["retried"] or 0)
        series["oldest_age_seconds"][i] = item["oldest"]
    pauses = {
        row.queue_name: Pause(row.changed_by_name, row.changed_at, row.reason)
        for row in QueueState.objects.using(alias).filter(paused=True)
    }
    destinations = outbox_stats.destination_stats() if get_settings().outbox.destinations else []
    gates = destination_breakers(alias) if destinations else {}
    return Health(
        queues=rows,
        live_workers=live_workers,
        stuck=stuck,
        minutes=minutes,
        series=series,
        generated_at=now,
        causes=_causes(alias, rows, live_workers, stuck, pauses, now),
        pauses=pauses,
        horizon=horizon_holds(alias),
        outbox=destinations,
        outbox_causes=outbox_causes(destinations, gates),
    )


def _live_workers(alias: str, names: list[str]) -> dict[str, int]:
    """How many live workers serve each of ``names`` (a worker listing no queue serves all)."""
    cutoff = Now() - datetime.timedelta(seconds=beats.STALE_AFTER_SECONDS)
    served = WorkerBeat.objects.using(alias).filter(last_beat_at__gte=cutoff).values_list("queues", flat=True)
    counts = dict.fromkeys(names, 0)
    for queues in served:
        listed = set(queues.split(",")) if queues and queues != "*" else None
        for name in names:
            if listed is None or name in listed:
                counts[name] += 1
    return counts


def _slot(index: dict[datetime.datetime, int], at: Any) -> int | None:
    if at is None:
        return None
    if timezone.is_naive(at):
        at = timezone.make_aware(at, datetime.UTC)
    return index.get(at.astimezone(datetime.UTC).replace(second=0, microsecond=0))


# -- triage: why a queue is in trouble ------------------------------------------------------

#: Severities of a :class:`Cause`: the queue's work does not move; it moves but needs a look;
#: a note that does not rank the queue among those in trouble.
CRITICAL, WARNING, NOTE = 2, 1, 0
#: A due job older than this (seconds) with nothing else to explain it is a backlog.
BACKLOG_SECONDS = 60.0
#: Put-backs on one lock key (all its waiting jobs together) worth a warning while its holder runs.
LOCK_CONTENTIONS_WARNING = 100
#: Contended lock keys read at most (the most contended first).
LOCK_KEYS_READ = 50
#: Keys of a keyed limit named in one cause (the rest are counted).
KEYS_NAMED = 3
#: The lock causes' queries: the contended keys, then their locks as the Locks page reads them
#: (the lock rows, the holders' jobs, their workers' beats, the waiting jobs).
LOCK_QUERIES = 1 + 4
#: The most queries :func:`queue_health` adds to :data:`BASE_QUERIES` for the causes: the pause
#: rows; the lock causes; the limited queues' jobs, the breaker rows and the database clock.
CAUSE_QUERIES = 1 + LOCK_QUERIES + 3


@dataclasses.dataclass(frozen=True, slots=True)
class Cause:
    """One reason a queue is held back or needs a look, in words, with where to look next."""

    #: ``dead_lettered``, ``dead_letters``, ``stuck``, ``no_worker``, ``paused``, ``breaker``,
    #: ``limit``, ``lock``, ``backlog`` or ``approvals``; an outbox destination's:
    #: ``outbox_held``, ``outbox_breaker``, ``outbox_lag``, ``outbox_undeclared`` or ``outbox_dead``.
    kind: str
    #: :data:`CRITICAL`, :data:`WARNING` or :data:`NOTE`.
    severity: int
    #: One sentence an operator reads on the page (plain text).
    text: str
    #: The runbook under ``docs/runbooks/`` (its file name without ``.md``).
    runbook: str
    #: The list that shows the jobs behind the cause: ``jobs``, ``dead_letters``, ``breakers``,
    #: ``locks`` or ``outbox`` (the admin's change lists), and its query-string filters.
    target: str
    params: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Pause:
    """Who paused a queue, when and why."""

    by: str
    at: datetime.datetime
    reason: str


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _duration(seconds: float) -> str:
    """``42 s``, ``16 min``, ``3 h 5 min``."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours} h {rest // 60} min"


def _causes(
    alias: str,
    rows: list[QueueStats],
    live_workers: dict[str, int],
    stuck: dict[str, int],
    pauses: dict[str, Pause],
    now: datetime.datetime,
) -> dict[str, list[Cause]]:
    """Every queue's causes, most severe first: :data:`CAUSE_QUERIES` queries at most, whatever the queues."""
    found: dict[str, list[Cause]] = {stats.queue: [] for stats in rows}
    holds: dict[str, list[Cause]] = {name: [] for name in found}
    for cause_queue, cause in [*_flow_causes(alias), *_lock_causes(alias, now)]:
        holds.setdefault(cause_queue, []).append(cause)
        found.setdefault(cause_queue, [])
    for stats in rows:
        name = stats.queue
        causes = found[name]
        if stats.failed_last_hour:
            causes.append(
                Cause(
                    "dead_lettered",
                    CRITICAL,
                    f"{_plural(stats.failed_last_hour, 'job')} dead-lettered in the last hour"
                    f" ({stats.dead_letters:,} unresolved in all)",
                    "dead-letters",
                    "dead_letters",
                    (("queue_name", name), ("created_at__gte", _iso(now - datetime.timedelta(hours=1)))),
                )
            )
        elif stats.dead_letters:
            causes.append(
                Cause(
                    "dead_letters",
                    WARNING,
                    f"{_plural(stats.dead_letters, 'dead letter')} unresolved (none in the last hour)",
                    "growing-dead-letter-queue",
                    "dead_letters",
                    (("queue_name", name), ("replay_state__in", UNRESOLVED)),
                )
            )
        workers = live_workers.get(name, 0)
        if not workers and (stats.depth or stats.in_flight or stats.scheduled):
            waiting = stats.depth + stats.in_flight
            causes.append(
                Cause(
                    "no_worker",
                    CRITICAL if waiting else WARNING,
                    f"no live worker serves this queue ({_plural(stats.depth, 'due job')}, "
                    f"{stats.in_flight:,} running, {stats.scheduled:,} scheduled)",
                    "no-live-worker",
                    "jobs",
                    (("queue_name", name), ("state", "due")),
                )
            )
        if stuck.get(name):
            causes.append(
                Cause(
                    "stuck",
                    WARNING if workers else CRITICAL,
                    f"{_plural(stuck[name], 'running job')} past the lease: "
                    + ("the reaper hands them back" if workers else "no live worker reaps them"),
                    "lease-reappearances",
                    "jobs",
                    (("queue_name", name), ("state", "stuck")),
                )
            )
        pause = pauses.get(name)
        if pause is not None:
            causes.append(
                Cause(
                    "paused",
                    WARNING,
                    f"paused by {pause.by or 'unknown'} {_duration((now - pause.at).total_seconds())} ago"
                    + (f": {pause.reason}" if pause.reason else ""),
                    "paused-queue",
                    "jobs",
                    (("queue_name", name), ("state", "due")),
                )
            )
        causes.extend(holds.get(name, []))
        explained = any(cause.kind in ("no_worker", "paused", "breaker", "limit", "lock") for cause in causes)
        if stats.oldest_age_seconds >= BACKLOG_SECONDS and not explained:
            causes.append(
                Cause(
                    "backlog",
                    WARNING,
                    f"the oldest due job has waited {_duration(stats.oldest_age_seconds)} "
                    f"({_plural(stats.depth, 'due job')}, {_plural(workers, 'live worker')})",
                    "rising-backlog",
                    "jobs",
                    (("queue_name", name), ("state", "due")),
                )
            )
        if stats.pending_approvals:
            causes.append(
                Cause(
                    "approvals",
                    NOTE,
                    f"{_plural(stats.pending_approvals, 'replay')} awaiting approval",
                    "replay",
                    "dead_letters",
                    (("queue_name", name), ("replay_state__exact", "requested")),
                )
            )
    for causes in found.values():
        causes.sort(key=lambda cause: -cause.severity)
    return found


#: The replay states of a dead letter still in the dead-letter queue (as the statistics count).
UNRESOLVED = "none,requested,approved"


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).isoformat(timespec="seconds")


def _flow_causes(alias: str) -> list[tuple[str, Cause]]:
    """Queues waiting on an open breaker or a full concurrency limit: at most three queries.

    One grouped read of the limited queues' running and due jobs (what the claim counts), and,
    when a limit has a breaker, the breaker rows and the database clock.
    """
    plan = registry.flow_plan()
    if plan is None:
        return []
    running: Counter[str] = Counter()
    #: Due jobs per (queue, task, limit key).
    waiting: Counter[tuple[str, str, str]] = Counter()
    groups = (
        Job.objects.using(alias)
        .order_by()
        .filter(queue_name__in=sorted(plan.queues))
        .filter(
            Q(status=JobStatus.RUNNING)
            | Q(status=JobStatus.QUEUED, run_after__lte=Now(), attempts__lt=F("max_attempts"))
        )
        .values_list("status", "queue_name", "task_name", "flow_keys")
        .annotate(n=Count("pk"))
    )
    for status, queue_name, task_name, flow_keys, n in groups:
        keys = plan.keys_of(task_name, queue_name, flow_keys if isinstance(flow_keys, list) else [])
        if status == JobStatus.RUNNING:
            for key in keys:
                if plan.capacity(key) is not None:
                    running[key] += n
        else:
            for key in keys:
                waiting[queue_name, task_name, key] += n
            guard = plan.guarded_tasks.get(task_name)
            if guard is not None:
                waiting[queue_name, task_name, f"breaker:{guard}"] += n
    found: list[tuple[str, Cause]] = []
    # Breakers: every queue with due jobs of a task behind one that is not closed.
    behind: dict[tuple[str, str], int] = Counter()
    for (queue_name, _task, key), n in waiting.items():
        if key.startswith("breaker:"):
            behind[queue_name, key[8:]] += n
    if behind:
        names = sorted({name for _queue, name in behind})
        now = store.database_now(alias).timestamp()
        breakers = {row.name: row for row in Breaker.objects.using(alias).filter(name__in=names)}
        for (queue_name, name), n in sorted(behind.items()):
            row = breakers.get(name)
            if row is None or row.state == BreakerState.CLOSED:
                continue
            jobs = _plural(n, "due job")
            if row.state == BreakerState.HALF_OPEN:
                text, severity = f"breaker {name} half-open: probing ({jobs} wait)", WARNING
            elif row.manual:
                by = row.changed_by_name or "an operator"
                text = f"breaker {name} open by hand by {by}" + (f": {row.reason}" if row.reason else "")
                text, severity = f"{text} ({jobs} wait until it is closed)", CRITICAL
            else:
                probe = max(0.0, (row.open_until or now) - now)
                text, severity = (
                    f"breaker {name} open, next probe in {_duration(probe)} ({jobs} wait)",
                    CRITICAL,
                )
            found.append(
                (
                    queue_name,
                    Cause("breaker", severity, text, "open-breaker", "breakers", (("", f"breaker-{name}"),)),
                )
            )
    # Concurrency limits at their bound with due jobs of this queue counted under them.
    full: dict[tuple[str, str], list[str]] = {}
    full_waiting: Counter[tuple[str, str]] = Counter()
    for (queue_name, _task, key), n in sorted(waiting.items()):
        bound = plan.capacity(key)
        if bound is None or running[key] < bound:
            continue
        fam = family(key)
        keyed = fam != key
        entry = full.setdefault((queue_name, fam), [])
        if keyed and key not in entry:
            entry.append(key)
        full_waiting[queue_name, fam] += n
    for (queue_name, fam), keys in sorted(full.items()):
        n = full_waiting[queue_name, fam]
        jobs = _plural(n, "due job")
        if keys:
            task_name = fam[2:]
            shown = ", ".join(key.split("|", 1)[1] for key in keys[:KEYS_NAMED])
            more = f" and {len(keys) - KEYS_NAMED:,} more" if len(keys) > KEYS_NAMED else ""
            template = plan.templates.get(fam, "")
            text = (
                f"limit {template} of {task_name.rsplit('.', 1)[-1]} full for {shown}{more} "
                f"({plan.keyed_capacity.get(task_name)} per key running; {jobs} wait)"
            )
        else:
            bound = plan.capacity(fam)
            text = f"limit {_limit_name(fam)} full: {running[fam]:,} of {bound} running ({jobs} wait)"
        found.append(
            (
                queue_name,
                Cause(
                    "limit",
                    WARNING,
                    text,
                    "full-limit",
                    "jobs",
                    (("queue_name", queue_name), ("state", "due")),
                ),
            )
        )
    return found


def _limit_name(key: str) -> str:
    """``limit:carrier`` -> ``carrier``; ``task:app.tasks.send`` -> ``of task send``."""
    kind, _, name = key.partition(":")
    if kind == "limit":
        return name
    if kind == "task":
        return f"of task {name.rsplit('.', 1)[-1]}"
    return f"of queue {name}"


def _lock_causes(alias: str, now: datetime.datetime) -> list[tuple[str, Cause]]:
    """Queues whose jobs are put back on a taken lock: at most :data:`LOCK_QUERIES` queries.

    The queued jobs put back on a lock, per queue and key; then those keys' locks as the
    Locks page reads them (:func:`.locks.holders.held_locks`): the holder named by the lock's
    own owner token, and whether it is gone. A lock whose holder is gone is released by
    nobody: its waiters spin until its TTL ends.
    """
    groups = list(
        Job.objects.using(alias)
        .order_by()
        .filter(status=JobStatus.QUEUED, lock_contentions__gt=0)
        .exclude(lock_key="")
        .values_list("queue_name", "lock_key")
        .annotate(times=Sum("lock_contentions"), jobs=Count("pk"), since=Min("enqueued_at"))
        .order_by("-times")[:LOCK_KEYS_READ]
    )
    if not groups:
        return []
    try:
        held = held_locks(sorted({key for _queue, key, *_rest in groups}), alias)
    except LockUnavailable:
        return []  # the lock store does not answer: the page shows the rest
    prefix = get_settings().locks.prefix
    found: list[tuple[str, Cause]] = []
    for queue_name, key, times, jobs, since in groups:
        lock = held.get(key)
        if lock is None:
            continue  # free (or expired) now: the next try takes it
        rate = times / max(1.0, (now - since).total_seconds()) if since is not None else 0.0
        spin = f"lock {key} contended {_plural(times, 'time')} ({rate:.1f}/s) by {_plural(jobs, 'job')}"
        if not lock.stuck:
            if times < LOCK_CONTENTIONS_WARNING:
                continue
            holder = lock.holder
            where = (
                f"held by job #{holder.job_id} on {holder.worker_id or 'a worker'}"
                if holder is not None
                else "held by code outside a job"
            )
            params = (("queue_name", queue_name), ("lock_key", key))
            found.append(
                (queue_name, Cause("lock", WARNING, f"{spin}; {where}", "stuck-locks", "jobs", params))
            )
            continue
        why = lock.holder.why if lock.holder is not None else "it has no TTL"
        text = f"{spin} with its holder gone: {why}" + (
            f" It expires in {_duration(lock.ttl_left)}." if lock.ttl_left is not None else ""
        )
        found.append(
            (queue_name, Cause("lock", CRITICAL, text, "stuck-locks", "locks", (("q", prefix + key),)))
        )
    return found


# -- the cluster: what holds the vacuum horizon -----------------------------------------------

#: A replication slot or a standby holding the horizon by this many transactions is shown
#: (neither has a clock to say for how long; the workers' watcher measures that).
HORIZON_XID_AGE_SHOWN = 1_000_000
#: The runbook of a held horizon.
HORIZON_RUNBOOK = "vacuum-horizon-held"


@dataclasses.dataclass(frozen=True, slots=True)
class HorizonHold:
    """Something that holds the vacuum horizon of the cluster the jobs live in, in words."""

    holder: Holder
    #: ``vacuum horizon held by session pid 4242 (database app, user report, ...) for 12 min``.
    text: str
    runbook: str = HORIZON_RUNBOOK


def horizon_holds(alias: str) -> list[HorizonHold]:
    """What holds the vacuum horizon past ``HORIZON["WARN_AFTER"]`` (one query; none but on PostgreSQL).

    A session or a prepared transaction by its age; a replication slot or a standby (no clock)
    when it holds :data:`HORIZON_XID_AGE_SHOWN` transactions or more, or is an inactive slot.
    The query's text is left out: the page's readers may not be the session's.
    """
    warn_after = get_settings().horizon.warn_after
    found = []
    for holder in holders(alias):
        if holder.age_seconds is not None:
            if holder.age_seconds < warn_after:
                continue
            since = f" for {_duration(holder.age_seconds)}"
        elif holder.xid_age >= HORIZON_XID_AGE_SHOWN or (
            holder.kind == "replication slot" and holder.pid is None
        ):
            since = ""
        else:
            continue
        found.append(
            HorizonHold(
                holder,
                f"vacuum horizon held by {holder.describe()}{since} "
                f"({_plural(holder.xid_age, 'transaction')} since its xmin): dead job rows cannot be "
                "vacuumed and claims slow down",
            )
        )
    return found


# -- the outbox: destinations whose messages wait ------------------------------------------

#: The runbooks of the outbox's causes.
HELD_KEY_RUNBOOK = "held-outbox-key"
OUTBOX_LAG_RUNBOOK = "outbox-lag"


@dataclasses.dataclass(frozen=True, slots=True)
class DestinationBreaker:
    """The breaker of the limit a destination names (``LIMIT``), as one read found it."""

    limit: str
    state: str
    manual: bool
    changed_by: str
    reason: str
    #: Seconds until an open breaker lets a probe through (0 when it may now).
    opens_in: float


def destination_breakers(alias: str) -> dict[str, DestinationBreaker]:
    """The breakers of the limits destinations name that are not closed, by destination: one
    read, none when no destination names a limit with a breaker."""
    conf = get_settings()
    named = {
        name: config.limit
        for name, config in conf.outbox.destinations.items()
        if config.limit is not None and (guard := conf.limits.get(config.limit)) and guard.breaker
    }
    if not named:
        return {}
    rows = {
        row.name: row
        for row in Breaker.objects.using(alias)
        .annotate(db_now=Now())
        .filter(name__in=sorted(set(named.values())))
        .exclude(state=BreakerState.CLOSED)
    }
    found: dict[str, DestinationBreaker] = {}
    for destination, limit_name in named.items():
        row = rows.get(limit_name)
        if row is not None:
            now = row.db_now.timestamp()
            opens_in = max(0.0, (row.open_until or now) - now)
            found[destination] = DestinationBreaker(
                limit_name, row.state, row.manual, row.changed_by_name, row.reason, opens_in
            )
    return found


def outbox_causes(
    rows: list[outbox_stats.DestinationStats], breakers: Mapping[str, DestinationBreaker] | None = None
) -> dict[str, list[Cause]]:
    """Why each destination needs a look, most severe first: no query (the statistics and
    ``breakers``, from :func:`destination_breakers`, hold it all).

    A held key is critical (its messages stop until an operator acts), and so is the open
    breaker of the limit it names (half-open, a warning); an oldest undelivered message past
    :func:`~django_jobguard.outbox.stats.warn_after` with no held key or breaker to explain it,
    a warning; dead messages passed over (``ON_FAILURE`` "skip") and not yet settled, a note.
    """
    warn_after = outbox_stats.warn_after()
    found: dict[str, list[Cause]] = {}
    breakers = breakers or {}
    for stats in rows:
        name = stats.destination
        causes = found.setdefault(name, [])
        messages = (("destination", name),)
        gate = breakers.get(name) if stats.declared else None
        if gate is not None:
            pending = _plural(stats.pending, "message")
            if gate.state == BreakerState.HALF_OPEN:
                text, severity = (
                    f"breaker {gate.limit} half-open: probing the receiver ({pending} pending)",
                    WARNING,
                )
            elif gate.manual:
                by = gate.changed_by or "an operator"
                text = f"breaker {gate.limit} open by hand by {by}" + (
                    f": {gate.reason}" if gate.reason else ""
                )
                text, severity = f"{text} (nothing is sent until it is closed; {pending} pending)", CRITICAL
            else:
                text, severity = (
                    f"breaker {gate.limit} open: nothing is sent, next probe in {_duration(gate.opens_in)} "
                    f"({pending} pending)",
                    CRITICAL,
                )
            causes.append(
                Cause(
                    "outbox_breaker",
                    severity,
                    text,
                    "open-breaker",
                    "breakers",
                    (("", f"breaker-{gate.limit}"),),
                )
            )
        if not stats.declared and stats.pending:
            causes.append(
                Cause(
                    "outbox_undeclared",
                    CRITICAL,
                    f"not declared in JOBGUARD['OUTBOX']['DESTINATIONS']: "
                    f"{_plural(stats.pending, 'message')} wait for no relay",
                    OUTBOX_LAG_RUNBOOK,
                    "outbox",
                    (*messages, ("state__exact", "pending")),
                )
            )
        if stats.held_keys:
            causes.append(
                Cause(
                    "outbox_held",
                    CRITICAL,
                    f"{_plural(stats.held_keys, 'key')} held by a dead message: nothing behind it is "
                    f"delivered until it is replayed or skipped (oldest undelivered "
                    f"{_duration(stats.oldest_age_seconds)}, {stats.pending:,} pending)",
                    HELD_KEY_RUNBOOK,
                    "outbox",
                    (*messages, ("holds", "yes")),
                )
            )
        elif stats.declared and stats.pending and stats.oldest_age_seconds >= warn_after and gate is None:
            causes.append(
                Cause(
                    "outbox_lag",
                    WARNING,
                    f"the oldest undelivered message has waited {_duration(stats.oldest_age_seconds)}, "
                    f"past {_duration(warn_after)} ({_plural(stats.pending, 'message')} pending)",
                    OUTBOX_LAG_RUNBOOK,
                    "outbox",
                    (*messages, ("state__exact", "pending")),
                )
            )
        passed = stats.dead - stats.held_keys
        if passed > 0:
            causes.append(
                Cause(
                    "outbox_dead",
                    NOTE,
                    f"{_plural(passed, 'dead message')} passed over, neither replayed nor skipped yet",
                    HELD_KEY_RUNBOOK,
                    "outbox",
                    (*messages, ("state__exact", "dead")),
                )
            )
        causes.sort(key=lambda cause: -cause.severity)
    return found


#: The most queries :func:`queue_health` runs, whatever the number of queues, rows and
#: destinations (with the horizon's, on PostgreSQL, and the outbox's when a destination is declared).
QUERIES = BASE_QUERIES + CAUSE_QUERIES + 1 + outbox_stats.QUERIES + 1
