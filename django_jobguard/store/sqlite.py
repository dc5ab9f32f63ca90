"""The store on SQLite: the same operations as :mod:`.postgres`, in SQLite's dialect.

SQLite has one writer at a time, so a single ``UPDATE ... WHERE id IN (SELECT ...)`` is
already exclusive (the status re-check guards the statement all the same). Times are
``strftime('now')`` in the text format Django stores datetimes in (UTC).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction
from django.db.backends.sqlite3.base import SQLiteCursorWrapper

from ..flow import FlowPlan, Throttle
from . import common, flow_sql
from .common import (
    FINISHED,
    INSERT_COLUMNS,
    INSERT_CONSTANTS,
    INSERT_FIELDS,
    KEY_TABLE,
    LEASE_EXPIRED_ERROR,
    LEASE_EXPIRED_MESSAGE,
    PERCENTILES,
    REAP_BATCH,
    RETURNING,
    SQLITE_INSERT_CHUNK,
    TABLE,
    AttemptError,
    ClaimedJob,
    Clock,
    CounterChange,
    DurationRow,
    History,
    Inserted,
    interpolate,
    placeholders,
    row_values,
    sqlite_datetime,
)
from .common import insert_key as insert_key
from .common import key_owner as key_owner

# Written for a cursor with parameters, so the driver turns %% back into %.
NOW = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
_LEASE_EXPIRES = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || visibility_timeout || ' seconds')"
_HISTORY_STARTED = f"json_insert(attempt_history, '$[#]', json_object('worker_id', %s, 'started_at', {NOW}))"
_HISTORY_FAILED = (
    "CASE WHEN json_array_length(attempt_history) > 0 THEN json_set(attempt_history, "
    f"'$[#-1].finished_at', {NOW}, '$[#-1].error_class', %s, '$[#-1].error', %s, "
    "'$[#-1].traceback', %s) ELSE attempt_history END"
)
_HISTORY_DROPPED = (
    "CASE WHEN json_array_length(attempt_history) > 0 "
    "THEN json_remove(attempt_history, '$[#-1]') ELSE attempt_history END"
)
# The entry before the last's start: the text of NOW, the format the column holds.
_HISTORY_PREVIOUS_START = (
    "CASE WHEN json_array_length(attempt_history) > 1 "
    "THEN json_extract(attempt_history, '$[#-2].started_at') END"
)
_HISTORY = History(failed=_HISTORY_FAILED, dropped=_HISTORY_DROPPED, previous_start=_HISTORY_PREVIOUS_START)
#: The database clock: text in the format Django stores datetimes in (UTC).
CLOCK = Clock(
    now=NOW,
    later="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)",
    # A fixed-point modifier: repr() could give '1e-05', which SQLite does not parse.
    seconds=lambda seconds: f"{seconds:+.6f} seconds",
    # Whole seconds, then the milliseconds of %f (SS.SSS): integer arithmetic, no float rounding.
    epoch_micros=(
        "(CAST(strftime('%%s', 'now') AS INTEGER) * 1000000 "
        "+ CAST(substr(strftime('%%f', 'now'), 4) AS INTEGER) * 1000)"
    ),
)

#: The paused queues are read before each claim (store.claim), not by the claim statement.
CLAIM_READS_PAUSES = False
ACKS_COMMIT_ALONE = False  # one UPDATE per row: alone, each would commit (and sync)


def writes_while_busy(alias: str) -> bool:
    return False  # an open write transaction holds the whole database


class _LockingCursor(SQLiteCursorWrapper):
    """Holds its connection's cursor lock (``cursor_lock``) from its creation to its close."""

    lock: threading.RLock | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._let_go()

    def __del__(self) -> None:
        # Django drops some cursors unclosed (the BEGIN of an atomic block on SQLite); freed
        # at once by their thread, they let go of the lock here.
        try:
            self._let_go()
        except RuntimeError:  # freed by another thread (a reference cycle): the lock stays held
            pass

    def _let_go(self) -> None:
        lock, self.lock = self.lock, None
        if lock is not None:
            lock.release()


def cursor_lock(alias: str) -> threading.RLock:
    """Make this thread's connection hold the returned lock while any cursor of it is open.

    Another thread holding the lock may close the connection: nothing of this thread is
    using it then. A connection closed while another thread runs a statement on it crashes
    the process (sqlite3 reads the closed handle as the statement returns), and one closed
    under a cursor with rows left to fetch keeps that statement's lock until the cursor is
    freed. Every cursor the connection makes from now on takes the lock, whatever raw
    connection it opens; a cursor kept open keeps the lock (a cut then waits, and gives up).
    """
    connection = connections[alias]
    lock = threading.RLock()

    def create_cursor(name: str | None = None) -> Any:
        lock.acquire()
        try:
            cursor = connection.connection.cursor(factory=_LockingCursor)
        except BaseException:
            lock.release()
            raise
        cursor.lock = lock
        return cursor

    connection.create_cursor = create_cursor  # type: ignore[method-assign]
    return lock


