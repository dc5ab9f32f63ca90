"""The store on PostgreSQL: every statement for jobs and keys, as the hot path sends it.

Times come from ``statement_timestamp()``, the database clock at the start of each
statement. ``FOR UPDATE SKIP LOCKED`` lets concurrent workers and reapers pass over rows
another one is taking instead of queueing behind it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import json
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import DatabaseError, DataError, InterfaceError, connections, transaction

from .. import events
from ..conf import get_settings
from ..flow import MAX_STORED_RATE_KEY_LENGTH, FlowPlan, Throttle, admission
from . import common, flow_sql
from .common import (
    FINISHED,
    INSERT_COLUMNS,
    INSERT_CONSTANTS,
    INSERT_FIELDS,
    LEASE_EXPIRED_ERROR,
    LEASE_EXPIRED_MESSAGE,
    REAP_BATCH,
    RETURNING,
    TABLE,
    AttemptError,
    ClaimedJob,
    Clock,
    CounterChange,
    DurationRow,
    History,
    Inserted,
    payload_json,
    row_values,
    sqlite_datetime,
    trace_context_json,
)
from .common import insert_key as insert_key
from .common import key_owner as key_owner

_SIMPLE_QUERY_CURSORS: tuple[type, ...]
try:
    from psycopg import ClientCursor

    _SIMPLE_QUERY_CURSORS = (ClientCursor,)
except ImportError:  # psycopg 2, or a project on SQLite only
    _SIMPLE_QUERY_CURSORS = ()

logger = logging.getLogger("django_jobguard.store")


def _simple_query(cursor: Any) -> bool:
    """Whether ``cursor`` (Django's) binds on the client: one string may carry several statements."""
    return isinstance(cursor.cursor, _SIMPLE_QUERY_CURSORS)


def _binds_on_client(connection: Any) -> bool:
    """:func:`_simple_query` for the cursors ``connection`` (Django's, connected) will open."""
    factory = getattr(connection.connection, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, _SIMPLE_QUERY_CURSORS)


_T = TypeVar("_T")

NOW = "statement_timestamp()"
_RETURNING_J = ", ".join(f"j.{column}" for column in RETURNING.split(", "))
# The attempt history with a new entry (parameter: the worker id), in the claim.
_HISTORY_STARTED = (
    f"j.attempt_history || jsonb_build_array(jsonb_build_object('worker_id', %s::text, 'started_at', {NOW}))"
)
# The history without its last entry: the attempt was refunded, it did not count.
_HISTORY_DROPPED = "attempt_history - (-1)"


def _history_failed(column: str = "attempt_history") -> str:
    """SQL for the history with its last entry marked failed (parameters: an :data:`AttemptError`)."""
    # COALESCE: a job claimed before the history existed has no entry to complete.
    return (
        f"jsonb_set({column}, '{{-1}}', COALESCE({column} -> -1, '{{}}'::jsonb) || jsonb_build_object("
        f"'finished_at', {NOW}, 'error_class', %s::text, 'error', %s::text, 'traceback', %s::text))"
    )


# The start of the entry before the last (NULL past the array's start): jsonb renders a
# timestamptz as ISO 8601 with its offset, which casts back exactly.
_HISTORY_PREVIOUS_START = "(attempt_history -> -2 ->> 'started_at')::timestamptz"
_HISTORY = History(failed=_history_failed(), dropped=_HISTORY_DROPPED, previous_start=_HISTORY_PREVIOUS_START)
#: The database clock: ``statement_timestamp()``, the start of each statement.
CLOCK = Clock(
    now=NOW,
    later=f"{NOW} + %s * interval '1 second'",
    seconds=float,
    epoch_micros=f"(extract(epoch from {NOW}) * 1000000)::bigint",
)


# -- prepared statements -------------------------------------------------------------------

# A statement planned for another shape of the table (a migration ran): prepare it afresh.
_REPLANNED_SQLSTATE = "0A000"
# A name we prepared is missing (26000), or a name this client never prepared already exists
# (42P05): the client's server session changed under it, which is what a transaction-mode
# pooler does. The alias is then taken as pooled for the life of the process.
_POOLER_SQLSTATES = frozenset({"26000", "42P05"})
_STALE_PREPARED_SQLSTATES = _POOLER_SQLSTATES | {_REPLANNED_SQLSTATE}

#: Aliases found behind a pooler at run time (not declared in ``POOLED_DATABASES``).
_detected_pooled: set[str] = set()
_detected_lock = threading.Lock()


def _pooled(alias: str) -> bool:
    """Whether ``alias`` goes through a transaction-mode pooler: declared, or detected here."""
    return alias in _detected_pooled or alias in get_settings().pooled_databases


def detected_pooled_databases() -> frozenset[str]:
    """Aliases this process stopped preparing statements on, because a pooler was detected."""
    return frozenset(_detected_pooled)


def _pooler_detected(alias: str, exc: DatabaseError) -> None:
    with _detected_lock:
        if alias in _detected_pooled:
            return
        _detected_pooled.add(alias)
    logger.warning(
        "prepared statements vanished on database alias=%s (%s): it looks like a transaction-mode "
        "pooler, so this process sends its statements as text on it from now on. Add %r to "
        'JOBGUARD["POOLED_DATABASES"] so no statement fails first (docs/how-to/scale-out.md).',
        alias,
        str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        alias,
        extra={"database_alias": alias},
    )


def lost_statement(exc: BaseException) -> bool:
    """Whether ``exc`` is a prepared statement gone stale (a pooler's, or re-planned): a rerun cures it."""
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    return isinstance(exc, DatabaseError) and sqlstate in _STALE_PREPARED_SQLSTATES


def rerun_after_lost_statement(alias: str, operation: str, run: Callable[[], _T]) -> _T:
    """Run ``run`` (a whole transaction); once more if a prepared statement went stale in it.

    Outside a transaction :class:`Statement` runs such a statement again itself; inside one
    the failure aborted the transaction, so the whole of it is run again here, without a
    warning of its own (the pooler's detection logged one). A second failure is raised.
    """
    try:
        return run()
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) not in _STALE_PREPARED_SQLSTATES:
            raise
        if connections[alias].in_atomic_block:
            raise
        events.emit(events.StatementRetried(operation=operation, reason="prepared_statement_lost"))
        logger.info(
            "statement_retried alias=%s operation=%s reason=prepared_statement_lost", alias, operation
        )
        return run()


@dataclass
class _Prepared:
    """What one connection has prepared: names, and a generation that renames them all."""

    names: set[str] = field(default_factory=set)
    generation: int = 0


_prepared_by_connection: weakref.WeakKeyDictionary[Any, _Prepared] = weakref.WeakKeyDictionary()


class Statement:
    """A statement the worker sends for every job: parsed and planned once per connection.

    Django's default client-side binding sends each statement as text, which PostgreSQL
    parses and plans every time. A worker's ack, batch ack and lease renewal are prepared
    with SQL ``PREPARE`` on their first use on a connection and sent as ``EXECUTE
    name(values)`` after that: still one simple query, so the ack can still carry its
    ``COMMIT`` and Django's cursor wrappers still see every statement. Where a client's
    server session can change under it (a transaction-mode pooler, ``POOLED_DATABASES``)
    or with server-side binding, the statement is sent as it is. An undeclared pooler is
    detected at the first statement it loses (a prepared name missing, or one that already
    exists): the process sends text on that alias from then on and logs one warning.
    """

    def __init__(self, sql: str) -> None:
        self.sql = sql
        count = sql.count("%s")
        numbers = iter(range(1, count + 1))
        self._body = re.sub("%s", lambda _: f"${next(numbers)}", sql)
        self._name = "jobguard_" + hashlib.blake2s(sql.encode(), digest_size=6).hexdigest()
        self._arguments = f"({', '.join(['%s'] * count)})" if count else ""

    def execute(
        self, alias: str, cursor: Any, params: Sequence[Any], then: str = "", before: str = ""
    ) -> None:
        """Run the statement on ``cursor`` (of ``alias``), between ``before`` and ``then`` in the
        same string (``before``'s results come first: the caller moves past them)."""
        prepared = self._prepared(alias, cursor)
        if prepared is None:
            cursor.execute(before + self.sql + then, params)
            return
        name = f"{self._name}_{prepared.generation}"
        try:
            if name not in prepared.names:
                cursor.execute(f"PREPARE {name} AS {self._body}")
                prepared.names.add(name)
            cursor.execute(f"{before}EXECUTE {name}{self._arguments}{then}", params)
        except DatabaseError as exc:
            sqlstate = getattr(exc.__cause__, "sqlstate", None)
            if sqlstate not in _STALE_PREPARED_SQLSTATES:
                raise
            if sqlstate in _POOLER_SQLSTATES:
                _pooler_detected(alias, exc)
            else:  # re-planned: prepare afresh under new names (an old name may still exist)
                prepared.names.clear()
                prepared.generation += 1
            # Outside a transaction nothing was lost, so run it again now (as text on a
            # pooled alias); inside one, the failed statement aborted it, and the error goes
            # to the caller like any other.
            if connections[alias].in_atomic_block:
                raise
            self.execute(alias, cursor, params, then, before)

    @staticmethod
    def sends_text(alias: str, cursor: Any) -> bool:
        """Whether a statement on ``cursor`` is sent as text, to be planned each time."""
        return not _simple_query(cursor) or _pooled(alias)

    @staticmethod
    def _prepared(alias: str, cursor: Any) -> _Prepared | None:
        if Statement.sends_text(alias, cursor):
            return None
        raw = cursor.cursor.connection
        prepared = _prepared_by_connection.get(raw)
        if prepared is None:
            # Each thread has its own connection, so no two threads touch one entry.
            prepared = _prepared_by_connection.setdefault(raw, _Prepared())
        return prepared


