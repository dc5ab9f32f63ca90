"""The console's rows: a worker's heartbeat row and the per-minute queue figures.

The same SQL on every database but for the upsert clause: ``INSERT ... ON CONFLICT`` on
PostgreSQL and SQLite, ``ON DUPLICATE KEY UPDATE`` on MariaDB/MySQL (:func:`_upsert`).
Table names are the models' own (``db_table``), read when a statement is built.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.utils import timezone

#: Seconds between two beats (row upserts and outcome flushes) of one worker.
WORKER_BEAT_INTERVAL_SECONDS = 5.0
#: A worker whose last beat is older than this is marked stale (three missed beats).
STALE_AFTER_SECONDS = 3 * WORKER_BEAT_INTERVAL_SECONDS


#: The console's per-minute rows and worker rows older than this (seconds) are deleted by the
#: worker's beat (:func:`prune_console_rows`).
CONSOLE_ROWS_KEPT_FOR_SECONDS = 24 * 3600


def is_stale(last_beat_at: datetime.datetime, now: datetime.datetime | None = None) -> bool:
    """Whether a worker whose last beat was at ``last_beat_at`` missed three beats.

    Here, below the monitoring and the lock services that both ask it.
    """
    now = now or timezone.now()
    return (now - last_beat_at).total_seconds() > STALE_AFTER_SECONDS


def _tables() -> tuple[str, str]:
    from ..models import QueueMinute, WorkerBeat  # app registry: see common

    return WorkerBeat._meta.db_table, QueueMinute._meta.db_table


def _upsert(alias: str, conflict: str) -> tuple[str, str, str]:
    """The upsert clause on ``conflict``'s unique columns, the new row's prefix, and the time now."""
    if connections[alias].vendor == "mysql":
        # VALUES(column) is the new row's value; UTC whatever the session's time zone.
        return "ON DUPLICATE KEY UPDATE", "VALUES({})", "UTC_TIMESTAMP(6)"
    return f"ON CONFLICT ({conflict}) DO UPDATE SET", "excluded.{}", "CURRENT_TIMESTAMP"


def upsert_worker_beat(
    alias: str,
    *,
    worker_id: str,
    host: str,
    pid: int,
    queues: str,
    concurrency: int,
    started_at: datetime.datetime,
    jobs_in_hand: int,
    async_slots: int = 0,
    async_in_use: int = 0,
    loop_lag_ms: int = 0,
) -> None:
    """Insert the worker's row, or update it to this process and its last beat to now (one statement)."""
    connection = connections[alias]
    table = _tables()[0]
    upsert, new, now = _upsert(alias, "worker_id")
    updated = ", ".join(
        f"{column} = {new.format(column)}"
        for column in (
            "jobs_in_hand",
            "host",
            "pid",
            "queues",
            "concurrency",
            "started_at",
            "async_slots",
            "async_in_use",
            "loop_lag_ms",
        )
    )
    sql = (
        f"INSERT INTO {table} (worker_id, host, pid, queues, concurrency, started_at, last_beat_at, "
        f"jobs_in_hand, async_slots, async_in_use, loop_lag_ms) VALUES (%s, %s, %s, %s, %s, %s, {now}, %s, "
        "%s, %s, %s) "
        # The identity too: a worker id reused by a restarted process (WORKER_ID from a pod
        # name, --worker-id) must show the process that beats now, not the first one.
        f"{upsert} last_beat_at = {now}, {updated}"
    )
    params: list[Any] = [
        worker_id,
        host,
        pid,
        queues,
        concurrency,
        connection.ops.adapt_datetimefield_value(started_at),
        jobs_in_hand,
        async_slots,
        async_in_use,
        loop_lag_ms,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def delete_worker_beat(alias: str, worker_id: str, host: str, pid: int) -> int:
    """Delete ``worker_id``'s row if process ``pid`` on ``host`` wrote it last (its clean exit).

    Matched on the process too: a restarted process that took the row over keeps it.
    """
    table = _tables()[0]
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {table} WHERE worker_id = %s AND host = %s AND pid = %s", [worker_id, host, pid]
        )
        return int(cursor.rowcount)


def worker_beat_process(alias: str, worker_id: str) -> tuple[str, int] | None:
    """``(host, pid)`` of the process that last wrote ``worker_id``'s row; None if it has none."""
    table = _tables()[0]
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT host, pid FROM {table} WHERE worker_id = %s", [worker_id])
        row = cursor.fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def add_minute_counts(
    alias: str, columns: Sequence[str], counts: Sequence[tuple[str, datetime.datetime, Sequence[int]]]
) -> None:
    """Add ``(queue, minute, values)`` to the minutes' ``columns``, creating rows (one statement)."""
    connection = connections[alias]
    table = _tables()[1]
    rows = []
    params: list[Any] = []
    for queue, minute, values in counts:
        rows.append("(" + ", ".join(["%s"] * (2 + len(columns))) + ")")
        params += [queue, connection.ops.adapt_datetimefield_value(minute), *values]
    upsert, new, _ = _upsert(alias, "queue_name, minute")
    added = ", ".join(f"{column} = {table}.{column} + {new.format(column)}" for column in columns)
    sql = (
        f"INSERT INTO {table} (queue_name, minute, {', '.join(columns)}) VALUES {', '.join(rows)} "
        f"{upsert} {added}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def record_oldest_ages(alias: str, minute: datetime.datetime, ages: Sequence[tuple[str, float]]) -> None:
    """Keep each queue's largest oldest-due-age sample of ``minute`` (one statement)."""
    connection = connections[alias]
    table = _tables()[1]
    at = connection.ops.adapt_datetimefield_value(minute)
    rows = ", ".join(["(%s, %s, %s)"] * len(ages))
    params: list[Any] = []
    for queue, age in ages:
        params += [queue, at, age]
    upsert, new, _ = _upsert(alias, "queue_name, minute")
    sample = new.format("oldest_age_seconds")
    sql = (
        f"INSERT INTO {table} (queue_name, minute, oldest_age_seconds) VALUES {rows} "
        f"{upsert} oldest_age_seconds = "
        f"CASE WHEN {table}.oldest_age_seconds IS NULL OR {table}.oldest_age_seconds < {sample} "
        f"THEN {sample} ELSE {table}.oldest_age_seconds END"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def prune_console_rows(alias: str, older_than: datetime.timedelta | None = None) -> None:
    """Delete the console's per-minute counts and worker rows older than ``older_than``.

    By default :data:`CONSOLE_ROWS_KEPT_FOR_SECONDS`. Indexed range deletes; the worker's beat
    calls it (see :mod:`django_jobguard.monitoring.beats`), and
    :mod:`django_jobguard.maintenance.retention` lists it with the other pruning rules.
    """
    from ..models import QueueMinute, WorkerBeat  # app registry: see common

    if older_than is None:
        older_than = datetime.timedelta(seconds=CONSOLE_ROWS_KEPT_FOR_SECONDS)
    cutoff = timezone.now() - older_than
    QueueMinute.objects.using(alias).filter(minute__lt=cutoff).delete()
    WorkerBeat.objects.using(alias).filter(last_beat_at__lt=cutoff).delete()
