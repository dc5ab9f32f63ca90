"""Claim, heartbeat, complete, requeue, dead-mark and reap: the one home of vendor SQL.

Every write a worker makes to a job it holds matches ``id AND lease_token``. A claim
writes a fresh random token, and every path that takes a job away from a worker (the
reaper, a shutdown hand-back, an operator) clears it. So a worker whose lease expired
and whose job moved on updates zero rows, raises :class:`LeaseLost`, and rolls back:
it cannot commit a stale ack, retry or dead-letter.

Lease times come from the database clock only (``statement_timestamp()`` /
``strftime('now')``), never from the worker's, so a worker with a skewed clock can
neither expire a live lease early nor start a job before its ``run_after``.

The SQL is raw on purpose: this is the hot path (one statement per claim batch, one per
ack) and the ORM cannot express ``FOR UPDATE SKIP LOCKED`` inside an ``UPDATE``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import select
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.utils.dateparse import parse_datetime

logger = logging.getLogger(__name__)

__all__ = [
    "ClaimedJob",
    "Listener",
    "claim",
    "complete",
    "database_now",
    "heartbeat",
    "mark_dead",
    "reap",
    "requeue",
]

#: Expired leases handled per reaper statement, so one pass never holds many row locks.
REAP_BATCH = 200
#: PostgreSQL channel the enqueue trigger notifies (payload: the queue name).
NOTIFY_CHANNEL = "jobguard_jobs"

_TABLE = "jobguard_job"
_RETURNING = (
    "id, task_name, queue_name, args, kwargs, priority, attempts, max_attempts, lease_token, "
    "visibility_timeout, idempotency_key, lock_key, handler_version"
)

_RETURNING_J = ", ".join(f"j.{column}" for column in _RETURNING.split(", "))

# PostgreSQL: statement_timestamp() is the database clock at the start of this statement.
_PG_NOW = "statement_timestamp()"
# SQLite: the same clock and the same text format Django stores datetimes in (UTC).
_SQLITE_NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"


@dataclasses.dataclass(slots=True)
class ClaimedJob:
    """A job a worker holds a lease on: just what running it needs, no model instance."""

    id: int
    task_name: str
    queue_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    priority: int
    attempts: int
    max_attempts: int
    lease_token: str
    visibility_timeout: float
    idempotency_key: str | None
    lock_key: str
    handler_version: str

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ClaimedJob:
        args, kwargs = row[3], row[4]
        return cls(
            id=row[0],
            task_name=row[1],
            queue_name=row[2],
            args=json.loads(args) if isinstance(args, str | bytes) else args,
            kwargs=json.loads(kwargs) if isinstance(kwargs, str | bytes) else kwargs,
            priority=row[5],
            attempts=row[6],
            max_attempts=row[7],
            lease_token=row[8],
            visibility_timeout=float(row[9]),
            idempotency_key=row[10],
            lock_key=row[11] or "",
            handler_version=row[12] or "",
        )


#: How a failed attempt is recorded in the job's history: (error class path, message, traceback).
AttemptError = tuple[str, str, str]
#: The history entry of an attempt whose worker stopped heartbeating (no traceback to keep).
LEASE_EXPIRED_ERROR: AttemptError = (
    "django_jobguard.exceptions.LeaseLost",
    "the lease expired: the worker stopped heartbeating (crashed, frozen or cut off)",
    "",
)


def _history_started(vendor: str) -> str:
    """SQL for the attempt history with a new entry (parameter: the worker id), in the claim."""
    if vendor == "postgresql":
        return (
            "j.attempt_history || jsonb_build_array(jsonb_build_object("
            f"'worker_id', %s::text, 'started_at', {_PG_NOW}))"
        )
    return f"json_insert(attempt_history, '$[#]', json_object('worker_id', %s, 'started_at', {_SQLITE_NOW}))"


def _history_failed(vendor: str, column: str = "attempt_history") -> str:
    """SQL for the history with its last entry marked failed (parameters: an :data:`AttemptError`)."""
    if vendor == "postgresql":
        # COALESCE: a job claimed before the history existed has no entry to complete.
        return (
            f"jsonb_set({column}, '{{-1}}', COALESCE({column} -> -1, '{{}}'::jsonb) || jsonb_build_object("
            f"'finished_at', {_PG_NOW}, 'error_class', %s::text, 'error', %s::text, 'traceback', %s::text))"
        )
    return (
        f"CASE WHEN json_array_length({column}) > 0 THEN json_set({column}, "
        f"'$[#-1].finished_at', {_SQLITE_NOW}, '$[#-1].error_class', %s, '$[#-1].error', %s, "
        f"'$[#-1].traceback', %s) ELSE {column} END"
    )


def _history_dropped(vendor: str) -> str:
    """SQL for the history without its last entry: the attempt was refunded, it did not count."""
    if vendor == "postgresql":
        return "attempt_history - (-1)"
    return (
        "CASE WHEN json_array_length(attempt_history) > 0 "
        "THEN json_remove(attempt_history, '$[#-1]') ELSE attempt_history END"
    )


def _vendor(alias: str) -> str:
    vendor = connections[alias].vendor
    if vendor not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"django-jobguard supports PostgreSQL and SQLite, not {vendor}.")
    return vendor


def _in(values: Sequence[Any]) -> str:
    return ", ".join(["%s"] * len(values))


def writes_while_busy(alias: str) -> bool:
    """Whether another connection can write while a job's transaction is open.

    True on PostgreSQL (row locks). False on SQLite, where an open write transaction
    holds the whole database, so a running atomic job blocks every other write.
    """
    return _vendor(alias) == "postgresql"


#: Rows per INSERT statement on SQLite (10 parameters a row, well under its variable limit).
SQLITE_INSERT_CHUNK = 500

_INSERT_COLUMNS = (
    "task_name, queue_name, args, kwargs, priority, max_attempts, visibility_timeout, "
    "idempotency_key, lock_key, handler_version, status, attempts, worker_id, last_error, "
    "reappearances, lock_contentions, checkpoints, attempt_history"
)
_INSERT_FIELDS = (
    "task_name",
    "queue_name",
    "args",
    "kwargs",
    "priority",
    "max_attempts",
    "visibility_timeout",
    "idempotency_key",
    "lock_key",
    "handler_version",
)


def _run_after_sql(
    connection: Any, postgres: bool, run_after: datetime.datetime | datetime.timedelta | None
) -> tuple[str, list[Any]]:
    """The ``, <run_after>`` fragment of a job insert and its parameter (a delay: from the database clock)."""
    if run_after is None:
        return "", []
    if isinstance(run_after, datetime.datetime):
        return ", %s::timestamptz" if postgres else ", %s", [
            connection.ops.adapt_datetimefield_value(run_after)
        ]
    seconds = run_after.total_seconds()
    if postgres:
        return ", statement_timestamp() + %s * interval '1 second'", [seconds]
    return ", strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [f"{seconds:+.6f} seconds"]


def insert_jobs(
    alias: str,
    rows: Sequence[dict[str, Any]],
    run_after: datetime.datetime | datetime.timedelta | None = None,
) -> list[tuple[int, datetime.datetime, datetime.datetime]]:
    """Insert queued jobs in one statement (chunks on SQLite); ``(id, run_after, enqueued_at)`` each.

    ``rows`` hold the fields of :data:`_INSERT_FIELDS` with ``args``/``kwargs`` as Python
    values. ``run_after`` applies to every row: None is "now", a timedelta counts from the
    database clock. The ORM's ``bulk_create`` spends most of its time compiling per-field
    SQL; this path is the enqueue hot path.
    """
    if not rows:
        return []
    connection = connections[alias]
    postgres = _vendor(alias) == "postgresql"
    columns = _INSERT_COLUMNS + (", run_after" if run_after is not None else "")
    run_after_sql, extra_params = _run_after_sql(connection, postgres, run_after)
    constants = "'queued', 0, '', '', 0, 0"
    results: list[tuple[int, datetime.datetime, datetime.datetime]] = []
    with connection.cursor() as cursor:
        if postgres and len(rows) == 1:
            # One row: plain VALUES. Dumping ten one-element arrays costs the client more
            # than the whole rest of the enqueue (measured: 1,340 -> about 2,000 enqueues/s).
            values = [rows[0][field] for field in _INSERT_FIELDS]
            values[2] = json.dumps(values[2])
            values[3] = json.dumps(values[3])
            cursor.execute(
                f"INSERT INTO {_TABLE} ({columns}) VALUES (%s, %s, %s::jsonb, %s::jsonb, %s, %s, %s, %s, %s, "
                f"%s, {constants}, '{{}}'::jsonb, '[]'::jsonb{run_after_sql}) "
                "RETURNING id, run_after, enqueued_at",
                [*values, *extra_params],
            )
            results = list(cursor.fetchall())
        elif postgres:
            # One statement whatever the count: ten array parameters, unnested server-side.
            arrays = [[row[field] for row in rows] for field in _INSERT_FIELDS]
            arrays[2] = [json.dumps(value) for value in arrays[2]]
            arrays[3] = [json.dumps(value) for value in arrays[3]]
            cursor.execute(
                f"INSERT INTO {_TABLE} ({columns}) "
                f"SELECT t, q, a::jsonb, k::jsonb, p, m, v, i, l, h, {constants}, "
                f"'{{}}'::jsonb, '[]'::jsonb{run_after_sql} "
                "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::smallint[], %s::int[], "
                "%s::float8[], %s::text[], %s::text[], %s::text[]) AS u(t, q, a, k, p, m, v, i, l, h) "
                "RETURNING id, run_after, enqueued_at",
                [*extra_params, *arrays],  # the run_after parameter comes first in the text
            )
            results = list(cursor.fetchall())
        else:
            placeholder = (
                f"(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, {constants}, '{{}}', '[]'{run_after_sql})"
            )
            for start in range(0, len(rows), SQLITE_INSERT_CHUNK):
                chunk = rows[start : start + SQLITE_INSERT_CHUNK]
                params: list[Any] = []
                for row in chunk:
                    values = [row[field] for field in _INSERT_FIELDS]
                    values[2] = json.dumps(values[2])
                    values[3] = json.dumps(values[3])
                    params += values
                    params += extra_params
                cursor.execute(
                    f"INSERT INTO {_TABLE} ({columns}) VALUES {', '.join([placeholder] * len(chunk))} "
                    "RETURNING id, run_after, enqueued_at",
                    params,
                )
                results += [
                    (row[0], _sqlite_datetime(row[1]), _sqlite_datetime(row[2])) for row in cursor.fetchall()
                ]
    if len(results) != len(rows):  # pragma: no cover - the database returned a row per insert
        raise RuntimeError(f"inserted {len(rows)} jobs but got {len(results)} rows back")
    return results


def insert_keyed_job(
    alias: str,
    row: dict[str, Any],
    run_after: datetime.datetime | datetime.timedelta | None,
    *,
    scope: str,
    fingerprint: str,
    expires_at: datetime.datetime,
) -> tuple[int, datetime.datetime, datetime.datetime] | None:
    """Insert a job and its new idempotency key together; None, writing nothing, if the key exists.

    On PostgreSQL one statement does both: the key row takes the job's id from the job
    table's sequence before the job row exists (the foreign key is checked at commit), and
    the job is inserted only if the key was. That is one round trip instead of three, and
    atomic on its own, so it needs no transaction around it. On SQLite the same happens in
    three statements; the caller holds the transaction.
    """
    from .idempotency import insert_key

    connection = connections[alias]
    if _vendor(alias) == "sqlite":
        key_id = insert_key(alias, scope, row["idempotency_key"], fingerprint, expires_at=expires_at)
        if key_id is None:
            return None
        (inserted,) = insert_jobs(alias, [row], run_after)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE jobguard_idempotencykey SET job_id = %s WHERE id = %s", [inserted[0], key_id]
            )
        return inserted
    run_after_sql, extra_params = _run_after_sql(connection, True, run_after)
    values = [row[field] for field in _INSERT_FIELDS]
    values[2] = json.dumps(values[2])
    values[3] = json.dumps(values[3])
    sql = (
        "WITH k AS (INSERT INTO jobguard_idempotencykey "
        "(key, scope, fingerprint, status, duplicates, expires_at, job_id) "
        "VALUES (%s, %s, %s, 'in_progress', 0, %s, nextval(pg_get_serial_sequence('jobguard_job', 'id'))) "
        "ON CONFLICT (scope, key) DO NOTHING RETURNING job_id) "
        f"INSERT INTO {_TABLE} (id, {_INSERT_COLUMNS}{', run_after' if run_after_sql else ''}) "
        "SELECT k.job_id, %s::varchar, %s::varchar, %s::jsonb, %s::jsonb, %s::smallint, %s::int, "
        "%s::float8, %s::varchar, %s::varchar, %s::varchar, 'queued', 0, '', '', 0, 0, '{}'::jsonb, "
        f"'[]'::jsonb{run_after_sql} FROM k RETURNING id, run_after, enqueued_at"
    )
    expiry = connection.ops.adapt_datetimefield_value(expires_at)
    params = [row["idempotency_key"], scope, fingerprint, expiry]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *values, *extra_params])
        result = cursor.fetchone()
    return None if result is None else (result[0], result[1], result[2])


def database_now(alias: str) -> datetime.datetime:
    """The database clock, now (aware): what due times are compared against, never the host's."""
    with connections[alias].cursor() as cursor:
        if _vendor(alias) == "postgresql":
            cursor.execute(f"SELECT {_PG_NOW}", [])
            value = cursor.fetchone()[0]
            return value if isinstance(value, datetime.datetime) else _sqlite_datetime(value)
        # Parameters given (none), so the driver turns %% back into %.
        cursor.execute(f"SELECT {_SQLITE_NOW}", [])
        return _sqlite_datetime(cursor.fetchone()[0])