#: The claim statement leaves paused queues alone by itself (see _picked).
CLAIM_READS_PAUSES = True
ACKS_COMMIT_ALONE = True  # complete_many is one UPDATE


def writes_while_busy(alias: str) -> bool:
    return True  # row locks: an open job transaction blocks only the rows it wrote


def cursor_lock(alias: str) -> None:
    return None  # nothing closes a job's connection from another thread here


def database_now(alias: str) -> datetime.datetime:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {NOW}", [])
        value = cursor.fetchone()[0]
    return value if isinstance(value, datetime.datetime) else sqlite_datetime(value)


# -- inserts -------------------------------------------------------------------------------


def _run_after_sql(
    connection: Any, run_after: datetime.datetime | datetime.timedelta | None
) -> tuple[str, list[Any]]:
    """The ``, <run_after>`` fragment of a job insert and its parameter (a delay: from the database clock)."""
    if run_after is None:
        return "", []
    if isinstance(run_after, datetime.datetime):
        return ", %s::timestamptz", [connection.ops.adapt_datetimefield_value(run_after)]
    return ", statement_timestamp() + %s * interval '1 second'", [run_after.total_seconds()]


def insert_jobs(
    alias: str,
    rows: Sequence[dict[str, Any]],
    run_after: datetime.datetime | datetime.timedelta | None = None,
) -> list[Inserted]:
    connection = connections[alias]
    columns = INSERT_COLUMNS + (", run_after" if run_after is not None else "")
    run_after_sql, extra_params = _run_after_sql(connection, run_after)
    with connection.cursor() as cursor:
        if len(rows) == 1:
            # One row: plain VALUES. Dumping ten one-element arrays costs the client more
            # than the whole rest of the enqueue (measured: 1,340 -> about 2,000 enqueues/s).
            cursor.execute(
                f"INSERT INTO {TABLE} ({columns}) VALUES (%s, %s, %s::jsonb, %s::jsonb, %s, %s, %s, %s, %s, "
                f"%s, %s::jsonb, %s::jsonb, %s::bigint, {INSERT_CONSTANTS}, '{{}}'::jsonb, "
                f"'[]'::jsonb{run_after_sql}) "
                "RETURNING id, run_after, enqueued_at",
                [*row_values(rows[0]), *extra_params],
            )
            return list(cursor.fetchall())
        # One statement whatever the count: one array parameter per column, unnested server-side.
        arrays = [[row.get(field) for row in rows] for field in INSERT_FIELDS]
        if any(row.get("encrypt") for row in rows):  # each row sealed as it says
            arrays[2] = [payload_json(row, "args") for row in rows]
            arrays[3] = [payload_json(row, "kwargs") for row in rows]
        else:
            arrays[2] = [json.dumps(value) for value in arrays[2]]
            arrays[3] = [json.dumps(value) for value in arrays[3]]
        arrays[10] = [json.dumps(value or []) for value in arrays[10]]
        arrays[11] = [trace_context_json(row) for row in rows]
        cursor.execute(
            f"INSERT INTO {TABLE} ({columns}) "
            f"SELECT t, q, a::jsonb, k::jsonb, p, m, v, i, l, h, f::jsonb, c::jsonb, w, {INSERT_CONSTANTS}, "
            f"'{{}}'::jsonb, '[]'::jsonb{run_after_sql} "
            "FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::smallint[], %s::int[], "
            "%s::float8[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[]) "
            "AS u(t, q, a, k, p, m, v, i, l, h, f, c, w) "
            "RETURNING id, run_after, enqueued_at",
            [*extra_params, *arrays],  # the run_after parameter comes first in the text
        )
        return list(cursor.fetchall())


def insert_keyed_job(
    alias: str,
    row: dict[str, Any],
    run_after: datetime.datetime | datetime.timedelta | None,
    *,
    scope: str,
    fingerprint: str,
    expires_at: datetime.datetime,
) -> Inserted | None:
    # One statement does both: the key row takes the job's id from the job table's sequence
    # before the job row exists (the foreign key is checked at commit), and the job is
    # inserted only if the key was. One round trip instead of three, and atomic on its own.
    connection = connections[alias]
    run_after_sql, extra_params = _run_after_sql(connection, run_after)
    sql = (
        "WITH k AS (INSERT INTO jobguard_idempotencykey "
        "(key, scope, fingerprint, status, duplicates, expires_at, job_id) "
        "VALUES (%s, %s, %s, 'in_progress', 0, %s, nextval(pg_get_serial_sequence('jobguard_job', 'id'))) "
        "ON CONFLICT (scope, key) DO NOTHING RETURNING job_id) "
        f"INSERT INTO {TABLE} (id, {INSERT_COLUMNS}{', run_after' if run_after_sql else ''}) "
        "SELECT k.job_id, %s::varchar, %s::varchar, %s::jsonb, %s::jsonb, %s::smallint, %s::int, "
        "%s::float8, %s::varchar, %s::varchar, %s::varchar, %s::jsonb, %s::jsonb, %s::bigint, "
        f"{INSERT_CONSTANTS}, '{{}}'::jsonb, "
        f"'[]'::jsonb{run_after_sql} FROM k RETURNING id, run_after, enqueued_at"
    )
    expiry = connection.ops.adapt_datetimefield_value(expires_at)
    params = [row["idempotency_key"], scope, fingerprint, expiry]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *row_values(row), *extra_params])
        result = cursor.fetchone()
    return None if result is None else (result[0], result[1], result[2])


# -- claim ---------------------------------------------------------------------------------

_tuned_connections: weakref.WeakSet[Any] = weakref.WeakSet()


def _tune_for_claims(alias: str) -> None:
    """Keep PostgreSQL on the ordered index walk for claims, whatever its statistics say.

    Statistics lag behind bursts: a table analysed while it held few queued rows makes
    the planner expect a handful of due jobs, so it picks a bitmap scan plus a sort of
    *every* due row (15 ms per claim with 20,000 queued, measured) over the index walk
    that stops after ``batch_size`` rows (0.05 ms). Bitmap scans are never the right plan for
    the claim and reaper queries, so they are turned off for the connection that runs
    them: the worker's main thread, whose connection runs nothing else.

    The statements prepared on that connection (a limited claim's read, see
    ``_skipping_statement``) keep one generic plan: replanning the limited claim's read
    each time would cost more than running it, and PostgreSQL would otherwise keep
    planning it afresh whenever its estimates favour the custom plans.
    """
    connection = connections[alias]
    connection.ensure_connection()
    raw = connection.connection
    if raw in _tuned_connections:
        return
    with connection.cursor() as cursor:
        cursor.execute("SET enable_bitmapscan = off; SET plan_cache_mode = force_generic_plan")
    _tuned_connections.add(raw)


def claim(
    alias: str, queues: Sequence[str] | None, batch_size: int, worker_id: str, exclude: Sequence[str]
) -> list[ClaimedJob]:
    if _pooled(alias):
        # Behind a transaction-mode pooler a session SET would land on whichever server
        # connection served it, and stay there for other clients: scope it to a transaction.
        with transaction.atomic(using=alias):
            with connections[alias].cursor() as cursor:
                cursor.execute("SET LOCAL enable_bitmapscan = off")
            return _claim(alias, queues, batch_size, worker_id, exclude)
    _tune_for_claims(alias)
    return _claim(alias, queues, batch_size, worker_id, exclude)


_DUE = f"status = 'queued' AND run_after <= {NOW} AND attempts < max_attempts"
_ORDER = "ORDER BY priority DESC, run_after, id"


_PAUSED = "SELECT queue_name FROM jobguard_queuestate WHERE paused"


