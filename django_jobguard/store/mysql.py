"""The store on MariaDB 10.6+ and MySQL 8.0+ (Django's ``mysql`` back end, mysqlclient).

Times come from ``UTC_TIMESTAMP(6)``, the database clock in UTC whatever the session's time
zone, fixed for the length of each statement. A claim is a short transaction of its own:
``SELECT ... FOR UPDATE SKIP LOCKED`` picks the rows (InnoDB cannot update with ``LIMIT``
through a locking subquery), one ``UPDATE`` leases them and one ``SELECT`` reads them back
(MySQL has no ``UPDATE ... RETURNING``). Lease tokens are ``UUID()`` without dashes: unique
per row, which is what fencing needs, and evaluated on the server, so statement-based
replication cannot copy them (a system check refuses ``binlog_format=STATEMENT``).

InnoDB's gap and next-key locks are kept out of the way: the connection must run at READ
COMMITTED (a system check says so), where a locking read locks only the rows it returns
and no gaps. A deadlock (1213) or a lock-wait timeout (1205) that a statement of ours meets
outside a caller's transaction is retried here a few times (:data:`DEADLOCK_RETRIES`) and
reported as a :class:`~django_jobguard.events.StatementRetried` event; inside a caller's
transaction the whole transaction is what must be retried, so the error goes to the caller.

The flow-control limited claim (``store/flow_sql.py``) is written here in MariaDB's SQL: the
fleet's limited claims take turns on a row lock (the rate table's :data:`~.flow_sql.TURN_KEY`
row) instead of PostgreSQL's advisory lock, full keys are left out with ``JSON_TABLE``, and
rate and breaker rows are written with ``ON DUPLICATE KEY UPDATE``; a deadlock runs the
whole claim again.

No ``LISTEN``/``NOTIFY``: workers poll (``POLL_INTERVAL``), or wake through Redis when one
is configured (:mod:`.listener`).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from django.db import OperationalError, connections, transaction

from .. import events
from ..flow import FlowPlan, Throttle
from . import common, flow_sql
from .common import (
    COUNTER_TABLE,
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
    TABLE,
    WORKFLOW_TABLE,
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

logger = logging.getLogger("django_jobguard.store")

#: Times a statement of ours that met a deadlock or a lock-wait timeout is run again.
DEADLOCK_RETRIES = 5
#: Seconds before the first retry; each further one waits twice as long (plus jitter).
DEADLOCK_BACKOFF_SECONDS = 0.01
#: InnoDB's error numbers for a deadlock victim and a lock-wait timeout.
ER_LOCK_DEADLOCK = 1213
ER_LOCK_WAIT_TIMEOUT = 1205
#: Rows per multi-row INSERT (13 parameters a row, far below max_allowed_packet for small payloads).
INSERT_CHUNK = 500

# Written for a cursor with parameters: mysqlclient turns %% back into %.
NOW = "UTC_TIMESTAMP(6)"
# Whole microseconds: INTERVAL ... SECOND would round a fractional count of seconds.
_LATER = f"{NOW} + INTERVAL %s MICROSECOND"
_LEASE_EXPIRES = f"{NOW} + INTERVAL ROUND(visibility_timeout * 1000000) MICROSECOND"
# An ISO 8601 text with the offset, as PostgreSQL's jsonb renders a timestamptz.
_ISO_NOW = f"DATE_FORMAT({NOW}, '%%Y-%%m-%%dT%%H:%%i:%%s.%%f+00:00')"
_LAST = "CONCAT('$[', JSON_LENGTH(attempt_history) - 1, ']')"
_HISTORY_STARTED = (
    f"JSON_ARRAY_APPEND(attempt_history, '$', JSON_OBJECT('worker_id', %s, 'started_at', {_ISO_NOW}))"
)
# MariaDB before 10.9 has no $[last]: the path of the last entry is built from its length.
_HISTORY_FAILED = (
    "CASE WHEN JSON_LENGTH(attempt_history) > 0 THEN JSON_SET(attempt_history, "
    f"CONCAT({_LAST}, '.finished_at'), {_ISO_NOW}, CONCAT({_LAST}, '.error_class'), %s, "
    f"CONCAT({_LAST}, '.error'), %s, CONCAT({_LAST}, '.traceback'), %s) ELSE attempt_history END"
)
_HISTORY_DROPPED = (
    f"CASE WHEN JSON_LENGTH(attempt_history) > 0 THEN JSON_REMOVE(attempt_history, {_LAST}) "
    "ELSE attempt_history END"
)
# The entry before the last's start, parsed back from the ISO text of _ISO_NOW (UTC, as the
# column holds it); NULL when there is none.
_HISTORY_PREVIOUS_START = (
    "CASE WHEN JSON_LENGTH(attempt_history) > 1 THEN STR_TO_DATE(LEFT(JSON_UNQUOTE(JSON_EXTRACT("
    "attempt_history, CONCAT('$[', JSON_LENGTH(attempt_history) - 2, '].started_at'))), 26), "
    "'%%Y-%%m-%%dT%%H:%%i:%%s.%%f') END"
)
_HISTORY = History(failed=_HISTORY_FAILED, dropped=_HISTORY_DROPPED, previous_start=_HISTORY_PREVIOUS_START)
#: The database clock: ``UTC_TIMESTAMP(6)``, the start of each statement, in UTC.
CLOCK = Clock(
    now=NOW,
    later=_LATER,
    seconds=lambda seconds: round(seconds * 1_000_000),
    # UNIX_TIMESTAMP of the session's own now converts back through the session's zone.
    epoch_micros="CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)",
)

#: The paused queues are read before each claim (store.claim), not by the claim statement.
CLAIM_READS_PAUSES = False
ACKS_COMMIT_ALONE = True  # complete_many opens its own transaction

_T = TypeVar("_T")


def error_number(exc: BaseException) -> int | None:
    """The server's error number of a database error raised through Django, if any."""
    for candidate in (exc, exc.__cause__):
        args = getattr(candidate, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


def retry_deadlocks(alias: str, operation: str, run: Callable[[], _T]) -> _T:
    """Run ``run``; on a deadlock or a lock-wait timeout, run it again (a bounded number of times).

    Only where ``run`` is the whole transaction: outside a caller's atomic block (InnoDB
    rolls a deadlock victim's transaction back, so a caller's earlier statements are gone
    and only the caller can start again).
    """
    connection = connections[alias]
    attempt = 0
    while True:
        try:
            return run()
        except OperationalError as exc:
            number = error_number(exc)
            if number not in (ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT) or connection.in_atomic_block:
                raise
            if attempt >= DEADLOCK_RETRIES:
                raise
            attempt += 1
            reason = "deadlock" if number == ER_LOCK_DEADLOCK else "lock_wait_timeout"
            events.emit(events.StatementRetried(operation=operation, reason=reason))
            logger.info(
                "statement_retried alias=%s operation=%s reason=%s attempt=%d",
                alias,
                operation,
                reason,
                attempt,
            )
            time.sleep(DEADLOCK_BACKOFF_SECONDS * (2 ** (attempt - 1)))


def writes_while_busy(alias: str) -> bool:
    return True  # row locks: an open job transaction blocks only the rows it wrote


def cursor_lock(alias: str) -> None:
    return None  # nothing closes a job's connection from another thread here


def database_now(alias: str) -> datetime.datetime:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {NOW}", [])
        return sqlite_datetime(cursor.fetchone()[0])


def _aware(value: Any) -> datetime.datetime:
    return sqlite_datetime(value)


# -- inserts -------------------------------------------------------------------------------


def _run_after_sql(
    connection: Any, run_after: datetime.datetime | datetime.timedelta | None
) -> tuple[str, list[Any]]:
    """The ``<run_after>`` value of a job insert and its parameter (a delay: from the database clock)."""
    if run_after is None:
        return NOW, []
    if isinstance(run_after, datetime.datetime):
        return "%s", [connection.ops.adapt_datetimefield_value(run_after)]
    return _LATER, [CLOCK.seconds(run_after.total_seconds())]


def insert_jobs(
    alias: str,
    rows: Sequence[dict[str, Any]],
    run_after: datetime.datetime | datetime.timedelta | None = None,
) -> list[Inserted]:
    connection = connections[alias]
    run_after_sql, extra_params = _run_after_sql(connection, run_after)
    # Both times written here, in UTC, so the session's time zone plays no part.
    columns = INSERT_COLUMNS + ", run_after, enqueued_at"
    placeholder = (
        f"({', '.join(['%s'] * len(INSERT_FIELDS))}, {INSERT_CONSTANTS}, '{{}}', '[]', "
        f"{run_after_sql}, {NOW})"
    )
    results: list[Inserted] = []
    with connection.cursor() as cursor:
        for start in range(0, len(rows), INSERT_CHUNK):
            chunk = rows[start : start + INSERT_CHUNK]
            params: list[Any] = []
            for row in chunk:
                params += row_values(row)
                params += extra_params
            sql = f"INSERT INTO {TABLE} ({columns}) VALUES {', '.join([placeholder] * len(chunk))}"
            if connection.mysql_is_mariadb:  # type: ignore[attr-defined]
                cursor.execute(sql + " RETURNING id, run_after, enqueued_at", params)
                fetched = cursor.fetchall()
            else:
                # MySQL has no RETURNING. A multi-row INSERT ... VALUES is a "simple insert":
                # InnoDB reserves its ids in one block, so they follow the first one.
                cursor.execute(sql, params)
                first, step = int(cursor.lastrowid), _autoinc_step(cursor)
                ids = [first + step * index for index in range(len(chunk))]
                cursor.execute(
                    f"SELECT id, run_after, enqueued_at FROM {TABLE} WHERE id IN ({placeholders(ids)}) "
                    "ORDER BY id",
                    ids,
                )
                fetched = cursor.fetchall()
            results += [(row[0], _aware(row[1]), _aware(row[2])) for row in fetched]
    return results


def _autoinc_step(cursor: Any) -> int:
    cursor.execute("SELECT @@auto_increment_increment", [])
    return int(cursor.fetchone()[0])


def insert_keyed_job(
    alias: str,
    row: dict[str, Any],
    run_after: datetime.datetime | datetime.timedelta | None,
    *,
    scope: str,
    fingerprint: str,
    expires_at: datetime.datetime,
) -> Inserted | None:
    # Three statements in the caller's transaction or one of ours, as on SQLite. The key's
    # unique index serialises two inserters of one key: the second waits for the first's
    # commit, then yields to it.
    # Concurrent inserters of one key are InnoDB's shared-to-exclusive upgrade (the duplicate
    # check's shared lock, then the update's exclusive one): a deadlock there reruns it all.
    def run() -> Inserted | None:
        with transaction.atomic(using=alias, savepoint=False):
            key = row["idempotency_key"]
            key_id = insert_key(alias, scope, key, fingerprint, None, expires_at=expires_at)
            if key_id is None:
                return None
            (inserted,) = insert_jobs(alias, [row], run_after)
            with connections[alias].cursor() as cursor:
                cursor.execute(f"UPDATE {KEY_TABLE} SET job_id = %s WHERE id = %s", [inserted[0], key_id])
        return inserted

    return retry_deadlocks(alias, "enqueue_keyed", run)


# -- claim ---------------------------------------------------------------------------------

_DUE = f"status = 'queued' AND run_after <= {NOW} AND attempts < max_attempts"
_ORDER = "ORDER BY priority DESC, run_after, id"
_CLAIM_UPDATE = (
    f"UPDATE {TABLE} SET status = 'running', attempts = attempts + 1, "
    "lease_token = REPLACE(UUID(), '-', ''), "
    f"lease_expires_at = {_LEASE_EXPIRES}, started_at = {NOW}, worker_id = %s, "
    f"attempt_history = {_HISTORY_STARTED} "
    "WHERE id IN ({ids}) AND status = 'queued'"
)


# -- flow control ----------------------------------------------------------------------------

#: Each limit key a job's ``flow_keys`` holds, as rows: compared byte for byte, as on PostgreSQL
#: (a database whose default collation ignores case would otherwise hold back a key that only
#: differs in case from a full one). ``VARBINARY``, not ``utf8mb4_bin``: that collation pads
#: with spaces, so ``k`` being full held back ``k `` too; a binary string counts every byte on
#: MariaDB and MySQL alike, and is only compared here, never returned. 4000 bytes hold the
#: 1000 characters the column had.
_FLOW_KEYS = f"JSON_TABLE({TABLE}.flow_keys, '$[*]' COLUMNS (flow_key VARBINARY(4000) PATH '$')) AS held_keys"
_RATE_TABLE, _BREAKER_TABLE = flow_sql.RATE_TABLE, flow_sql.BREAKER_TABLE


class _FlowSQL(flow_sql.SequentialTurn):
    """The limited claim's statements on MariaDB/MySQL (see ``store/flow_sql.py``).

    No transaction-scoped advisory lock here (``GET_LOCK`` belongs to the session and
    outlives a rollback), so the turn is a row lock: one row of the rate table, locked by an
    upsert that leaves it as it is. InnoDB holds it to the transaction's end and sees any
    cycle through it, as it sees one through the rows a claim leases.
    """

    def take_turn(self, alias: str, cursor: Any) -> None:
        # An existing primary key: an exclusive lock on that one record, no gap.
        cursor.execute(
            f"INSERT INTO {_RATE_TABLE} (`key`, tat) VALUES (%s, 0) ON DUPLICATE KEY UPDATE tat = tat",
            [flow_sql.TURN_KEY],
        )

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
        # The plain claim's walk of the status-first due index, in claim order; the rows of
        # full keys are passed over on the walk (and, at READ COMMITTED, left unlocked).
        where, params = flow_sql.candidate_filters(
            _DUE,
            f"SELECT 1 FROM {_FLOW_KEYS} WHERE held_keys.flow_key IN ({{keys}})",
            queues,
            exclude,
            blocked_tasks,
            blocked_keys,
            blocked_retries,
        )
        cursor.execute(
            f"SELECT id, task_name, queue_name, flow_keys, attempts FROM {TABLE} "
            f"WHERE {' AND '.join(where)} {_ORDER} LIMIT %s FOR UPDATE SKIP LOCKED",
            [*params, count],
        )
        return list(cursor.fetchall())

    def lease(self, alias: str, cursor: Any, ids: Sequence[int], worker_id: str) -> list[ClaimedJob]:
        # The candidates' rows are locked by this transaction: every one is still queued.
        cursor.execute(_CLAIM_UPDATE.format(ids=placeholders(ids)), [worker_id, worker_id, *ids])
        cursor.execute(f"SELECT {RETURNING} FROM {TABLE} WHERE id IN ({placeholders(ids)})", list(ids))
        return [ClaimedJob.from_row(row) for row in cursor.fetchall()]

    def upsert_rates(self, alias: str, cursor: Any, arrivals: Mapping[str, float]) -> None:
        # Inside the turn: no other limited claim inserts a rate key at the same time, so the
        # duplicate checks' locks meet no one.
        cursor.execute(
            f"INSERT INTO {_RATE_TABLE} (`key`, tat) VALUES {', '.join(['(%s, %s)'] * len(arrivals))} "
            "ON DUPLICATE KEY UPDATE tat = VALUES(tat)",
            [value for pair in arrivals.items() for value in pair],
        )

    def ensure_breakers(self, alias: str, cursor: Any, names: Sequence[str]) -> None:
        # A no-op update, not INSERT IGNORE, which would also hide a value too long for its column.
        cursor.execute(
            f"INSERT INTO {_BREAKER_TABLE} ({flow_sql.BREAKER_INSERT_COLUMNS}) VALUES "
            + ", ".join([flow_sql.BREAKER_INSERT_ROW] * len(names))
            + " ON DUPLICATE KEY UPDATE name = name",
            [value for name in names for value in (name, False)],
        )


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
    # The limited claim is one transaction of several statements: a deadlock rolls all of it
    # back (its rate and breaker writes too), so it runs again from the start, its report
    # to the caller cleared first.
    def run() -> list[ClaimedJob]:
        if throttle is not None:
            throttle.retry_after = None
            throttle.held_back.clear()
            throttle.breaker_changes = []
            throttle.breaker_states = {}
        return flow_sql.claim_limited(FLOW_SQL, alias, queues, batch_size, worker_id, exclude, plan, throttle)

    return retry_deadlocks(alias, "claim_limited", run)


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
    # The indexes that start with status (jobguard_job_due_my_idx and _due_all_my_idx) give
    # these rows in claim order, so the walk stops after `batch_size` rows it could lock.
    picked = f"SELECT id FROM {TABLE} WHERE {_DUE} {queue_filter}{_ORDER} LIMIT %s FOR UPDATE SKIP LOCKED"

    def run() -> list[ClaimedJob]:
        with transaction.atomic(using=alias, savepoint=False):
            with connections[alias].cursor() as cursor:
                cursor.execute(picked, [*params, batch_size])
                ids = [row[0] for row in cursor.fetchall()]
                if not ids:
                    return []
                cursor.execute(_CLAIM_UPDATE.format(ids=placeholders(ids)), [worker_id, worker_id, *ids])
                cursor.execute(f"SELECT {RETURNING} FROM {TABLE} WHERE id IN ({placeholders(ids)})", ids)
                rows = cursor.fetchall()
        return [ClaimedJob.from_row(row) for row in rows]

    return retry_deadlocks(alias, "claim", run)


# -- leases --------------------------------------------------------------------------------


def heartbeat(alias: str, ids: list[int], tokens: list[str]) -> list[tuple[int, bool]]:
    pairs = ", ".join(["(%s, %s)"] * len(ids))
    flat = [value for pair in zip(ids, tokens, strict=True) for value in pair]
    where = f"WHERE (id, lease_token) IN ({pairs})"

    def run() -> list[tuple[int, bool]]:
        # The renewed rows stay locked until the commit, so the read sees just them.
        with transaction.atomic(using=alias, savepoint=False):
            with connections[alias].cursor() as cursor:
                cursor.execute(f"UPDATE {TABLE} SET lease_expires_at = {_LEASE_EXPIRES} {where}", flat)
                if cursor.rowcount == 0:
                    return []
                cursor.execute(f"SELECT id, cancel_requested FROM {TABLE} {where}", flat)
                return [(row[0], bool(row[1])) for row in cursor.fetchall()]

    return retry_deadlocks(alias, "heartbeat", run)


_COMPLETE = (
    f"UPDATE {TABLE} SET status = 'succeeded', finished_at = {NOW}, lease_token = NULL, "
    "lease_expires_at = NULL, result = %s WHERE id = %s AND lease_token = %s"
)


def complete(alias: str, job_id: int, lease_token: str, result_json: str, *, commit: bool = False) -> bool:
    # commit: the block's own COMMIT follows; mysqlclient sends one statement per call.
    def run() -> bool:
        with connections[alias].cursor() as cursor:
            cursor.execute(_COMPLETE, [result_json, job_id, lease_token])
            return bool(cursor.rowcount == 1)

    return retry_deadlocks(alias, "complete", run)


def complete_many(alias: str, acks: Sequence[tuple[int, str, str]]) -> list[tuple[int, bool]]:
    # Lock the rows still held (one read), then one UPDATE of those: a CASE picks each result.
    pairs = ", ".join(["(%s, %s)"] * len(acks))
    flat = [value for job_id, token, _ in acks for value in (job_id, token)]
    results = {job_id: result for job_id, _, result in acks}

    def run() -> list[tuple[int, bool]]:
        with transaction.atomic(using=alias, savepoint=False):
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    f"SELECT id, has_dependants FROM {TABLE} WHERE (id, lease_token) IN ({pairs}) "
                    "ORDER BY id FOR UPDATE",
                    flat,
                )
                rows = [(job_id, bool(flag)) for job_id, flag in cursor.fetchall()]
                held = [job_id for job_id, _ in rows]
                if not held:
                    return []
                cases = " ".join(["WHEN %s THEN %s"] * len(held))
                cursor.execute(
                    f"UPDATE {TABLE} SET status = 'succeeded', finished_at = {NOW}, lease_token = NULL, "
                    f"lease_expires_at = NULL, result = CASE id {cases} END "
                    f"WHERE id IN ({placeholders(held)})",
                    [*(value for job_id in held for value in (job_id, results[job_id])), *held],
                )
        return rows

    return retry_deadlocks(alias, "complete_many", run)