def database_now(alias: str) -> datetime.datetime:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {NOW}", [])
        return sqlite_datetime(cursor.fetchone()[0])


# -- inserts -------------------------------------------------------------------------------


def _run_after_sql(
    connection: Any, run_after: datetime.datetime | datetime.timedelta | None
) -> tuple[str, list[Any]]:
    """The ``, <run_after>`` fragment of a job insert and its parameter (a delay: from the database clock)."""
    if run_after is None:
        return "", []
    if isinstance(run_after, datetime.datetime):
        return ", %s", [connection.ops.adapt_datetimefield_value(run_after)]
    return ", strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [f"{run_after.total_seconds():+.6f} seconds"]


def insert_jobs(
    alias: str,
    rows: Sequence[dict[str, Any]],
    run_after: datetime.datetime | datetime.timedelta | None = None,
) -> list[Inserted]:
    connection = connections[alias]
    columns = INSERT_COLUMNS + (", run_after" if run_after is not None else "")
    run_after_sql, extra_params = _run_after_sql(connection, run_after)
    placeholder = (
        f"({', '.join(['%s'] * len(INSERT_FIELDS))}, {INSERT_CONSTANTS}, '{{}}', '[]'{run_after_sql})"
    )
    results: list[Inserted] = []
    with connection.cursor() as cursor:
        for start in range(0, len(rows), SQLITE_INSERT_CHUNK):
            chunk = rows[start : start + SQLITE_INSERT_CHUNK]
            params: list[Any] = []
            for row in chunk:
                params += row_values(row)
                params += extra_params
            cursor.execute(
                f"INSERT INTO {TABLE} ({columns}) VALUES {', '.join([placeholder] * len(chunk))} "
                "RETURNING id, run_after, enqueued_at",
                params,
            )
            results += [
                (row[0], sqlite_datetime(row[1]), sqlite_datetime(row[2])) for row in cursor.fetchall()
            ]
    return results


def insert_keyed_job(
    alias: str,
    row: dict[str, Any],
    run_after: datetime.datetime | datetime.timedelta | None,
    *,
    scope: str,
    fingerprint: str,
    expires_at: datetime.datetime,
) -> Inserted | None:
    # Three statements, in the caller's transaction or one of ours (no savepoint: the key
    # insert cannot fail, it yields to an existing key).
    with transaction.atomic(using=alias, savepoint=False):
        key_id = insert_key(alias, scope, row["idempotency_key"], fingerprint, None, expires_at=expires_at)
        if key_id is None:
            return None
        (inserted,) = insert_jobs(alias, [row], run_after)
        with connections[alias].cursor() as cursor:
            cursor.execute(f"UPDATE {KEY_TABLE} SET job_id = %s WHERE id = %s", [inserted[0], key_id])
    return inserted


# -- claim ---------------------------------------------------------------------------------


def claim(
    alias: str, queues: Sequence[str] | None, batch_size: int, worker_id: str, exclude: Sequence[str]
) -> list[ClaimedJob]:
    queue_filter = ""
    params: list[Any] = []
    if queues:
        queue_filter = f"AND queue_name IN ({placeholders(queues)}) "
        params += list(queues)
    elif exclude:
        queue_filter = f"AND queue_name NOT IN ({placeholders(exclude)}) "
        params += list(exclude)
    sql = (
        f"UPDATE {TABLE} SET status = 'running', attempts = attempts + 1, "
        "lease_token = lower(hex(randomblob(16))), "
        f"lease_expires_at = {_LEASE_EXPIRES}, "
        f"started_at = {NOW}, worker_id = %s, attempt_history = {_HISTORY_STARTED} "
        f"WHERE id IN (SELECT id FROM {TABLE} WHERE status = 'queued' {queue_filter}"
        f"AND run_after <= {NOW} AND attempts < max_attempts "
        "ORDER BY priority DESC, run_after, id LIMIT %s) AND status = 'queued' "
        f"RETURNING {RETURNING}"
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [worker_id, worker_id, *params, batch_size])
        rows = cursor.fetchall()
    return [ClaimedJob.from_row(row) for row in rows]


_CLAIM_SET = (
    f"UPDATE {TABLE} SET status = 'running', attempts = attempts + 1, "
    "lease_token = lower(hex(randomblob(16))), "
    f"lease_expires_at = {_LEASE_EXPIRES}, "
    f"started_at = {NOW}, worker_id = %s, attempt_history = {_HISTORY_STARTED} "
)


# -- flow control ----------------------------------------------------------------------------