def _picked(queues: Sequence[str] | None, batch_size: int, exclude: Sequence[str]) -> tuple[str, list[Any]]:
    """The SELECT of the rows to claim, and its parameters.

    Each shape walks a partial index on queued rows in claim order and stops after
    ``batch_size`` rows, so its cost depends on neither the backlog nor the finished history.
    (``queue_name = ANY(...)`` would sort every due row instead, hence one LATERAL index
    walk per queue for several queues.) Paused queues are read by the same statement, so a
    pause committed before the claim starts is always seen, and it costs no round trip of
    its own: a paused queue's walk is never started (one queue, several), or its rows are
    skipped over on the one walk (all queues, as for ``exclude``).
    """
    if not queues:
        # A filter on the same index walk: the excluded and the paused queues' rows are skipped over.
        excluded = "AND queue_name <> ALL(%s) " if exclude else ""
        return (
            f"SELECT id FROM {TABLE} WHERE {_DUE} {excluded}AND queue_name NOT IN ({_PAUSED}) {_ORDER} "
            "LIMIT %s FOR UPDATE SKIP LOCKED"
        ), [*([list(exclude)] if exclude else []), batch_size]
    if len(queues) == 1:
        # The paused check does not depend on the row: PostgreSQL runs it once, before the walk.
        return (
            f"SELECT id FROM {TABLE} WHERE queue_name = %s AND {_DUE} "
            f"AND NOT EXISTS ({_PAUSED} AND queue_name = %s) {_ORDER} LIMIT %s FOR UPDATE SKIP LOCKED"
        ), [queues[0], queues[0], batch_size]
    return (
        "SELECT c.id FROM unnest(%s::text[]) AS q(name), LATERAL ("
        f"SELECT id, priority, run_after FROM {TABLE} WHERE queue_name = q.name AND {_DUE} {_ORDER} "
        f"LIMIT %s FOR UPDATE SKIP LOCKED) AS c WHERE q.name NOT IN ({_PAUSED}) "
        "ORDER BY c.priority DESC, c.run_after, c.id LIMIT %s"
    ), [list(queues), batch_size, batch_size]


_CLAIM_UPDATE = (
    f"UPDATE {TABLE} AS j SET status = 'running', attempts = j.attempts + 1, "
    "lease_token = replace(gen_random_uuid()::text, '-', ''), "
    f"lease_expires_at = {NOW} + j.visibility_timeout * interval '1 second', "
    f"started_at = {NOW}, worker_id = %s, attempt_history = {_HISTORY_STARTED} "
    f"FROM picked WHERE j.id = picked.id RETURNING {_RETURNING_J}"
)


# -- the claim's lower bound ------------------------------------------------------------------
#
# A claimed row leaves the claim index's order as a dead entry, which PostgreSQL removes only
# once no snapshot can see the row's old version. While a transaction anywhere in the cluster
# holds the vacuum horizon back, a claim that starts at the head of the index walks every entry
# claimed since (measured: 20,687 buffers and 223 ms a claim, against 692 and 1.9 ms without
# the hold). So a worker's plain claim starts where its last one stopped: per queue (one index
# walk each) and priority, the (run_after, id) of the last row it took; priorities it took
# nothing from are read from their start. A job that becomes claimable behind that point (a
# transaction that enqueued it committed late, a workflow member released, a queue resumed)
# is taken by the next full claim, which starts at the head of the index as before: a worker
# runs one at least every FULL_CLAIM_COST_RATIO times its last one's duration (every few tens
# of milliseconds when nothing holds the horizon), and its first claim is one.

#: A worker's next full claim comes this many times the last one's duration after it ends,
#: so full claims take at most about 1/20 of the claiming thread's time however long they get.
FULL_CLAIM_COST_RATIO = 20
#: Positions (queue, priority) a worker remembers per set of queues, the least recently
#: claimed forgotten first; each is one index walk of the bounded claim.
CLAIM_BOUND_POSITIONS = 16
#: Workers a process remembers positions for (one, outside tests), the oldest forgotten first.
CLAIM_BOUND_WORKERS = 64
_LOWEST_PRIORITY, _HIGHEST_PRIORITY = -32768, 32767
#: The start of a range read from its beginning: no run_after (-infinity) and the lowest id.
_EARLIEST: tuple[None, int] = (None, -(2**63))
#: A claimed row's run_after as the claim returns it for its position: fixed-width UTC text,
#: which sorts as the time does and goes back as a parameter exactly; a datetime would cost a
#: parse per claimed job.
_POSITION_SQL = """to_char(j.run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


@dataclass
class _ClaimBound:
    """Where a worker's plain claims of one set of queues stopped, and when its next full claim is due."""

    #: (queue, or "" for all queues, priority) -> (run_after, id) of the last row claimed there,
    #: run_after as :data:`_POSITION_SQL` writes it.
    positions: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    #: ``time.monotonic()`` from which the next claim is a full one.
    full_due_at: float = 0.0

    def ranges(self, queue: str) -> list[tuple[str, int, int, str | None, int]]:
        """The claim index ranges of ``queue`` in claim order: (queue, lowest and highest priority, start)."""
        found: list[tuple[str, int, int, str | None, int]] = []
        above = _HIGHEST_PRIORITY
        for priority in sorted((p for q, p in self.positions if q == queue), reverse=True):
            if priority < above:
                found.append((queue, priority + 1, above, *_EARLIEST))
            found.append((queue, priority, priority, *self.positions[queue, priority]))
            above = priority - 1
        if above >= _LOWEST_PRIORITY:
            found.append((queue, _LOWEST_PRIORITY, above, *_EARLIEST))
        return found

    def advance(self, claimed: Sequence[tuple[str, int, str, int]]) -> None:
        """Remember the last row claimed per (queue, priority), even if behind where it was."""
        last: dict[tuple[str, int], tuple[str, int]] = {}
        for queue, priority, run_after, job_id in claimed:
            last[queue, priority] = max(last.get((queue, priority), (run_after, job_id)), (run_after, job_id))
        for position, start in last.items():
            self.positions.pop(position, None)  # to the end: the most recently claimed
            self.positions[position] = start
        while len(self.positions) > CLAIM_BOUND_POSITIONS:
            del self.positions[next(iter(self.positions))]


_claim_bounds: dict[tuple[str, str, tuple[str, ...] | None], _ClaimBound] = {}
_claim_bounds_lock = threading.Lock()


def forget_claim_bounds() -> None:
    """Make every worker's next plain claim in this process a full one."""
    with _claim_bounds_lock:
        _claim_bounds.clear()


def _bounded(
    bound: _ClaimBound, queues: Sequence[str] | None, batch_size: int, exclude: Sequence[str]
) -> tuple[str, list[Any]]:
    """The SELECT of the rows to claim from where the last claims stopped, and its parameters.

    One index walk per range of :meth:`_ClaimBound.ranges`, merged in claim order; each starts
    at its range's start, so none passes the entries the worker's earlier claims left.
    """
    ranges = [r for queue in (queues or [""]) for r in bound.ranges(queue)]
    columns = [list(column) for column in zip(*ranges, strict=True)]
    within = "priority BETWEEN b.lo AND b.hi AND (run_after, id) >= (coalesce(b.r, '-infinity'), b.i)"
    if not queues:
        excluded = "AND queue_name <> ALL(%s) " if exclude else ""
        return (
            "SELECT c.id FROM unnest(%s::int[], %s::int[], %s::timestamptz[], %s::bigint[]) "
            f"AS b(lo, hi, r, i), LATERAL (SELECT id, priority, run_after FROM {TABLE} "
            f"WHERE {_DUE} AND {within} {excluded}AND queue_name NOT IN ({_PAUSED}) "
            f"{_ORDER} LIMIT %s FOR UPDATE SKIP LOCKED) AS c "
            "ORDER BY c.priority DESC, c.run_after, c.id LIMIT %s"
        ), [*columns[1:], *([list(exclude)] if exclude else []), batch_size, batch_size]
    return (
        "SELECT c.id FROM unnest(%s::text[], %s::int[], %s::int[], %s::timestamptz[], %s::bigint[]) "
        f"AS b(q, lo, hi, r, i), LATERAL (SELECT id, priority, run_after FROM {TABLE} WHERE queue_name = b.q "
        f"AND {_DUE} AND {within} {_ORDER} LIMIT %s FOR UPDATE SKIP LOCKED) AS c "
        f"WHERE b.q NOT IN ({_PAUSED}) ORDER BY c.priority DESC, c.run_after, c.id LIMIT %s"
    ), [*columns, batch_size, batch_size]


def claim_statement(
    alias: str, queues: Sequence[str] | None, batch_size: int, worker_id: str, exclude: Sequence[str]
) -> tuple[str, list[Any], bool]:
    """The SELECT the worker's next plain claim of ``queues`` would lock its rows with, its
    parameters, and whether it is a full claim (for the tests that look at its plan)."""
    key = (alias, worker_id, tuple(queues) if queues else None)
    with _claim_bounds_lock:
        bound = _claim_bounds.get(key)
        if bound is None or not bound.positions or time.monotonic() >= bound.full_due_at:
            return (*_picked(queues, batch_size, exclude), True)
        return (*_bounded(bound, queues, batch_size, exclude), False)