def discard_queued(alias: str, job_id: int) -> None:
    def run() -> None:
        with connections[alias].cursor() as cursor:
            cursor.execute(f"DELETE FROM {TABLE} WHERE id = %s AND status = 'queued'", [job_id])

    retry_deadlocks(alias, "discard_queued", run)


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
    return retry_deadlocks(
        alias,
        "requeue",
        lambda: common.requeue(
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
        ),
    )


def mark_dead(
    alias: str, job_id: int, lease_token: str, error: str, attempt_error: AttemptError | None
) -> bool:
    return retry_deadlocks(
        alias,
        "mark_dead",
        lambda: common.mark_dead(CLOCK, _HISTORY, alias, job_id, lease_token, error, attempt_error),
    )


_EXPIRED = f"status = 'running' AND lease_expires_at < {NOW}"
_REAP_PICK = (
    f"SELECT id, queue_name FROM {TABLE} WHERE {_EXPIRED} AND attempts < max_attempts "
    "ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED"
)
_REAP_REQUEUE = (
    f"UPDATE {TABLE} SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, "
    f"run_after = {NOW}, reappearances = reappearances + 1, worker_id = '', "
    f"first_failed_at = COALESCE(first_failed_at, {NOW}), last_error = %s, "
    f"attempt_history = {_HISTORY_FAILED} WHERE id IN ({{ids}})"
)
_REAP_EXHAUSTED = (
    f"SELECT id, lease_token FROM {TABLE} WHERE {_EXPIRED} AND attempts >= max_attempts "
    "ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED"
)