def _sqlite_datetime(value: Any) -> datetime.datetime:
    """A timestamp SQLite returned (its converters may already have parsed it), aware under USE_TZ."""
    parsed = value if isinstance(value, datetime.datetime) else parse_datetime(value)
    if parsed is None:  # pragma: no cover - SQLite returned what we wrote
        raise ValueError(f"not a datetime: {value!r}")
    # SQLite stores UTC (its 'now' and Django's writes under USE_TZ) without an offset.
    return parsed.replace(tzinfo=datetime.UTC) if parsed.tzinfo is None and settings.USE_TZ else parsed


_tuned_connections: weakref.WeakSet[Any] = weakref.WeakSet()


def _tune_for_claims(alias: str) -> None:
    """Keep PostgreSQL on the ordered index walk for claims, whatever its statistics say.

    Statistics lag behind bursts: a table analysed while it held few queued rows makes
    the planner expect a handful of due jobs, so it picks a bitmap scan plus a sort of
    *every* due row (15 ms per claim with 20,000 queued, measured) over the index walk
    that stops after ``limit`` rows (0.05 ms). Bitmap scans are never the right plan for
    the claim and reaper queries, so they are turned off for the connection that runs
    them: the worker's main thread, whose connection runs nothing else.
    """
    connection = connections[alias]
    connection.ensure_connection()
    raw = connection.connection
    if raw in _tuned_connections:
        return
    with connection.cursor() as cursor:
        cursor.execute("SET enable_bitmapscan = off")
    _tuned_connections.add(raw)