def _claim(
    alias: str, queues: Sequence[str] | None, batch_size: int, worker_id: str, exclude: Sequence[str]
) -> list[ClaimedJob]:
    picked, params, full = claim_statement(alias, queues, batch_size, worker_id, exclude)
    started = time.monotonic()
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"WITH picked AS ({picked}) {_CLAIM_UPDATE}, {_POSITION_SQL}", [*params, worker_id, worker_id]
        )
        rows = cursor.fetchall()
    ended = time.monotonic()
    with _claim_bounds_lock:
        key = (alias, worker_id, tuple(queues) if queues else None)
        bound = _claim_bounds.pop(key, None) or _ClaimBound()
        _claim_bounds[key] = bound  # to the end: the most recently claiming worker
        while len(_claim_bounds) > CLAIM_BOUND_WORKERS:
            del _claim_bounds[next(iter(_claim_bounds))]
        if full:
            bound.full_due_at = ended + FULL_CLAIM_COST_RATIO * (ended - started)
        # row[2] is the queue, row[5] the priority, the last column the run_after.
        bound.advance([(row[2] if queues else "", row[5], row[-1], row[0]) for row in rows])
    return [ClaimedJob.from_row(row[:-1]) for row in rows]


# -- flow control ----------------------------------------------------------------------------

#: The queue condition of a limited claim's reads on a queue column, by shape: ``one`` queue,
#: ``many`` (the claim-order read walks one index per queue and merges them), ``all`` but the
#: queues of an array, or ``any`` queue (which the claim-order read leaves unsaid).
_IN_QUEUES = {"one": "= %s", "many": "= ANY(%s::text[])", "all": "<> ALL(%s::text[])", "any": "IS NOT NULL"}
#: The columns a limited claim reads of its candidates over three round trips.
_WALKED = ("id", "task_name", "queue_name", "flow_keys", "attempts")


def _in_claim_order(shape: str, columns: Sequence[str], conditions: str, rows: int, lock: str = "") -> str:
    """A read of the ``columns`` of the rows meeting ``conditions``, in claim order, that stops
    after ``rows`` rows: one ordered index walk, or one per queue for ``many``, merged.

    Its queue parameter (none for ``any``) comes before those of ``conditions``.
    """
    if shape == "many":
        # The merge orders by the claim-order columns, so each walk returns them too.
        walked = [*columns, *(name for name in ("priority", "run_after", "id") if name not in columns)]
        return (
            f"SELECT {', '.join(f'c.{name}' for name in columns)} FROM unnest(%s::text[]) AS q(name), "
            f"LATERAL (SELECT {', '.join(walked)} FROM {TABLE} WHERE queue_name = q.name AND {conditions} "
            f"{_ORDER} LIMIT {rows:d}{lock}) AS c "
            f"ORDER BY c.priority DESC, c.run_after, c.id LIMIT {rows:d}"
        )
    # Over any queue the walk reads the claim index with no queue condition at all.
    in_queues = "" if shape == "any" else f"queue_name {_IN_QUEUES[shape]}"
    where = " AND ".join(filter(None, [in_queues, conditions]))
    return f"SELECT {', '.join(columns)} FROM {TABLE} WHERE {where} {_ORDER} LIMIT {rows:d}{lock}"


#: The advisory lock the fleet's limited claims take turns on (any fixed number; "jgfl").
FLOW_LOCK_ID = 0x6A67666C


_LEASE = f"WITH picked AS (SELECT unnest(%s::bigint[]) AS id) {_CLAIM_UPDATE}"


def _turn_in_sql(connection: Any, plan: FlowPlan) -> bool:
    """Whether a limited claim's turn may begin and end in the SQL strings it sends, rather
    than in a Django atomic block (``connection`` is Django's, connected).

    Not under a breaker or a retry budget: their writes go through the ORM, whose
    ``on_commit`` hooks must wait for the COMMIT, and outside an atomic block Django would run
    them at once. Not inside a caller's transaction, which the turn must not end. And only
    with client-side binding, whose simple-query protocol takes several statements in one
    string.
    """
    return (
        not plan.guards
        and not connection.in_atomic_block
        and connection.get_autocommit()
        and _binds_on_client(connection)
    )


class _FlowSQL(flow_sql.ConflictUpserts, flow_sql.SequentialTurn):
    """The limited claim's statements on PostgreSQL (see ``store/flow_sql.py``)."""

    def take_turn(self, alias: str, cursor: Any) -> None:
        # Held to the transaction's end: the next limited claim counts this one's leases.
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [FLOW_LOCK_ID])

    @contextlib.contextmanager
    def turn(self, alias: str, plan: FlowPlan) -> Iterator[flow_sql.TurnScope]:
        connection = connections[alias]
        connection.ensure_connection()
        if not _turn_in_sql(connection, plan):
            with transaction.atomic(using=alias):
                yield flow_sql.TurnScope()
            return
        # The BEGIN travels with the turn's first string and the COMMIT with its last: a
        # round trip less each, where Django's atomic block would send them on their own.
        scope = flow_sql.TurnScope(in_sql=True)
        try:
            yield scope
        except BaseException:
            if scope.begun and not scope.committed:
                with contextlib.suppress(DatabaseError, InterfaceError), connection.cursor() as cursor:
                    cursor.execute("ROLLBACK")
            raise
        if scope.begun and not scope.committed:
            with connection.cursor() as cursor:
                cursor.execute("COMMIT")

    def open_turn(
        self, alias: str, cursor: Any, plan: FlowPlan, scope: flow_sql.TurnScope
    ) -> flow_sql.Opening:
        if not _simple_query(cursor):
            return super().open_turn(alias, cursor, plan, scope)
        # One round trip for the turn and its reads: the fleet's limited claims wait for this turn,
        # so each round trip inside it is paid by every claim queued behind it. The clock is
        # read after the lock (statement_timestamp() would be the time the string arrived).
        begin = ""
        if scope.in_sql:
            begin, scope.begun = "BEGIN; ", True
        running_sql, params = flow_sql.running_statement(plan)
        gates_sql = ""
        if plan.guards:
            gates_sql, gates_params = flow_sql.gates_statement(plan)
            gates_sql, params = f"; {gates_sql}", [*params, *gates_params]
        cursor.execute(
            f"{begin}SELECT pg_advisory_xact_lock({FLOW_LOCK_ID}); {_PAUSED}; {running_sql}; "
            "WITH clock AS (SELECT extract(epoch from clock_timestamp())::float8 AS now) "
            f"SELECT clock.now, r.key, r.tat FROM clock "
            f"LEFT JOIN {flow_sql.RATE_TABLE} AS r ON r.tat > clock.now{gates_sql}",
            params,
        )
        if begin:
            cursor.nextset()
        cursor.nextset()
        paused = {name for (name,) in cursor.fetchall()}
        cursor.nextset()
        running = list(cursor.fetchall())
        cursor.nextset()
        rows = cursor.fetchall()
        arrivals = {key: float(tat) for _, key, tat in rows if key is not None}
        breakers: list[Sequence[Any]] = []
        if gates_sql:
            cursor.nextset()
            breakers = list(cursor.fetchall())
        return flow_sql.Opening(paused, running, float(rows[0][0]), arrivals, breakers)

    def now_seconds(self, alias: str, cursor: Any) -> float:
        cursor.execute(f"SELECT extract(epoch from {NOW})::float8", [])
        return float(cursor.fetchone()[0])

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
        # The shapes of the plain claim (_picked): one index walk per queue, in claim order,
        # stopping after `count` rows; the full keys' rows are skipped over on the walk.
        where = [_DUE]
        params: list[Any] = []
        if blocked_tasks:
            where.append("task_name <> ALL(%s)")
            params.append(list(blocked_tasks))
        if blocked_keys:
            where.append("NOT (flow_keys ?| %s::text[])")
            params.append(list(blocked_keys))
        if blocked_retries:
            # A spent retry budget: that dependency's first attempts still start.
            where.append("(attempts = 0 OR task_name <> ALL(%s))")
            params.append(list(blocked_retries))
        filters, filter_params = " AND ".join(where), list(params)
        if queues:
            form, queue_params = ("many", [list(queues)]) if len(queues) > 1 else ("one", [queues[0]])
        elif exclude:
            form, queue_params = "all", [list(exclude)]
        else:
            form, queue_params = "any", []
        walk = _in_claim_order(form, _WALKED, filters, count, " FOR UPDATE SKIP LOCKED")
        walk_params = [*queue_params, *filter_params]
        if not (blocked_keys or watched) or Statement.sends_text(alias, cursor):
            # Sent as text (a pooler, server-side binding), the statement below would be
            # planned on every claim, which costs more than the walk saves unless a key is hot.
            cursor.execute(walk, walk_params)
            return list(cursor.fetchall())
        ahead = _in_claim_order(form, ["flow_keys"], _DUE, HOT_WINDOW)
        statement = _skipping_statement(
            ahead, walk, filters, _IN_QUEUES[form], count, min(per_key or count, count)
        )
        statement.execute(
            alias,
            cursor,
            [
                [*blocked_keys, *watched],
                *queue_params,
                *filter_params,
                list(blocked_keys),
                *queue_params,
                *walk_params,
            ],
        )
        return list(cursor.fetchall())

    def lease(self, alias: str, cursor: Any, ids: Sequence[int], worker_id: str) -> list[ClaimedJob]:
        cursor.execute(_LEASE, [list(ids), worker_id, worker_id])
        return [ClaimedJob.from_row(row) for row in cursor.fetchall()]

    def close_turn(
        self,
        alias: str,
        cursor: Any,
        ids: Sequence[int],
        worker_id: str,
        arrivals: Mapping[str, float],
        scope: flow_sql.TurnScope,
    ) -> list[ClaimedJob]:
        connection = connections[alias]
        if not _simple_query(cursor):
            return super().close_turn(alias, cursor, ids, worker_id, arrivals, scope)
        # The lease, the arrival times and the COMMIT in one string, as the ack sends its
        # COMMIT: the turn ends one round trip sooner for every claim waiting on it. Django's
        # commit on leaving the block then finds no transaction open and sends nothing.
        statements, params = [_LEASE], [list(ids), worker_id, worker_id]
        if arrivals:
            upsert, upsert_params = flow_sql.upsert_rates_statement(arrivals)
            statements.append(upsert)
            params += upsert_params
        commit = scope.begun or _commits_here(connection, cursor)
        if commit:
            statements.append("COMMIT")
        cursor.execute("; ".join(statements), params)
        scope.committed = commit
        return [ClaimedJob.from_row(row) for row in cursor.fetchall()]