def reap(alias: str, batch_size: int = REAP_BATCH) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    def run() -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        with transaction.atomic(using=alias, savepoint=False):
            with connections[alias].cursor() as cursor:
                cursor.execute(_REAP_PICK, [batch_size])
                requeued = [(row[0], row[1]) for row in cursor.fetchall()]
                if requeued:
                    ids = [job_id for job_id, _ in requeued]
                    cursor.execute(
                        _REAP_REQUEUE.format(ids=placeholders(ids)),
                        [LEASE_EXPIRED_MESSAGE, *LEASE_EXPIRED_ERROR, *ids],
                    )
                cursor.execute(_REAP_EXHAUSTED, [batch_size])
                exhausted = [(row[0], row[1]) for row in cursor.fetchall()]
        return requeued, exhausted

    return retry_deadlocks(alias, "reap", run)


# -- idempotency keys ----------------------------------------------------------------------

# `key` is a reserved word in MySQL: quoted with backticks.
_INSERT_KEY = (
    f"INSERT INTO {KEY_TABLE} (`key`, scope, fingerprint, status, duplicates, expires_at, job_id) "
    "VALUES (%s, %s, %s, 'in_progress', 0, %s, %s) ON DUPLICATE KEY UPDATE id = id"
)
_KEY_OWNER = f"SELECT job_id, status FROM {KEY_TABLE} WHERE scope = %s AND `key` = %s"