def _pooled(alias: str) -> bool:
    """Whether ``alias`` goes through a transaction-mode pooler (``JOBGUARD["POOLED_DATABASES"]``)."""
    from .conf import get_settings

    return alias in get_settings().pooled_databases


def claim(
    alias: str,
    queues: Sequence[str] | None,
    limit: int,
    worker_id: str,
    exclude: Sequence[str] = (),
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs of ``queues`` (all queues if None) in one statement.

    ``exclude`` names queues to leave alone when ``queues`` is None (every other queue: the
    worker's ``--exclude-queues`` and the paused ones); with a list of queues, leave them out
    of the list instead.
    """
    if limit <= 0:
        return []
    if queues:
        queues = [name for name in queues if name not in exclude]
        if not queues:
            return []
        exclude = ()
    if _vendor(alias) == "postgresql" and _pooled(alias):
        # Behind a transaction-mode pooler a session SET would land on whichever server
        # connection served it, and stay there for other clients: scope it to a transaction.
        with transaction.atomic(using=alias):
            with connections[alias].cursor() as cursor:
                cursor.execute("SET LOCAL enable_bitmapscan = off")
            return _claim(alias, queues, limit, worker_id, exclude, tune=False)
    return _claim(alias, queues, limit, worker_id, exclude, tune=True)


def _claim(
    alias: str,
    queues: Sequence[str] | None,
    limit: int,
    worker_id: str,
    exclude: Sequence[str],
    *,
    tune: bool,
) -> list[ClaimedJob]:
    vendor = _vendor(alias)
    params: list[Any] = []
    if vendor == "postgresql":
        if tune:
            _tune_for_claims(alias)
        # SKIP LOCKED lets concurrent workers pass over rows another claim is taking,
        # instead of queueing behind it. Each shape below walks a partial index on queued
        # rows in claim order and stops after `limit` rows, so its cost depends on neither
        # the backlog nor the finished history. (`queue_name = ANY(...)` would sort every
        # due row instead, hence one LATERAL index walk per queue for several queues.)
        due = f"status = 'queued' AND run_after <= {_PG_NOW} AND attempts < max_attempts"
        order = "ORDER BY priority DESC, run_after, id"
        if not queues and exclude:
            # A filter on the same index walk: the excluded queues' rows are skipped over.
            picked = (
                f"SELECT id FROM {_TABLE} WHERE {due} AND queue_name <> ALL(%s) {order} "
                "LIMIT %s FOR UPDATE SKIP LOCKED"
            )
            params = [list(exclude), limit]
        elif not queues:
            picked = f"SELECT id FROM {_TABLE} WHERE {due} {order} LIMIT %s FOR UPDATE SKIP LOCKED"
            params = [limit]
        elif len(queues) == 1:
            picked = (
                f"SELECT id FROM {_TABLE} WHERE queue_name = %s AND {due} {order} "
                "LIMIT %s FOR UPDATE SKIP LOCKED"
            )
            params = [queues[0], limit]
        else:
            picked = (
                "SELECT c.id FROM unnest(%s::text[]) AS q(name), LATERAL ("
                f"SELECT id, priority, run_after FROM {_TABLE} WHERE queue_name = q.name AND {due} {order} "
                "LIMIT %s FOR UPDATE SKIP LOCKED) AS c ORDER BY c.priority DESC, c.run_after, c.id LIMIT %s"
            )
            params = [list(queues), limit, limit]
        params += [worker_id, worker_id]
        sql = (
            f"WITH picked AS ({picked}) "
            f"UPDATE {_TABLE} AS j SET status = 'running', attempts = j.attempts + 1, "
            "lease_token = replace(gen_random_uuid()::text, '-', ''), "
            f"lease_expires_at = {_PG_NOW} + j.visibility_timeout * interval '1 second', "
            f"started_at = {_PG_NOW}, worker_id = %s, attempt_history = {_history_started('postgresql')} "
            f"FROM picked WHERE j.id = picked.id RETURNING {_RETURNING_J}"
        )
    else:
        # SQLite has one writer at a time, so a single UPDATE ... WHERE id IN (SELECT ...)
        # is already exclusive; the status re-check guards the statement all the same.
        queue_filter = ""
        if queues:
            queue_filter = f"AND queue_name IN ({_in(queues)}) "
            params += list(queues)
        elif exclude:
            queue_filter = f"AND queue_name NOT IN ({_in(exclude)}) "
            params += list(exclude)
        params = [worker_id, worker_id, *params, limit]
        sql = (
            f"UPDATE {_TABLE} SET status = 'running', attempts = attempts + 1, "
            "lease_token = lower(hex(randomblob(16))), "
            "lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', "
            "'+' || visibility_timeout || ' seconds'), "
            f"started_at = {_SQLITE_NOW}, worker_id = %s, attempt_history = {_history_started('sqlite')} "
            f"WHERE id IN (SELECT id FROM {_TABLE} WHERE status = 'queued' {queue_filter}"
            f"AND run_after <= {_SQLITE_NOW} AND attempts < max_attempts "
            "ORDER BY priority DESC, run_after, id LIMIT %s) AND status = 'queued' "
            f"RETURNING {_RETURNING}"
        )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    jobs = [ClaimedJob.from_row(row) for row in rows]
    jobs.sort(key=lambda job: (-job.priority, job.id))
    return jobs


def heartbeat(
    alias: str, leases: Iterable[tuple[int, str]], *, cancel_requested: set[int] | None = None
) -> set[int]:
    """Extend the leases still held; the ids renewed (the others were lost).

    ``cancel_requested``, when given, receives the renewed ids an operator asked to cancel.
    """
    leases = list(leases)
    if not leases:
        return set()
    ids = [job_id for job_id, _ in leases]
    tokens = [token for _, token in leases]
    if _vendor(alias) == "postgresql":
        # Tokens are random per claim, so matching id and token sets is exact enough.
        sql = (
            f"UPDATE {_TABLE} SET lease_expires_at = {_PG_NOW} + visibility_timeout * interval '1 second' "
            "WHERE id = ANY(%s) AND lease_token = ANY(%s) RETURNING id, cancel_requested"
        )
        params: list[Any] = [ids, tokens]
    else:
        sql = (
            f"UPDATE {_TABLE} SET lease_expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', "
            "'+' || visibility_timeout || ' seconds') "
            f"WHERE id IN ({_in(ids)}) AND lease_token IN ({_in(tokens)}) RETURNING id, cancel_requested"
        )
        params = [*ids, *tokens]
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if cancel_requested is not None:
        cancel_requested.update(row[0] for row in rows if row[1])
    return {row[0] for row in rows}


def complete(alias: str, job_id: int, lease_token: str, result_json: str) -> bool:
    """Mark the job succeeded with its JSON result, if the lease is still ours."""
    cast = "::jsonb" if _vendor(alias) == "postgresql" else ""
    now = _PG_NOW if cast else _SQLITE_NOW
    sql = (
        f"UPDATE {_TABLE} SET status = 'succeeded', finished_at = {now}, lease_token = NULL, "
        f"lease_expires_at = NULL, result = %s{cast} WHERE id = %s AND lease_token = %s"
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [result_json, job_id, lease_token])
        return bool(cursor.rowcount == 1)


def discard_queued(alias: str, job_id: int) -> None:
    """Delete a job that is still queued and no longer has anything to do.

    For work the caller has already done itself (a durable cache invalidation whose keys
    were deleted right after the commit). Losing this delete in a crash only lets a worker
    run the job once more, harmlessly, so on PostgreSQL its commit does not wait for the
    WAL to reach the disk (``synchronous_commit`` off for this statement's transaction
    only): the writer pays one round trip, not a second disk flush.
    """
    with connections[alias].cursor() as cursor:
        if _vendor(alias) == "postgresql":
            # One query string of two statements (no parameters, so psycopg sends it as a
            # simple query: one round trip, one implicit transaction that SET LOCAL applies to).
            cursor.execute(
                "SET LOCAL synchronous_commit TO OFF; "
                f"DELETE FROM {_TABLE} WHERE id = {int(job_id)} AND status = 'queued'"
            )
        else:
            cursor.execute(f"DELETE FROM {_TABLE} WHERE id = %s AND status = 'queued'", [job_id])


def requeue(
    alias: str,
    job_id: int,
    lease_token: str,
    *,
    delay: float,
    error: str | None,
    refund_attempt: bool = False,
    contention: bool = False,
    attempt_error: AttemptError | None = None,
) -> bool:
    """Give the job back to the queue, due after ``delay`` seconds, if the lease is ours.

    A failed attempt keeps its count and, with ``attempt_error``, its entry in the
    attempt history says how it failed; a lock contention or a shutdown hand-back before
    the handler started refunds it (``refund_attempt``), and drops its history entry, so
    the history holds one entry per counted attempt.
    """
    failed = error is not None
    vendor = _vendor(alias)
    if vendor == "postgresql":
        run_after = f"{_PG_NOW} + %s * interval '1 second'"
        delay_param: Any = delay
        now = _PG_NOW
    else:
        run_after = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
        delay_param = f"+{delay:.6f} seconds"
        now = _SQLITE_NOW
    sets = [
        "status = 'queued'",
        "lease_token = NULL",
        "lease_expires_at = NULL",
        "worker_id = ''",
        f"run_after = {run_after}",
        f"attempts = attempts - {1 if refund_attempt else 0}",
        f"lock_contentions = lock_contentions + {1 if contention else 0}",
    ]
    params: list[Any] = [delay_param]
    if failed:
        sets += ["last_error = %s", f"first_failed_at = COALESCE(first_failed_at, {now})"]
        params.append(error)
    if refund_attempt:
        sets.append(f"attempt_history = {_history_dropped(vendor)}")
    elif attempt_error is not None:
        sets.append(f"attempt_history = {_history_failed(vendor)}")
        params += list(attempt_error)
    sql = f"UPDATE {_TABLE} SET {', '.join(sets)} WHERE id = %s AND lease_token = %s"
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [*params, job_id, lease_token])
        return bool(cursor.rowcount == 1)


def mark_dead(
    alias: str, job_id: int, lease_token: str, error: str, attempt_error: AttemptError | None = None
) -> bool:
    """Mark the job dead, if the lease is ours. Call inside the dead letter's transaction.

    ``attempt_error`` completes the last attempt's history entry (in the same statement).
    """
    vendor = _vendor(alias)
    now = _PG_NOW if vendor == "postgresql" else _SQLITE_NOW
    history = ""
    params: list[Any] = [error]
    if attempt_error is not None:
        history = f", attempt_history = {_history_failed(vendor)}"
        params += list(attempt_error)
    sql = (
        f"UPDATE {_TABLE} SET status = 'dead', finished_at = {now}, lease_token = NULL, "
        f"lease_expires_at = NULL, last_error = %s, first_failed_at = COALESCE(first_failed_at, {now})"
        f"{history} WHERE id = %s AND lease_token = %s"
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [*params, job_id, lease_token])
        return bool(cursor.rowcount == 1)


def reap(alias: str, limit: int = REAP_BATCH) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Put expired leases back in their queue; report the out-of-attempts ones.

    Returns ``(requeued, exhausted)``: ``(id, queue_name)`` of jobs made visible again
    (each counted as a visibility-timeout reappearance on the row), and ``(id,
    lease_token)`` of expired jobs with no attempt left, which the caller dead-letters
    (fenced by that token, so a late ack and the reaper cannot both win).
    """
    vendor = _vendor(alias)
    message = "lease expired: the worker stopped heartbeating (crashed, frozen or cut off)"
    if vendor == "postgresql":
        requeue_sql = (
            f"WITH expired AS (SELECT id FROM {_TABLE} WHERE status = 'running' "
            f"AND lease_expires_at < {_PG_NOW} AND attempts < max_attempts "
            "ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED) "
            f"UPDATE {_TABLE} AS j SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, "
            f"run_after = {_PG_NOW}, reappearances = j.reappearances + 1, worker_id = '', "
            f"first_failed_at = COALESCE(j.first_failed_at, {_PG_NOW}), last_error = %s, "
            f"attempt_history = {_history_failed(vendor, 'j.attempt_history')} "
            "FROM expired WHERE j.id = expired.id RETURNING j.id, j.queue_name"
        )
        requeue_params: list[Any] = [limit, message, *LEASE_EXPIRED_ERROR]
        exhausted_sql = (
            f"SELECT id, lease_token FROM {_TABLE} WHERE status = 'running' "
            f"AND lease_expires_at < {_PG_NOW} AND attempts >= max_attempts "
            "ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED"
        )
    else:
        requeue_sql = (
            f"UPDATE {_TABLE} SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, "
            f"run_after = {_SQLITE_NOW}, reappearances = reappearances + 1, worker_id = '', "
            f"first_failed_at = COALESCE(first_failed_at, {_SQLITE_NOW}), last_error = %s, "
            f"attempt_history = {_history_failed(vendor)} "
            f"WHERE id IN (SELECT id FROM {_TABLE} WHERE status = 'running' "
            f"AND lease_expires_at < {_SQLITE_NOW} AND attempts < max_attempts "
            "ORDER BY lease_expires_at LIMIT %s) AND status = 'running' RETURNING id, queue_name"
        )
        requeue_params = [message, *LEASE_EXPIRED_ERROR, limit]
        exhausted_sql = (
            f"SELECT id, lease_token FROM {_TABLE} WHERE status = 'running' "
            f"AND lease_expires_at < {_SQLITE_NOW} AND attempts >= max_attempts "
            "ORDER BY lease_expires_at LIMIT %s"
        )
    with connections[alias].cursor() as cursor:
        cursor.execute(requeue_sql, requeue_params)
        requeued = [(row[0], row[1]) for row in cursor.fetchall()]
        cursor.execute(exhausted_sql, [limit])
        exhausted = [(row[0], row[1]) for row in cursor.fetchall()]
    return requeued, exhausted


def read_checkpoints(alias: str, job_id: int) -> dict[str, Any]:
    from .models import Job

    value = Job.objects.using(alias).filter(pk=job_id).values_list("checkpoints", flat=True).first()
    return dict(value or {})


def write_checkpoints(alias: str, job_id: int, lease_token: str | None, checkpoints: dict[str, Any]) -> bool:
    from .models import Job

    return bool(
        Job.objects.using(alias).filter(pk=job_id, lease_token=lease_token).update(checkpoints=checkpoints)
    )


class Listener:
    """Wakes an idle worker when jobs are enqueued: LISTEN/NOTIFY on PostgreSQL.

    :meth:`wait` sleeps until a notification for one of our queues arrives, :meth:`wake`
    is called (a signal handler may call it: it only writes to a pipe), or the timeout
    passes. Elsewhere, or while listening fails, it is a plain interruptible sleep and
    the worker falls back to polling every ``POLL_INTERVAL`` seconds.
    """

    #: Seconds before a failed LISTEN connection is tried again.
    RECONNECT_DELAY_SECONDS = 5.0

    def __init__(self, alias: str | None, queues: Sequence[str] | None) -> None:
        # None: no alias can LISTEN (the jobs' alias is pooled and no LISTEN_DATABASE is set).
        self.alias = alias
        self.queues = set(queues) if queues else None
        self._conn: Any = None
        self._failed_at = -self.RECONNECT_DELAY_SECONDS
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def _connect(self) -> Any:
        if self._conn is not None or self.alias is None or _vendor(self.alias) != "postgresql":
            return self._conn
        if time.monotonic() - self._failed_at < self.RECONNECT_DELAY_SECONDS:
            return None
        try:
            import psycopg

            params = connections[self.alias].get_connection_params()
            for key in ("cursor_factory", "context", "prepare_threshold"):
                params.pop(key, None)
            conn = psycopg.connect(**params, autocommit=True)
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self._conn = conn
        except Exception:
            logger.warning("listen_failed alias=%s; polling instead", self.alias, exc_info=True)
            self._failed_at = time.monotonic()
            self._conn = None
        return self._conn

    def start(self) -> bool:
        """LISTEN now (instead of at the first wait); True if notifications will arrive."""
        listening = self._connect() is not None
        if self.alias is None:
            logger.info("listen_disabled reason=pooled_database; polling (set JOBGUARD['LISTEN_DATABASE'])")
        elif listening:
            logger.info("listening alias=%s channel=%s", self.alias, NOTIFY_CHANNEL)
        return listening

    def wake(self) -> None:
        """Make a current or the next :meth:`wait` return at once."""
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full or closed: a wake-up is pending or moot

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if a notification for our queues arrived."""
        conn = self._connect()
        watched = [self._wake_r] if conn is None else [self._wake_r, conn.fileno()]
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                ready, _, _ = select.select(watched, [], [], remaining)
                if self._wake_r in ready:
                    self._drain_pipe()
                    return False
                if not ready:
                    return False
                # Many enqueues wake us once: the claim that follows takes a whole batch.
                payloads = {note.payload for note in conn.notifies(timeout=0)}
                if (self.queues is None and payloads) or payloads & (self.queues or set()):
                    return True
        except Exception:
            logger.warning("listen_lost alias=%s; reconnecting", self.alias, exc_info=True)
            self._close_conn()
            return False

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _close_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: S110 - closing a broken connection may fail; nothing to do
                pass
            self._conn = None
            self._failed_at = time.monotonic()

    def close(self) -> None:
        self._close_conn()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