FLOW_SQL = _FlowSQL()

#: A limited claim looks at the first this many due jobs in claim order: when at least half
#: of them belong to full keys (or to keys it watches), it looks for the other keys' jobs key
#: by key (jobguard_job_flowkey_idx) instead of reading past them. One key with 10,000 jobs
#: queued ahead of the others cost each claim 1.5 to 3 ms of reading.
HOT_WINDOW = 64
#: ... as long as few (key, queue) pairs have queued jobs: each costs two index descents, so
#: past this many the walk key by key would cost more than the rows it skips.
SKIP_SCAN_PAIRS = 64
#: A job's first flow key as jobguard_job_flowkey_idx indexes it ('' for a job without one).
_FIRST_KEY = "coalesce(flow_keys->>0, '')"
#: The distinct (first key, queue) pairs with queued jobs, one index descent each, up to
#: SKIP_SCAN_PAIRS + 1 of them, walked only when the CTE ``hot`` has a row.
_PAIRS = (
    "pairs (k, q, n) AS ("
    f"(SELECT {_FIRST_KEY}, queue_name, 1 FROM {TABLE} WHERE status = 'queued' "
    "AND EXISTS (SELECT 1 FROM hot) ORDER BY 1, 2 LIMIT 1) "
    "UNION ALL SELECT nx.k, nx.q, p.n + 1 FROM pairs AS p, LATERAL ("
    f"SELECT {_FIRST_KEY} AS k, queue_name AS q FROM {TABLE} WHERE status = 'queued' "
    f"AND ({_FIRST_KEY}, queue_name) > (p.k, p.q) ORDER BY 1, 2 LIMIT 1) AS nx "
    f"WHERE p.n <= {SKIP_SCAN_PAIRS:d})"
)


def _key_by_key(
    columns: Sequence[str], filters: str, count: int, per_key: int, keep: str, lock: str = ""
) -> str:
    """The candidates read key by key: the first due jobs of each pair of ``pairs`` that
    ``keep`` keeps (a key can start no more than ``per_key`` in one claim; the jobs without
    a key, up to ``count``), and the first ``count`` of them all in claim order.

    A pair's jobs are read by a range on the key index's leading columns, in that index's
    own order, which no other index can give without sorting.
    """
    pair = f"({_FIRST_KEY}, queue_name)"
    return (
        f"SELECT c.* FROM pairs AS p, LATERAL (SELECT {', '.join(columns)} FROM {TABLE} "
        f"WHERE {pair} >= (p.k, p.q) AND {pair} <= (p.k, p.q) AND {filters} "
        f"ORDER BY {_FIRST_KEY}, queue_name, priority DESC, run_after, id "
        f"LIMIT CASE WHEN p.k = '' THEN {count:d} ELSE {per_key:d} END{lock}) AS c "
        f"WHERE {keep} ORDER BY c.priority DESC, c.run_after, c.id LIMIT {count:d}"
    )


@functools.lru_cache(maxsize=256)
def _skipping_statement(
    ahead: str, walk: str, filters: str, in_queues: str, count: int, per_key: int
) -> Statement:
    """The candidates read when some key is full or watched: key by key if they crowd the queue.

    ``hot`` counts how many of the first HOT_WINDOW due jobs (``ahead``, in claim order)
    belong to the full keys or to the watched ones (keys with room that recently filled up
    within a claim); from half of them on, ``pairs`` walks the distinct (first key, queue)
    pairs with queued jobs, one index descent each, up to SKIP_SCAN_PAIRS + 1 of them; each
    pair of a key that is not full gives its first ``per_key`` due jobs (a key can start no
    more in one claim), and the head of all of them in claim order is the answer. Otherwise
    (the queue is not crowded, or too many pairs), ``walk``: the read in claim order.
    One-time filters decide which of the two runs, so one round trip serves both.

    The statement is prepared with a generic plan, since planning it costs more than running
    it, so each read is written so that one index serves it whatever the statistics say: the
    counts are literals (a LIMIT parameter makes the planner expect a large share of the
    rows), and the pairs' reads are :func:`_key_by_key`'s ranges.
    """
    walked = ", ".join(_WALKED)
    by_key = _key_by_key(
        _CANDIDATE_COLUMNS,
        filters,
        count,
        per_key,
        f"(SELECT fits FROM fits) AND p.k <> ALL(%s::text[]) AND p.q {in_queues}",
        " FOR UPDATE SKIP LOCKED",
    )
    return Statement(
        "WITH RECURSIVE hot AS MATERIALIZED ("
        "SELECT 1 WHERE (SELECT count(*) FILTER (WHERE flow_keys ?| %s::text[]) "
        f"FROM ({ahead}) AS a) >= {HOT_WINDOW // 2:d}), "
        f"{_PAIRS}, "
        f"fits AS MATERIALIZED (SELECT count(*) <= {SKIP_SCAN_PAIRS:d} AS fits FROM pairs) "
        f"SELECT {walked} FROM ({by_key}) AS by_key "
        f"UNION ALL SELECT {walked} FROM ({walk}) AS in_order "
        "WHERE NOT EXISTS (SELECT 1 FROM hot) OR NOT (SELECT fits FROM fits)"
    )


# -- the limited claim in one string -------------------------------------------------------

_CANDIDATE_COLUMNS = (*_WALKED, "priority", "run_after")
#: Due jobs a one-string claim reads per job it may take (``admission.CANDIDATES_PER_JOB`` for the
#: claim over three round trips): reading and admitting them is most of the turn's time, and
#: a key that fills up and hides the rest is read around by the next turn (the refill, then
#: the watched keys). With four per job the keyed benchmark kept 76 % of the unlimited rate,
#: with two 87 % (medians of 3 runs).
ONE_STRING_CANDIDATES_PER_JOB = 2
#: The lease of the jobs a one-string claim admitted. Its candidates are read without row
#: locks (locking every candidate, four per job taken, cost more than the read), so a job
#: another claim leased meanwhile is left out here: the update waits for that claim's
#: commit and finds the job no longer queued. The status is compared with ``picked``'s
#: column, not a constant: ``status = 'queued'`` would let the generic plan walk a partial
#: index of every queued job and join ``picked`` to each (170 ms with 6,000 queued).
_LEASE_IF_QUEUED = _CLAIM_UPDATE.replace(
    "WHERE j.id = picked.id",
    "WHERE j.id = picked.id AND j.status = picked.status "
    f"AND j.run_after <= {NOW} AND j.attempts < j.max_attempts",
)