def insert_key(
    alias: str, scope: str, key: str, digest: str, job_id: int | None, *, expires_at: datetime.datetime
) -> int | None:
    # ON DUPLICATE KEY UPDATE with a no-op waits for a concurrent inserter of the key, then
    # yields to it without an error (INSERT IGNORE would also hide a value too long for its
    # column). A new row reports its id; an existing one reports none.
    connection = connections[alias]
    expiry = connection.ops.adapt_datetimefield_value(expires_at)

    def run() -> int | None:
        with connection.cursor() as cursor:
            cursor.execute(_INSERT_KEY, [key, scope, digest, expiry, job_id])
            inserted = cursor.lastrowid
        return int(inserted) if inserted else None

    return retry_deadlocks(alias, "insert_key", run)


def key_owner(alias: str, scope: str, key: str) -> tuple[int | None, str] | None:
    with connections[alias].cursor() as cursor:
        cursor.execute(_KEY_OWNER, [scope, key])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


_KEY_SUCCEEDED = (
    f"UPDATE {KEY_TABLE} SET status = 'succeeded', result = %s, updated_at = {NOW} "
    "WHERE scope = %s AND `key` = %s AND job_id = %s"
)


def record_key_success(alias: str, scope: str, key: str, job_id: int, result_json: str | None) -> bool:
    with connections[alias].cursor() as cursor:
        cursor.execute(_KEY_SUCCEEDED, [result_json, scope, key, job_id])
        return bool(cursor.rowcount > 0)