class _FlowSQL(flow_sql.ConflictUpserts, flow_sql.SequentialTurn):
    """The limited claim's statements on SQLite (see ``store/flow_sql.py``)."""

    def take_turn(self, alias: str, cursor: Any) -> None:
        # A write first, so the transaction holds SQLite's one write lock from here to its
        # end even when it began DEFERRED: the turns of the fleet's limited claims.
        cursor.execute(f"UPDATE {TABLE} SET status = status WHERE id = -1", [])

    def now_seconds(self, alias: str, cursor: Any) -> float:
        cursor.execute(f"SELECT {CLOCK.epoch_micros}", [])
        return int(cursor.fetchone()[0]) / 1_000_000

    def candidates(
        self,
        alias: str,
        cursor: Any,
        queues: Sequence[str] | None,
        exclude: Sequence[str],
        blocked_tasks: Sequence[str],
        blocked_keys: Sequence[str],
        count: int,
        blocked_retries: Sequence[str] = (),
        per_key: int | None = None,
        watched: Sequence[str] = (),
    ) -> list[tuple[int, str, str, Any, int]]:
        where, params = flow_sql.candidate_filters(
            f"status = 'queued' AND run_after <= {NOW} AND attempts < max_attempts",
            f"SELECT 1 FROM json_each({TABLE}.flow_keys) WHERE value IN ({{keys}})",
            queues,
            exclude,
            blocked_tasks,
            blocked_keys,
            blocked_retries,
        )
        cursor.execute(
            f"SELECT id, task_name, queue_name, flow_keys, attempts FROM {TABLE} WHERE {' AND '.join(where)} "
            "ORDER BY priority DESC, run_after, id LIMIT %s",
            [*params, count],
        )
        return list(cursor.fetchall())

    def lease(self, alias: str, cursor: Any, ids: Sequence[int], worker_id: str) -> list[ClaimedJob]:
        cursor.execute(
            f"{_CLAIM_SET} WHERE id IN ({placeholders(ids)}) AND status = 'queued' RETURNING {RETURNING}",
            [worker_id, worker_id, *ids],
        )
        return [ClaimedJob.from_row(row) for row in cursor.fetchall()]


FLOW_SQL = _FlowSQL()


def claim_limited(
    alias: str,
    queues: Sequence[str] | None,
    batch_size: int,
    worker_id: str,
    exclude: Sequence[str],
    plan: FlowPlan,
    throttle: Throttle | None = None,
) -> list[ClaimedJob]:
    return flow_sql.claim_limited(FLOW_SQL, alias, queues, batch_size, worker_id, exclude, plan, throttle)


# -- leases --------------------------------------------------------------------------------


def heartbeat(alias: str, ids: list[int], tokens: list[str]) -> list[tuple[int, bool]]:
    sql = (
        f"UPDATE {TABLE} SET lease_expires_at = {_LEASE_EXPIRES} "
        f"WHERE id IN ({placeholders(ids)}) AND lease_token IN ({placeholders(tokens)}) "
        "RETURNING id, cancel_requested"
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [*ids, *tokens])
        return cursor.fetchall()  # type: ignore[no-any-return]


_COMPLETE = (
    f"UPDATE {TABLE} SET status = 'succeeded', finished_at = {NOW}, lease_token = NULL, "
    "lease_expires_at = NULL, result = %s WHERE id = %s AND lease_token = %s"
)


def complete(alias: str, job_id: int, lease_token: str, result_json: str, *, commit: bool = False) -> bool:
    # commit: the transaction's own COMMIT does it; SQLite has no round trip to save.
    with connections[alias].cursor() as cursor:
        cursor.execute(_COMPLETE, [result_json, job_id, lease_token])
        return bool(cursor.rowcount == 1)


_COMPLETE_RETURNING = f"{_COMPLETE} RETURNING has_dependants"


def complete_many(alias: str, acks: Sequence[tuple[int, str, str]]) -> list[tuple[int, bool]]:
    # One statement per row; the caller's transaction makes them one commit, which is
    # what costs on SQLite (its write lock and the journal's sync).
    done = []
    with connections[alias].cursor() as cursor:
        for job_id, lease_token, result_json in acks:
            cursor.execute(_COMPLETE_RETURNING, [result_json, job_id, lease_token])
            row = cursor.fetchone()
            if row is not None:
                done.append((job_id, bool(row[0])))
    return done


def discard_queued(alias: str, job_id: int) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE} WHERE id = %s AND status = 'queued'", [job_id])


def acquire_lock(alias: str, key: str, token: str, ttl: float) -> int | None:
    return common.acquire_lock_on_conflict(CLOCK, alias, key, token, ttl)


def add_workflow_counts(alias: str, changes: Sequence[CounterChange]) -> list[tuple[int, int]]:
    return common.add_workflow_counts_on_conflict(alias, changes)


