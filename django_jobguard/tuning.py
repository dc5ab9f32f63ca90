"""Observed job durations and the visibility timeouts they call for (``jobguard_tune``, W005, W006).

A run's duration is ``finished_at - started_at`` of a succeeded job: both are written by
statements the job needs anyway (the claim sets ``started_at``, the ack ``finished_at``,
each from the database clock), so recording durations costs nothing on the hot path. It is
the time the job's last lease covered, from claim to ack, which is what the visibility
timeout must outlast when heartbeats stall.

Reads go through the partial index on finished jobs (``jobguard_job_finished_idx``, on
``(status, finished_at)``): a window of recent runs is a range of it, however many older
rows the table keeps. Percentiles are ``percentile_cont`` (linear interpolation between the
two nearest ranks): on PostgreSQL computed by the database in one query; on SQLite, which
has no percentile function, one statement ranks each task's durations with window functions
and returns only the two rows per percentile it interpolates between.

The SQL differs per database, so it branches on ``connection.vendor`` here rather than in
``leasing.py``: this is read-only reporting, kept out of the module of the hot path.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections

from .conf import Settings, get_settings
from .registry import registry

__all__ = [
    "PERCENTILES",
    "SPLIT_FLOOR_SECONDS",
    "Durations",
    "QueueReport",
    "TaskReport",
    "observed_durations",
    "recommend_timeout",
    "report",
]

#: The percentiles reported, as fractions.
PERCENTILES = (0.5, 0.95, 0.99)
#: Durations below this count as this much when tasks of a queue are compared: splitting
#: off work that takes a few milliseconds from work that takes a second gains nothing.
SPLIT_FLOOR_SECONDS = 1.0

_TABLE = "jobguard_job"
# The partial index's own condition, repeated so that SQLite (which does not deduce it from
# status = 'succeeded') picks the index too.
_FINISHED = "status IN ('succeeded', 'dead', 'cancelled') AND status = 'succeeded' AND started_at IS NOT NULL"


@dataclasses.dataclass(frozen=True, slots=True)
class Durations:
    """Seconds from claim to ack of one task's succeeded runs in the window."""

    queue: str
    task: str
    count: int
    p50: float
    p95: float
    p99: float
    max: float