# -- database locks (store/locks.py) --------------------------------------------------------


def acquire_lock(alias: str, key: str, token: str, ttl: float) -> int | None:
    # MySQL applies an ON DUPLICATE KEY UPDATE's assignments left to right, each seeing the
    # ones before it: the token is decided first, from the old row, and the other columns
    # follow "is the token now ours" (tokens are random per acquire, never reused).
    table = "jobguard_lock"
    taken = "token = VALUES(token)"
    sql = (
        f"INSERT INTO {table} (`key`, token, expires_at, fencing_token, acquired_at) "
        f"VALUES (%s, %s, {_LATER}, {CLOCK.epoch_micros}, {NOW}) ON DUPLICATE KEY UPDATE "
        f"token = IF(token IS NULL OR expires_at <= {NOW}, VALUES(token), token), "
        f"expires_at = IF({taken}, VALUES(expires_at), expires_at), "
        f"fencing_token = IF({taken}, fencing_token + 1, fencing_token), "
        f"acquired_at = IF({taken}, VALUES(acquired_at), acquired_at)"
    )

    def run() -> int | None:
        with transaction.atomic(using=alias, savepoint=False):
            with connections[alias].cursor() as cursor:
                cursor.execute(sql, [key, token, CLOCK.seconds(ttl)])
                cursor.execute(
                    f"SELECT fencing_token FROM {table} WHERE `key` = %s AND token = %s", [key, token]
                )
                row = cursor.fetchone()
        return None if row is None else int(row[0])

    return retry_deadlocks(alias, "acquire_lock", run)