def requeue(
    alias: str,
    job_id: int,
    lease_token: str,
    *,
    delay: float,
    error: str | None,
    refund_attempt: bool,
    contention: bool,
    attempt_error: AttemptError | None,
) -> bool:
    return common.requeue(
        CLOCK,
        _HISTORY,
        alias,
        job_id,
        lease_token,
        delay=delay,
        error=error,
        refund_attempt=refund_attempt,
        contention=contention,
        attempt_error=attempt_error,
    )


def mark_dead(
    alias: str, job_id: int, lease_token: str, error: str, attempt_error: AttemptError | None
) -> bool:
    return common.mark_dead(CLOCK, _HISTORY, alias, job_id, lease_token, error, attempt_error)


_REAP_REQUEUE = (
    f"UPDATE {TABLE} SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, "
    f"run_after = {NOW}, reappearances = reappearances + 1, worker_id = '', "
    f"first_failed_at = COALESCE(first_failed_at, {NOW}), last_error = %s, "
    f"attempt_history = {_HISTORY_FAILED} "
    f"WHERE id IN (SELECT id FROM {TABLE} WHERE status = 'running' "
    f"AND lease_expires_at < {NOW} AND attempts < max_attempts "
    "ORDER BY lease_expires_at LIMIT %s) AND status = 'running' RETURNING id, queue_name"
)
_REAP_EXHAUSTED = (
    f"SELECT id, lease_token FROM {TABLE} WHERE status = 'running' "
    f"AND lease_expires_at < {NOW} AND attempts >= max_attempts "
    "ORDER BY lease_expires_at LIMIT %s"
)


def reap(alias: str, batch_size: int = REAP_BATCH) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    params = [LEASE_EXPIRED_MESSAGE, *LEASE_EXPIRED_ERROR, batch_size]
    return common.reap(alias, _REAP_REQUEUE, params, _REAP_EXHAUSTED, batch_size)


# -- idempotency keys ----------------------------------------------------------------------

_KEY_SUCCEEDED = (
    f"UPDATE {KEY_TABLE} SET status = 'succeeded', result = %s, updated_at = {NOW} "
    "WHERE scope = %s AND key = %s AND job_id = %s"
)


def record_key_success(alias: str, scope: str, key: str, job_id: int, result_json: str | None) -> bool:
    with connections[alias].cursor() as cursor:
        cursor.execute(_KEY_SUCCEEDED, [result_json, scope, key, job_id])
        return bool(cursor.rowcount > 0)


# -- reporting (jobguard_tune) -----------------------------------------------------------------
# SQLite has no percentile function: one statement ranks each task's durations with window
# functions and returns only the two rows per percentile that percentile_cont (linear
# interpolation between the two nearest ranks, as on PostgreSQL) interpolates between.

# julianday() keeps about 0.1 ms of precision at today's dates: rounded to the millisecond
# (the resolution of the worker's SQLite timestamps), so 25 s reads as 25.0, not 25.00004.
_SQLITE_DURATION = "round((julianday(finished_at) - julianday(started_at)) * 86400.0, 3)"


def durations_sql(since: float, queue: str | None) -> tuple[str, list[Any]]:
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
        f"FROM (SELECT queue_name, task_name, {_SQLITE_DURATION} AS d FROM {TABLE} "
        f"WHERE {FINISHED} AND finished_at >= strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s) "
        f"{queue_filter}) AS runs) AS ranked "
        f"WHERE position IN ({ranks}) ORDER BY queue_name, task_name, position"
    )
    return sql, params


_OLDEST_DUE = (
    "SELECT queue_name, (julianday('now') - julianday(min(run_after))) * 86400.0 "
    f"FROM {TABLE} WHERE status = 'queued' AND run_after <= {NOW} GROUP BY queue_name"
)


def oldest_due_ages(alias: str) -> dict[str, float]:
    # A grouped min over the due rows: SQLite installs are small, and it has no LATERAL.
    with connections[alias].cursor() as cursor:
        cursor.execute(_OLDEST_DUE, [])
        # julianday('now') is read apart from the WHERE's now: a row due this instant could
        # come out a few microseconds below 0.
        return {queue: max(0.0, float(age)) for queue, age in cursor.fetchall()}


def observed_durations(alias: str, since: float, queue: str | None) -> list[DurationRow]:
    """Run durations per (queue, task) in the window, percentiles interpolated here."""
    sql, params = durations_sql(since, queue)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    groups: dict[tuple[str, str], tuple[int, float, dict[int, float]]] = {}
    for queue_name, task_name, count, top, position, value in rows:
        groups.setdefault((queue_name, task_name), (count, top, {}))[2][position] = value
    return [
        (queue_name, task_name, count, [interpolate(f, count, kept) for f in PERCENTILES], top)
        for (queue_name, task_name), (count, top, kept) in groups.items()
    ]