#: What a one-string claim says of its turn, after each row's job columns (on one row only).
_SUMMARY = ("now", "held", "filled", "times", "candidates", "unreadable")
#: The leased jobs whose stored flow keys are not a JSON array of strings, as ``{id: flow_keys}``
#: (NULL when none): counted under none of them (see :func:`_keys_of`), and marked for the
#: worker, which dead-letters them (``flow.stored_flow_keys``).
_UNREADABLE = (
    "(SELECT jsonb_object_agg(c.id::text, c.flow_keys) FROM candidates AS c "
    "WHERE c.id IN (SELECT id FROM leased) AND CASE WHEN jsonb_typeof(c.flow_keys) = 'array' "
    "THEN EXISTS (SELECT 1 FROM jsonb_array_elements(c.flow_keys) AS e(v) "
    "WHERE jsonb_typeof(e.v) <> 'string') "
    "ELSE true END)"
)


def _family(key: str) -> str:
    """SQL for the limit a key belongs to (see :func:`~django_jobguard.flow.family`)."""
    return f"(CASE WHEN left({key}, 2) IN ('c:', 'r:') THEN split_part({key}, '|', 1) ELSE {key} END)"


def _keys_of(rows: str) -> str:
    """SQL for the limit keys of each row of ``rows`` (a relation with ``ord``, ``flow_keys``,
    ``task_name`` and ``queue_name``): ``(ord, key, cap, step, tolerance)``, one row per key.

    A row counts under its stored keys, its task's unkeyed limits and its queue's
    concurrency; keys no limit declares any longer are left out (as ``FlowPlan`` does).
    """
    return (
        "SELECT k.ord, k.key, l.cap, l.step, l.tolerance FROM ("
        # Stored keys that are not an array (written by hand, or by an older release) are no
        # keys here, rather than an error that would fail every limited claim of the queue:
        # the job is leased, and the worker dead-letters it (see _UNREADABLE).
        f"SELECT r.ord, e.key FROM {rows} AS r, jsonb_array_elements_text("
        "CASE WHEN jsonb_typeof(r.flow_keys) = 'array' THEN r.flow_keys END) AS e(key) "
        f"UNION ALL SELECT r.ord, t.key FROM {rows} AS r JOIN task_limits AS t ON t.task = r.task_name "
        f"UNION ALL SELECT r.ord, 'queue:' || r.queue_name FROM {rows} AS r "
        "WHERE r.queue_name = ANY((SELECT queues FROM plan)::text[])) AS k "
        f"JOIN limits AS l ON l.family = {_family('k.key')}"
    )


@functools.lru_cache(maxsize=64)
def _one_string_sql(shape: str, count: int, per_key: int) -> str:
    """The limited claim without breakers as one statement (after its turn's lock).

    ``shape``: ``one`` queue (a parameter), ``many`` (an array), or ``all`` but an array of
    excluded ones. Its parameters, in order: the plan's unkeyed keys per task (jsonb), its
    queues with a concurrency, its limited tasks, its limits (jsonb: ``[concurrency, interval,
    tolerance]`` per limit), the watched keys, how many jobs to take, the queue parameter
    (once for the look ahead, once for the pairs, once for the walk), and the worker id twice.

    What ``flow_sql.claim_limited`` does, in its order: the clock after the lock, the paused
    queues, the running jobs per concurrency key and the rate keys ahead of the clock, so
    the keys already full; the candidates in claim order (key by key beside full or watched
    keys, as ``_skipping_statement`` reads them) without the full keys' jobs; which of them
    each key has room for; the lease of those admitted and the rate keys' new arrival times.
    Each row is a leased job's columns (or none), and one of them also says what held jobs back.
    """
    # Conditions the planner cannot read as selective, so that its generic plan keeps the
    # ordered index walk that stops after `count` rows. `queue_name <> ALL(...)` would be
    # read through the column's statistics: with one queue in the table, as never true, and
    # the plan would sort every due row instead (80 ms with 20,000 queued).
    filters = (
        f"{_DUE} AND NOT ((SELECT queues FROM closed)::text[] @> ARRAY[queue_name::text]) "
        "AND NOT ((SELECT tasks FROM closed)::text[] @> ARRAY[task_name::text]) "
        "AND NOT (flow_keys ?| (SELECT keys FROM blocked)::text[])"
    )

    candidate_columns = ", ".join(_CANDIDATE_COLUMNS)
    by_key = _key_by_key(
        _CANDIDATE_COLUMNS,
        filters,
        count,
        per_key,
        "(SELECT fits FROM fits) AND p.k <> ALL((SELECT keys FROM blocked)::text[]) "
        f"AND p.q {_IN_QUEUES[shape]}",
    )
    epsilon = repr(admission.EPSILON)
    leased_columns = ", ".join(f"l.{column}" for column in RETURNING.split(", "))
    summary = ", ".join(f"CASE WHEN coalesce(l.n = 1, true) THEN s.{column} END" for column in _SUMMARY)
    return (
        "WITH RECURSIVE plan AS MATERIALIZED (SELECT %s::jsonb AS task_keys, %s::text[] AS queues, "
        "%s::text[] AS tasks, %s::jsonb AS limits, %s::text[] AS watched, %s::int AS wanted, "
        "extract(epoch FROM clock_timestamp())::float8 AS now), "
        "limits AS MATERIALIZED (SELECT l.key AS family, (l.value ->> 0)::int AS cap, "
        "(l.value ->> 1)::float8 AS step, (l.value ->> 2)::float8 AS tolerance "
        "FROM jsonb_each((SELECT limits FROM plan)) AS l), "
        "task_limits AS MATERIALIZED (SELECT t.key AS task, k.key "
        "FROM jsonb_each((SELECT task_keys FROM plan)) AS t, jsonb_array_elements_text(t.value) AS k(key)), "
        "paused AS MATERIALIZED (SELECT coalesce(array_agg(queue_name::text), '{}') AS names "
        f"FROM ({_PAUSED}) AS p), "
        f"running_rows AS MATERIALIZED (SELECT id AS ord, flow_keys, task_name, queue_name FROM {TABLE} "
        "WHERE status = 'running' AND (task_name = ANY((SELECT tasks FROM plan)::text[]) "
        "OR queue_name = ANY((SELECT queues FROM plan)::text[]))), "
        f"running AS MATERIALIZED (SELECT k.key, k.cap, count(*)::int AS n FROM ({_keys_of('running_rows')}) "
        "AS k WHERE k.cap IS NOT NULL GROUP BY k.key, k.cap), "
        f"arrivals AS MATERIALIZED (SELECT r.key, r.tat, l.tolerance FROM {flow_sql.RATE_TABLE} AS r "
        f"JOIN limits AS l ON l.family = {_family('r.key')} "
        "WHERE r.tat > (SELECT now FROM plan) AND l.step IS NOT NULL), "
        "blocked AS MATERIALIZED (SELECT coalesce(array_agg(key), '{}') AS keys FROM ("
        "SELECT key FROM running WHERE n >= cap UNION ALL SELECT key FROM arrivals "
        f"WHERE tat - (SELECT now FROM plan) > tolerance + {epsilon}) AS full_keys), "
        # What the full keys close: the tasks with a full unkeyed limit, the paused queues and
        # those with a full concurrency.
        "closed AS MATERIALIZED (SELECT (SELECT coalesce(array_agg(DISTINCT t.task), '{}') "
        "FROM task_limits AS t WHERE t.key = ANY((SELECT keys FROM blocked)::text[])) AS tasks, "
        "(SELECT names FROM paused) || (SELECT coalesce(array_agg(substr(k.key, 7)), '{}') "
        "FROM unnest((SELECT keys FROM blocked)::text[]) AS k(key) "
        "WHERE left(k.key, 6) = 'queue:') AS queues), "
        "hot AS MATERIALIZED (SELECT 1 WHERE (SELECT count(*) FILTER (WHERE flow_keys ?| "
        "((SELECT keys FROM blocked) || (SELECT watched FROM plan))) "
        f"FROM ({_in_claim_order(shape, ['flow_keys'], _DUE, HOT_WINDOW)}) AS a) "
        f">= {HOT_WINDOW // 2:d}), "
        f"{_PAIRS}, "
        f"fits AS MATERIALIZED (SELECT count(*) <= {SKIP_SCAN_PAIRS:d} AS fits FROM pairs), "
        # Read only when the key-by-key read is not (its scan is what starts it).
        f"in_order AS MATERIALIZED ({_in_claim_order(shape, _CANDIDATE_COLUMNS, filters, count)}), "
        "candidates AS MATERIALIZED (SELECT row_number() OVER (ORDER BY c.priority DESC, c.run_after, c.id) "
        "AS ord, c.id, c.flow_keys, c.task_name, c.queue_name FROM ("
        f"SELECT {candidate_columns} FROM ({by_key}) AS by_key "
        f"UNION ALL SELECT {candidate_columns} FROM in_order "
        "WHERE NOT EXISTS (SELECT 1 FROM hot) OR NOT (SELECT fits FROM fits)) AS c), "
        # Each candidate's keys with their room: a concurrency's free slots; a rate's starts
        # due by now within its burst (GCRA: one per interval after its arrival time, up to
        # the tolerance ahead of the clock).
        "keyed AS MATERIALIZED (SELECT k.ord, k.key, k.cap, k.step, "
        "greatest(coalesce(a.tat, p.now), p.now) AS at, CASE WHEN k.cap IS NOT NULL "
        "THEN k.cap - coalesce(r.n, 0) "
        f"WHEN greatest(coalesce(a.tat, p.now), p.now) - p.now > k.tolerance + {epsilon} THEN 0 "
        f"ELSE floor((k.tolerance + {epsilon} - (greatest(coalesce(a.tat, p.now), p.now) - p.now)) "
        f"/ k.step)::int + 1 END AS room FROM ({_keys_of('candidates')}) AS k CROSS JOIN plan AS p "
        "LEFT JOIN running AS r ON r.key = k.key LEFT JOIN arrivals AS a ON a.key = k.key), "
        # A job is admitted when, for each of its keys, the jobs ahead of it in claim order
        # under that key leave room. Counting every job ahead, admitted or not, never admits
        # too many; for jobs under one key each it is exactly the one-by-one walk of
        # flow_sql.claim_limited. Where jobs share a second limit, a job held back by its own key
        # still counts against the shared one, so the claim may take fewer than it could:
        # the key that filled up is then full from the start of the next turn.
        "admission AS MATERIALIZED (SELECT ord, bool_and(rank <= room) AS admitted FROM ("
        "SELECT ord, room, row_number() OVER (PARTITION BY key ORDER BY ord) AS rank FROM keyed) AS ranked "
        "GROUP BY ord), "
        "picked AS MATERIALIZED (SELECT c.id, c.ord, 'queued'::text AS status FROM candidates AS c "
        "LEFT JOIN admission AS a ON a.ord = c.ord WHERE a.admitted IS NOT FALSE "
        "ORDER BY c.ord LIMIT (SELECT wanted FROM plan)), "
        f"leased AS ({_LEASE_IF_QUEUED}), "
        "taken AS MATERIALIZED (SELECT k.key, count(*) AS n, min(k.at) AS at, min(k.step) AS step, "
        "bool_and(k.cap IS NULL) AS rate FROM keyed AS k JOIN picked AS p ON p.ord = k.ord "
        "WHERE p.id IN (SELECT id FROM leased) GROUP BY k.key), "
        f"advanced AS (INSERT INTO {flow_sql.RATE_TABLE} (key, tat) SELECT key, at + n * step FROM taken "
        # A key the column cannot hold keeps no rate state (see flow_sql.claim_limited).
        f"WHERE rate AND length(key) <= {MAX_STORED_RATE_KEY_LENGTH:d} "
        "ON CONFLICT (key) DO UPDATE SET tat = excluded.tat RETURNING key, tat) "
        # What held jobs back: the keys full from the start; the keys this claim filled while
        # some of their jobs were left; and each rate key's arrival time as it now stands.
        # It rides on one row only: on every leased row, its arrays were most of what the
        # worker's driver parsed of a claim.
        f"SELECT {leased_columns}, {summary} FROM (SELECT (SELECT now FROM plan) AS now, "
        "(SELECT keys FROM blocked) AS held, "
        "(SELECT array_agg(DISTINCT k.key) FROM keyed AS k LEFT JOIN taken AS t ON t.key = k.key "
        "WHERE coalesce(t.n, 0) >= k.room AND k.ord NOT IN (SELECT ord FROM picked) "
        "AND (k.ord < (SELECT max(ord) FROM picked) "
        "OR (SELECT count(*) FROM picked) < (SELECT wanted FROM plan))) AS filled, "
        "(SELECT jsonb_object_agg(key, tat) FROM (SELECT key, max(tat) AS tat FROM ("
        "SELECT key, tat FROM arrivals UNION ALL SELECT key, tat FROM advanced) AS x GROUP BY key) AS y) "
        f"AS times, (SELECT count(*) FROM candidates) AS candidates, {_UNREADABLE} AS unreadable) AS s "
        "LEFT JOIN (SELECT *, row_number() OVER () AS n FROM leased) AS l ON true"
    )


