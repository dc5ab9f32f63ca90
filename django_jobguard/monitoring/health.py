"""Queue health: the numbers and last-hour series the admin's health page shows.

:func:`queue_health` runs :data:`QUERIES` indexed queries whatever the table size: the
queue statistics (:func:`django_jobguard.stats.queue_stats`), the jobs that finished in
the last hour per minute (a range of the partial index on finished rows,
``jobguard_job_finished_idx``), and the per-minute rows the workers write
(:class:`~django_jobguard.models.QueueMinute`: failed attempts, retries, oldest-age samples).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from django.db.models import Count, Max, Sum
from django.db.models.functions import Now, TruncMinute
from django.utils import timezone

from ..conf import get_settings
from ..models import Job, JobStatus, QueueMinute, WorkerBeat
from . import beats
from .stats import QUERIES_WITH_RECENT as STATS_QUERIES
from .stats import QueueStats, queue_stats

__all__ = ["CHART_MINUTES", "QUERIES", "SERIES", "Health", "queue_health"]

#: Minutes the charts cover.
CHART_MINUTES = 60
#: Queries :func:`queue_health` runs: the statistics with the last hour's counts, the charts'
#: two, the live workers and the stuck jobs.
QUERIES = STATS_QUERIES + 2 + 2
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
    return Health(
        queues=rows, live_workers=live_workers, stuck=stuck, minutes=minutes, series=series, generated_at=now
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