def observed_durations(alias: str, *, since: float, queue: str | None = None) -> list[Durations]:
    """Durations per (queue, task) of the jobs that succeeded in the last ``since`` seconds."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return _postgres(alias, since, queue)
    return _sqlite(alias, since, queue)


def postgres_sql(since: float, queue: str | None) -> tuple[str, list[Any]]:
    """The PostgreSQL statement of :func:`observed_durations` and its parameters."""
    params: list[Any] = [since]
    queue_filter = ""
    if queue is not None:
        queue_filter = "AND queue_name = %s "
        params.append(queue)
    sql = (
        "SELECT queue_name, task_name, count(*), "
        "percentile_cont(ARRAY[0.5, 0.95, 0.99]::float8[]) WITHIN GROUP (ORDER BY d), max(d) "
        "FROM (SELECT queue_name, task_name, "
        "EXTRACT(EPOCH FROM finished_at - started_at)::float8 AS d "
        f"FROM {_TABLE} WHERE {_FINISHED} "
        "AND finished_at >= statement_timestamp() - %s * interval '1 second' "
        f"{queue_filter}) AS runs GROUP BY queue_name, task_name ORDER BY queue_name, task_name"
    )
    return sql, params


def _postgres(alias: str, since: float, queue: str | None) -> list[Durations]:
    sql, params = postgres_sql(since, queue)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [
        Durations(queue=q, task=t, count=n, p50=ps[0], p95=ps[1], p99=ps[2], max=top)
        for q, t, n, ps, top in rows
    ]


# julianday() keeps about 0.1 ms of precision at today's dates: rounded to the millisecond
# (the resolution of the worker's SQLite timestamps), so 25 s reads as 25.0, not 25.00004.
_SQLITE_DURATION = "round((julianday(finished_at) - julianday(started_at)) * 86400.0, 3)"


def sqlite_sql(since: float, queue: str | None) -> tuple[str, list[Any]]:
    """The SQLite statement of :func:`observed_durations` and its parameters."""
    params: list[Any] = [f"-{since:.3f} seconds"]
    queue_filter = ""
    if queue is not None:
        queue_filter = "AND queue_name = %s "
        params.append(queue)
    # Window functions rank each task's durations; only the rows at the ranks the
    # percentiles interpolate between (two per percentile) leave the database. One
    # statement, so the counts and the ranks come from one snapshot.
    ranks = ", ".join(
        f"CAST({fraction!r} * (n - 1) AS INTEGER), CAST({fraction!r} * (n - 1) AS INTEGER) + 1"
        for fraction in PERCENTILES
    )
    sql = (
        "SELECT queue_name, task_name, n, top, position, d FROM ("
        "SELECT queue_name, task_name, d, "
        "row_number() OVER (PARTITION BY queue_name, task_name ORDER BY d) - 1 AS position, "
        "count(*) OVER (PARTITION BY queue_name, task_name) AS n, "
        "max(d) OVER (PARTITION BY queue_name, task_name) AS top "
        f"FROM (SELECT queue_name, task_name, {_SQLITE_DURATION} AS d FROM {_TABLE} "
        f"WHERE {_FINISHED} AND finished_at >= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) "
        f"{queue_filter}) AS runs) AS ranked "
        f"WHERE position IN ({ranks}) ORDER BY queue_name, task_name, position"
    )
    return sql, params


def _sqlite(alias: str, since: float, queue: str | None) -> list[Durations]:
    sql, params = sqlite_sql(since, queue)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    groups: dict[tuple[str, str], tuple[int, float, dict[int, float]]] = {}
    for queue_name, task_name, count, top, position, value in rows:
        groups.setdefault((queue_name, task_name), (count, top, {}))[2][position] = value
    found = []
    for (queue_name, task_name), (count, top, kept) in groups.items():
        values = [_interpolate(f, count, kept) for f in PERCENTILES]
        found.append(
            Durations(
                queue=queue_name,
                task=task_name,
                count=count,
                p50=values[0],
                p95=values[1],
                p99=values[2],
                max=top,
            )
        )
    return found


def _ranks(fraction: float, count: int) -> tuple[int, int]:
    """The two 0-based ranks ``percentile_cont(fraction)`` interpolates between."""
    low = math.floor(fraction * (count - 1))
    return low, min(low + 1, count - 1)


def _interpolate(fraction: float, count: int, values: dict[int, float]) -> float:
    position = fraction * (count - 1)
    low, high = _ranks(fraction, count)
    return values[low] + (position - low) * (values[high] - values[low])


def _round_up(seconds: float) -> float:
    """Up to a value an operator would type: whole seconds, then 5 s, 30 s, 1 min steps."""
    for limit, step in ((10, 1), (120, 5), (1200, 30)):
        if seconds <= limit:
            return float(max(1, math.ceil(seconds / step - 1e-6) * step))
    return float(math.ceil(seconds / 60 - 1e-6) * 60)


def recommend_timeout(p99: float, conf: Settings | None = None) -> tuple[float, str]:
    """The visibility timeout a p99 duration calls for, and why.

    ``p99 * SAFETY_FACTOR``, but at least ``p99 + HEARTBEAT_MARGIN``, rounded up.
    """
    tuning = (conf or get_settings()).tuning
    scaled = p99 * tuning.safety_factor
    margin = p99 + tuning.heartbeat_margin
    if scaled >= margin:
        raw, why = scaled, f"p99 {p99:.3g}s x safety factor {tuning.safety_factor:g}"
    else:
        raw, why = margin, f"p99 {p99:.3g}s + heartbeat margin {tuning.heartbeat_margin:g}s"
    value = _round_up(raw)
    return value, f"{why} = {raw:.3g}s, rounded up to {value:g}s"


def split_needed(durations: Iterable[float], factor: float) -> tuple[float, float] | None:
    """(fastest, slowest) when they differ by more than ``factor``, else None."""
    values = [max(d, SPLIT_FLOOR_SECONDS) for d in durations]
    if len(values) < 2:
        return None
    fastest, slowest = min(values), max(values)
    return (fastest, slowest) if slowest > fastest * factor else None


@dataclasses.dataclass(frozen=True, slots=True)
class TaskReport:
    """One task's observed durations against the timeout its jobs get."""

    durations: Durations
    visibility_timeout: float
    recommended: float
    reason: str
    #: JOBGUARD["TUNING"]["MIN_RUNS"] when the report was made.
    min_runs: int

    @property
    def few_runs(self) -> bool:
        """Fewer runs in the window than MIN_RUNS: the p99, and the recommendation, are a weak basis."""
        return self.durations.count < self.min_runs

    @property
    def exceeds_timeout(self) -> bool:
        """Its p99 outlasts its visibility timeout: a stalled heartbeat lets such runs reappear."""
        return self.durations.p99 > self.visibility_timeout


@dataclasses.dataclass(frozen=True, slots=True)
class QueueReport:
    """A queue's tasks, its configured timeout and the one its slowest task calls for."""

    queue: str
    visibility_timeout: float
    tasks: Sequence[TaskReport]
    recommended: float
    reason: str
    #: (fastest p99, slowest p99) when they differ by more than QUEUE_SPLIT_FACTOR.
    split: tuple[float, float] | None


def task_timeout(task_name: str, queue: str, conf: Settings) -> float:
    """The visibility timeout a task's jobs get: its own option, else its queue's."""
    registered = registry.find(task_name)
    if registered is not None and registered.visibility_timeout:
        return float(registered.visibility_timeout)
    return conf.queue(queue).visibility_timeout


def report(alias: str, *, since: float, queue: str | None = None) -> list[QueueReport]:
    """Per queue, per task: observed durations, configured and recommended visibility timeouts."""
    conf = get_settings()
    by_queue: dict[str, list[TaskReport]] = {}
    for durations in observed_durations(alias, since=since, queue=queue):
        recommended, reason = recommend_timeout(durations.p99, conf)
        by_queue.setdefault(durations.queue, []).append(
            TaskReport(
                durations=durations,
                visibility_timeout=task_timeout(durations.task, durations.queue, conf),
                recommended=recommended,
                reason=reason,
                min_runs=conf.tuning.min_runs,
            )
        )
    reports = []
    for name, tasks in sorted(by_queue.items()):
        slowest = max(tasks, key=lambda t: t.durations.p99)
        reports.append(
            QueueReport(
                queue=name,
                visibility_timeout=conf.queue(name).visibility_timeout,
                tasks=tasks,
                recommended=slowest.recommended,
                reason=f"its slowest task, {slowest.durations.task}: {slowest.reason}",
                split=split_needed((t.durations.p99 for t in tasks), conf.tuning.queue_split_factor),
            )
        )
    return reports