# -- workflow counters ---------------------------------------------------------------------------

# The unique index on (workflow, shard), named: the locking read must walk it, in its order.
# A full scan (the optimizer's pick for a small table) would lock rows in insertion order,
# and wait on rows that do not match.
_COUNTER_INDEX = "jobguard_wfcounter_unique"


def _counter_filter(changes: Sequence[CounterChange]) -> tuple[str, list[int]]:
    shards: dict[int, list[int]] = {}
    for workflow_id, shard, *_ in changes:
        shards.setdefault(workflow_id, []).append(shard)
    where = " OR ".join(f"(workflow_id = %s AND shard IN ({placeholders(each)}))" for each in shards.values())
    return where, [value for workflow_id, each in shards.items() for value in (workflow_id, *each)]


_COUNTER_COLUMNS = ("pending", "succeeded", "failed")


def add_workflow_counts(alias: str, changes: Sequence[CounterChange]) -> list[tuple[int, int]]:
    # No RETURNING on an upsert here, and an INSERT (even one that meets an existing row)
    # checks the workflow foreign key: a shared lock on the workflow row, which a completion
    # finishing the workflow, or an add() checking it is open, then wants exclusively; two
    # such transactions deadlock. So: lock the rows that exist, in (workflow, shard) order,
    # and update them by id knowing what they held. Rows still missing (joining, a replay's
    # shard) are inserted only once the workflow row is locked exclusively, the lock taken
    # last as every writer takes it, so the check's shared lock is already ours.
    def run() -> list[tuple[int, int]]:
        with transaction.atomic(using=alias, savepoint=False), connections[alias].cursor() as cursor:
            where, params = _counter_filter(changes)
            cursor.execute(
                f"SELECT id, workflow_id, shard, pending FROM {COUNTER_TABLE} FORCE INDEX ({_COUNTER_INDEX}) "
                f"WHERE {where} ORDER BY workflow_id, shard FOR UPDATE",
                params,
            )
            found = {(row[1], row[2]): (row[0], row[3]) for row in cursor.fetchall()}
            present = [(found[change[:2]][0], change) for change in changes if change[:2] in found]
            after = {change[:2]: found[change[:2]][1] + change[2] for _, change in present}
            if present:
                _update_counters(cursor, present)
            missing = [change for change in changes if change[:2] not in found]
            if missing:
                after.update(_insert_counters(cursor, missing))
        return [(change[0], int(after[change[:2]])) for change in changes]

    return retry_deadlocks(alias, "add_workflow_counts", run)