@functools.lru_cache(maxsize=64)
def _one_string_statement(shape: str, count: int, per_key: int) -> Statement:
    return Statement(_one_string_sql(shape, count, per_key))


def _plan_parameters(plan: FlowPlan) -> list[Any]:
    """The plan as :func:`_one_string_sql` reads it: the unkeyed keys per task, the limited
    queues and tasks, and each limit as ``[concurrency, interval, tolerance]``."""
    limits: dict[str, list[float | None]] = {
        **{key: [n, None, None] for key, n in plan.capacities.items()},
        **{f"c:{task}": [n, None, None] for task, n in plan.keyed_capacity.items()},
        **{key: [None, rate.interval, rate.tolerance] for key, rate in plan.rates.items()},
        **{f"r:{task}": [None, rate.interval, rate.tolerance] for task, rate in plan.keyed_rates.items()},
    }
    return [
        json.dumps({task: list(keys) for task, keys in plan.task_keys.items()}),
        plan.limited_queues,
        plan.limited_tasks,
        json.dumps(limits),
    ]


def _claims_in_one_string(alias: str, plan: FlowPlan) -> bool:
    """Whether a limited claim (not behind a pooler: see :func:`claim_limited`) may be one
    string, the turn's lock and then one statement: when its turn may be carried in SQL
    (:func:`_turn_in_sql`), since the string's implicit transaction is what ends the turn."""
    return _turn_in_sql(connections[alias], plan)


