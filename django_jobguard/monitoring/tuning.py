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

The statements are the store's (``observed_durations`` in ``store/postgres.py`` and
``store/sqlite.py``); this module turns their rows into reports and recommendations.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from .. import store
from ..conf import Settings, get_settings
from ..registry import registry

__all__ = [
    "SPLIT_FLOOR_SECONDS",
    "Durations",
    "QueueReport",
    "TaskReport",
    "observed_durations",
    "recommend_timeout",
    "report",
]

#: Durations below this count as this much when tasks of a queue are compared: splitting
#: off work that takes a few milliseconds from work that takes a second gains nothing.
SPLIT_FLOOR_SECONDS = 1.0


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
    return [
        Durations(queue=q, task=t, count=n, p50=ps[0], p95=ps[1], p99=ps[2], max=top)
        for q, t, n, ps, top in store.observed_durations(alias, since, queue)
    ]


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