def _update_counters(cursor: Any, present: Sequence[tuple[int, CounterChange]]) -> None:
    """Add the changes to the rows (locked) by id: ``(row id, change)`` each."""
    cases = " ".join(["WHEN %s THEN %s"] * len(present))
    sets = ", ".join(f"{column} = {column} + CASE id {cases} END" for column in _COUNTER_COLUMNS)
    params = [value for index in (2, 3, 4) for row_id, change in present for value in (row_id, change[index])]
    ids = [row_id for row_id, _ in present]
    cursor.execute(f"UPDATE {COUNTER_TABLE} SET {sets} WHERE id IN ({placeholders(ids)})", [*params, *ids])


def _insert_counters(cursor: Any, missing: Sequence[CounterChange]) -> dict[tuple[int, int], int]:
    """Insert the rows (or add to them, if another transaction inserted one first); their pending now."""
    workflows = sorted({change[0] for change in missing})
    cursor.execute(
        f"SELECT id FROM {WORKFLOW_TABLE} WHERE id IN ({placeholders(workflows)}) ORDER BY id FOR UPDATE",
        workflows,
    )
    added = ", ".join(f"{column} = {column} + VALUES({column})" for column in _COUNTER_COLUMNS)
    cursor.execute(
        f"INSERT INTO {COUNTER_TABLE} (workflow_id, shard, {', '.join(_COUNTER_COLUMNS)}) "
        f"VALUES {', '.join(['(%s, %s, %s, %s, %s)'] * len(missing))} ON DUPLICATE KEY UPDATE {added}",
        [value for change in missing for value in change],
    )
    where, params = _counter_filter(missing)
    # The rows are this transaction's now (inserted or updated): what they hold is final until it ends.
    cursor.execute(f"SELECT workflow_id, shard, pending FROM {COUNTER_TABLE} WHERE {where}", params)
    return {(row[0], row[1]): row[2] for row in cursor.fetchall()}