def _claim_in_one_string(
    alias: str,
    queues: Sequence[str] | None,
    batch_size: int,
    worker_id: str,
    exclude: Sequence[str],
    plan: FlowPlan,
    throttle: Throttle | None,
) -> list[ClaimedJob]:
    """The limited claim as one round trip: what ``flow_sql.claim_limited`` does, in SQL.

    The lock and the statement share one string, so they share its implicit transaction:
    the turn is held until the leases and rate keys it wrote are committed, and the
    statement's snapshot is taken once the lock is granted. When a key fills up within the
    claim and its jobs took the room the claim read, the claim takes another turn (up to
    REFILL_PASSES), which finds that key full from the start.
    """
    if queues:
        queues = [name for name in queues if name not in exclude]
        if not queues:
            return []
        shape, queue_parameter = ("one", queues[0]) if len(queues) == 1 else ("many", list(queues))
    else:
        shape, queue_parameter = "all", list(exclude)
    planned = _plan_parameters(plan)
    jobs: list[ClaimedJob] = []
    held: set[str] = set()
    now, arrivals = 0.0, {}
    for _ in range(1 + admission.REFILL_PASSES):
        wanted = batch_size - len(jobs)
        # The candidates' count is a literal of the prepared statement (see
        # _skipping_statement), so it comes in steps of eight jobs: each size is planned once
        # per connection.
        count = -(-wanted // 8) * 8 * ONE_STRING_CANDIDATES_PER_JOB + admission.CANDIDATES_EXTRA
        statement = _one_string_statement(shape, count, min(plan.most_per_key or count, count))
        watched = admission.hot_keys.recent(time.monotonic())
        with connections[alias].cursor() as cursor:
            statement.execute(
                alias,
                cursor,
                [*planned, watched, wanted, *[queue_parameter] * 3, worker_id, worker_id],
                before=f"SELECT pg_advisory_xact_lock({FLOW_LOCK_ID}); ",
            )
            cursor.nextset()
            rows = cursor.fetchall()
        width = len(rows[0]) - len(_SUMMARY)
        jobs += [ClaimedJob.from_row(row[:width]) for row in rows if row[0] is not None]
        # The summary is on one row (the clock is never NULL there).
        now, blocked, refused, times, candidates, unreadable = next(
            row[width:] for row in rows if row[width] is not None
        )
        if unreadable is not None:
            found = json.loads(unreadable) if isinstance(unreadable, str | bytes) else unreadable
            flow_sql.mark_unreadable(
                jobs, {int(job_id): json.dumps(value) for job_id, value in found.items()}
            )
        filled = set(refused or ()) - set(blocked or ())
        if filled:
            admission.hot_keys.note(filled, time.monotonic())
        held.update(blocked or (), refused or ())
        times = json.loads(times) if isinstance(times, str | bytes) else times or {}
        arrivals = {key: float(value) for key, value in times.items() if plan.rate(key) is not None}
        if len(jobs) >= batch_size or not filled or candidates < count:
            break
    if throttle is not None:
        throttle.breaker_changes = []
    admission.note_throttle(throttle, plan, held, {}, float(now), arrivals)
    return jobs


def claim_limited(
    alias: str,
    queues: Sequence[str] | None,
    batch_size: int,
    worker_id: str,
    exclude: Sequence[str],
    plan: FlowPlan,
    throttle: Throttle | None = None,
) -> list[ClaimedJob]:
    # Behind a transaction-mode pooler the one string's prepared statement would be sent as
    # text and planned on every claim: there the claim takes its three round trips.
    if not _pooled(alias):
        _tune_for_claims(alias)
        if _claims_in_one_string(alias, plan):
            return _claim_in_one_string(alias, queues, batch_size, worker_id, exclude, plan, throttle)
    return flow_sql.claim_limited(FLOW_SQL, alias, queues, batch_size, worker_id, exclude, plan, throttle)


# -- leases --------------------------------------------------------------------------------

# Tokens are random per claim, so matching id and token sets is exact enough.
_HEARTBEAT = Statement(
    f"UPDATE {TABLE} SET lease_expires_at = {NOW} + visibility_timeout * interval '1 second' "
    "WHERE id = ANY(%s) AND lease_token = ANY(%s) RETURNING id, cancel_requested"
)


def heartbeat(alias: str, ids: list[int], tokens: list[str]) -> list[tuple[int, bool]]:
    with connections[alias].cursor() as cursor:
        _HEARTBEAT.execute(alias, cursor, [ids, tokens])
        return cursor.fetchall()  # type: ignore[no-any-return]


_COMPLETE_SQL = (
    f"UPDATE {TABLE} SET status = 'succeeded', finished_at = {NOW}, lease_token = NULL, "
    "lease_expires_at = NULL, result = %s::jsonb WHERE id = %s AND lease_token = %s"
)
_COMPLETE = Statement(_COMPLETE_SQL)


# The fenced ack and the COMMIT of its transaction in one query string: one round trip, not
# two. When no row matches (the lease is lost) the division by count(*) fails, the error
# aborts the transaction and PostgreSQL skips the rest of the string: the COMMIT never runs,
# so the job's writes roll back instead of committing beside a stale ack.
_COMPLETE_CHECKED = Statement(f"WITH acked AS ({_COMPLETE_SQL} RETURNING 1) SELECT 1 / count(*) FROM acked")
_LEASE_LOST_SQLSTATE = "22012"  # division_by_zero: nothing else in that string can raise it


def complete(alias: str, job_id: int, lease_token: str, result_json: str, *, commit: bool = False) -> bool:
    connection = connections[alias]
    with connection.cursor() as cursor:
        if commit and _commits_here(connection, cursor):
            try:
                _COMPLETE_CHECKED.execute(alias, cursor, [result_json, job_id, lease_token], then="; COMMIT")
            except DataError as exc:
                if getattr(exc.__cause__, "sqlstate", None) == _LEASE_LOST_SQLSTATE:
                    return False  # the caller raises LeaseLost, and the atomic block rolls back
                raise
            # Django's commit on leaving the block finds no transaction open: psycopg sends
            # nothing, and the block's on_commit callbacks run as they would have.
            return True
        _COMPLETE.execute(alias, cursor, [result_json, job_id, lease_token])
        return bool(cursor.rowcount == 1)


def _commits_here(connection: Any, cursor: Any) -> bool:
    """Whether the ack may send the COMMIT of the atomic block it is the last statement of.

    Only for the one outermost block, which commits on exit (not inside a caller's
    transaction or a test's), with psycopg 3's client-side binding, Django's default: its
    simple-query protocol is what takes two statements in one string with parameters.
    """
    return (
        _simple_query(cursor)
        and len(connection.atomic_blocks) == 1
        and not connection.savepoint_ids
        and connection.commit_on_exit
        and not connection.needs_rollback
    )


# One UPDATE for a batch of acks: the arrays pair each id with its token and result.
_COMPLETE_MANY = Statement(
    f"UPDATE {TABLE} AS j SET status = 'succeeded', finished_at = {NOW}, lease_token = NULL, "
    "lease_expires_at = NULL, result = v.result::jsonb "
    "FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS v(id, token, result) "
    "WHERE j.id = v.id AND j.lease_token = v.token RETURNING j.id, j.has_dependants"
)


def complete_many(alias: str, acks: Sequence[tuple[int, str, str]]) -> list[tuple[int, bool]]:
    ids, tokens, results = (list(column) for column in zip(*acks, strict=True))
    with connections[alias].cursor() as cursor:
        _COMPLETE_MANY.execute(alias, cursor, [ids, tokens, results])
        return [(job_id, bool(has_dependants)) for job_id, has_dependants in cursor.fetchall()]


def discard_queued(alias: str, job_id: int) -> None:
    with connections[alias].cursor() as cursor:
        # One query string of two statements (no parameters, so psycopg sends it as a
        # simple query: one round trip, one implicit transaction that SET LOCAL applies to).
        cursor.execute(
            "SET LOCAL synchronous_commit TO OFF; "
            f"DELETE FROM {TABLE} WHERE id = {int(job_id)} AND status = 'queued'"
        )


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
    f"WITH expired AS (SELECT id FROM {TABLE} WHERE status = 'running' "
    f"AND lease_expires_at < {NOW} AND attempts < max_attempts "
    "ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED) "
    f"UPDATE {TABLE} AS j SET status = 'queued', lease_token = NULL, lease_expires_at = NULL, "
    f"run_after = {NOW}, reappearances = j.reappearances + 1, worker_id = '', "
    f"first_failed_at = COALESCE(j.first_failed_at, {NOW}), last_error = %s, "
    f"attempt_history = {_history_failed('j.attempt_history')} "
    "FROM expired WHERE j.id = expired.id RETURNING j.id, j.queue_name"
)
_REAP_EXHAUSTED = (
    f"SELECT id, lease_token FROM {TABLE} WHERE status = 'running' "
    f"AND lease_expires_at < {NOW} AND attempts >= max_attempts "
    "ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED"
)


def reap(alias: str, batch_size: int = REAP_BATCH) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    params = [batch_size, LEASE_EXPIRED_MESSAGE, *LEASE_EXPIRED_ERROR]
    return common.reap(alias, _REAP_REQUEUE, params, _REAP_EXHAUSTED, batch_size)


# -- idempotency keys ----------------------------------------------------------------------

_KEY_SUCCEEDED = Statement(
    f"UPDATE jobguard_idempotencykey SET status = 'succeeded', result = %s, updated_at = {NOW} "
    "WHERE scope = %s AND key = %s AND job_id = %s"
)


def record_key_success(alias: str, scope: str, key: str, job_id: int, result_json: str | None) -> bool:
    with connections[alias].cursor() as cursor:
        _KEY_SUCCEEDED.execute(alias, cursor, [result_json, scope, key, job_id])
        return bool(cursor.rowcount > 0)


# -- reporting (jobguard_tune) -----------------------------------------------------------------


def durations_sql(since: float, queue: str | None) -> tuple[str, list[Any]]:
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
        f"FROM {TABLE} WHERE {FINISHED} "
        "AND finished_at >= statement_timestamp() - %s * interval '1 second' "
        f"{queue_filter}) AS runs GROUP BY queue_name, task_name ORDER BY queue_name, task_name"
    )
    return sql, params


# A skip scan of the due index (queue_name, priority DESC, run_after, id): the first entry of
# each (queue, priority) is its earliest run_after, and the next pair is found by one index
# descent. A grouped min over every queued row read the whole due set instead (about 200 ms
# of scan with a million queued, once a minute from every worker and at each worker's start).
# The first due-index entry of a set of queued rows: kept in step with jobguard_job_due_idx.
_FIRST_QUEUED = (
    f"(SELECT queue_name, priority, run_after FROM {TABLE} WHERE status = 'queued' %s "
    "ORDER BY queue_name, priority DESC, run_after, id LIMIT 1)"
)
_OLDEST_DUE = (
    "WITH RECURSIVE heads(queue_name, priority, run_after) AS ("
    + _FIRST_QUEUED % ""
    + " UNION ALL SELECT n.queue_name, n.priority, n.run_after FROM heads h, LATERAL ("
    + _FIRST_QUEUED % "AND queue_name = h.queue_name AND priority < h.priority"
    + " UNION ALL "
    + _FIRST_QUEUED % "AND queue_name > h.queue_name"
    + " LIMIT 1) AS n) "
    # Both NOWs are the one statement_timestamp(), so no due row's age is below 0.
    f"SELECT queue_name, EXTRACT(EPOCH FROM {NOW} - min(run_after))::float8 FROM heads "
    f"WHERE run_after <= {NOW} GROUP BY queue_name"
)


def oldest_due_ages(alias: str) -> dict[str, float]:
    with connections[alias].cursor() as cursor:
        cursor.execute(_OLDEST_DUE, [])
        return {queue: float(age) for queue, age in cursor.fetchall()}


def observed_durations(alias: str, since: float, queue: str | None) -> list[DurationRow]:
    """Run durations per (queue, task) in the window, percentiles computed by the database."""
    sql, params = durations_sql(since, queue)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return [(q, t, n, list(ps), top) for q, t, n, ps, top in cursor.fetchall()]