# -- reporting (jobguard_tune) -----------------------------------------------------------------

_DURATION = "TIMESTAMPDIFF(MICROSECOND, started_at, finished_at) / 1000000.0"


def durations_sql(since: float, queue: str | None) -> tuple[str, list[Any]]:
    """The MariaDB/MySQL statement of :func:`observed_durations` and its parameters."""
    params: list[Any] = [CLOCK.seconds(-since)]
    queue_filter = ""
    if queue is not None:
        queue_filter = "AND queue_name = %s "
        params.append(queue)
    # MySQL has no percentile_cont: as on SQLite, window functions rank each task's
    # durations and only the rows the percentiles interpolate between leave the database.
    ranks = ", ".join(
        f"FLOOR({fraction!r} * (n - 1)), FLOOR({fraction!r} * (n - 1)) + 1" for fraction in PERCENTILES
    )
    sql = (
        "SELECT queue_name, task_name, n, top, position, d FROM ("
        "SELECT queue_name, task_name, d, "
        "row_number() OVER (PARTITION BY queue_name, task_name ORDER BY d) - 1 AS position, "
        "count(*) OVER (PARTITION BY queue_name, task_name) AS n, "
        "max(d) OVER (PARTITION BY queue_name, task_name) AS top "
        f"FROM (SELECT queue_name, task_name, {_DURATION} AS d FROM {TABLE} "
        f"WHERE {FINISHED} AND finished_at >= {_LATER} {queue_filter}) AS runs) AS ranked "
        f"WHERE position IN ({ranks}) ORDER BY queue_name, task_name, position"
    )
    return sql, params


_OLDEST_DUE = (
    f"SELECT queue_name, TIMESTAMPDIFF(MICROSECOND, min(run_after), {NOW}) / 1000000.0 "
    f"FROM {TABLE} WHERE status = 'queued' AND run_after <= {NOW} GROUP BY queue_name"
)


def oldest_due_ages(alias: str) -> dict[str, float]:
    # A grouped min over the queued rows of the status-first due index.
    with connections[alias].cursor() as cursor:
        cursor.execute(_OLDEST_DUE, [])
        return {queue: max(0.0, float(age)) for queue, age in cursor.fetchall()}


def observed_durations(alias: str, since: float, queue: str | None) -> list[DurationRow]:
    """Run durations per (queue, task) in the window, percentiles interpolated here."""
    sql, params = durations_sql(since, queue)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    groups: dict[tuple[str, str], tuple[int, float, dict[int, float]]] = {}
    for queue_name, task_name, count, top, position, value in rows:
        groups.setdefault((queue_name, task_name), (int(count), float(top), {}))[2][int(position)] = float(
            value
        )
    return [
        (queue_name, task_name, count, [interpolate(f, count, kept) for f in PERCENTILES], top)
        for (queue_name, task_name), (count, top, kept) in groups.items()
    ]
