"""What both databases' store modules share: the claimed job, the column lists, the ORM reads."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections
from django.db.models import Case, JSONField, Q, Value, When
from django.utils.dateparse import parse_datetime

from ..encryption.payloads import seal_json_text

if TYPE_CHECKING:
    from ..models import Job

#: MariaDB/MySQL's error number of a duplicate key (a unique-constraint violation).
ER_DUP_ENTRY = 1062
#: Expired leases handled per reaper statement, so one pass never holds many row locks.
REAP_BATCH = 200
#: PostgreSQL channel the enqueue trigger notifies (payload: the queue name).
NOTIFY_CHANNEL = "jobguard_jobs"
#: Rows per INSERT statement on SQLite (13 parameters a row, well under its variable limit).
SQLITE_INSERT_CHUNK = 500

TABLE = "jobguard_job"
KEY_TABLE = "jobguard_idempotencykey"
LOCK_TABLE = "jobguard_lock"
COUNTER_TABLE = "jobguard_workflowcounter"
WORKFLOW_TABLE = "jobguard_workflow"
RETURNING = (
    "id, task_name, queue_name, args, kwargs, priority, attempts, max_attempts, lease_token, "
    "visibility_timeout, idempotency_key, lock_key, handler_version, workflow_id"
)

INSERT_COLUMNS = (
    "task_name, queue_name, args, kwargs, priority, max_attempts, visibility_timeout, "
    "idempotency_key, lock_key, handler_version, flow_keys, trace_context, workflow_id, status, attempts, "
    "worker_id, "
    "last_error, "
    "reappearances, lock_contentions, has_dependants, checkpoints, attempt_history"
)
INSERT_FIELDS = (
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
    "flow_keys",
    # Optional in a row (None: tracing is off); see django_jobguard.monitoring.tracing.
    "trace_context",
    # Optional: a workflow's members are inserted as its members (no UPDATE of each row after).
    "workflow_id",
)
#: The constant columns of a new job row, after the INSERT_FIELDS (status ... has_dependants):
#: nothing waits for a new job yet (a dependency stored with it marks it after the insert).
INSERT_CONSTANTS = "'queued', 0, '', '', 0, 0, FALSE"

#: The percentiles of run durations the store reports (``jobguard_tune``), as fractions.
PERCENTILES = (0.5, 0.95, 0.99)
#: Durations of one (queue, task): ``(queue, task, count, [p50, p95, p99], max)`` in seconds.
DurationRow = tuple[str, str, int, list[float], float]
# The partial index's own condition, repeated so that SQLite (which does not deduce it from
# status = 'succeeded') picks the index too.
FINISHED = "status IN ('succeeded', 'dead', 'cancelled') AND status = 'succeeded' AND started_at IS NOT NULL"


def interpolate(fraction: float, count: int, values: dict[int, float]) -> float:
    """``percentile_cont(fraction)`` of ``count`` sorted values, from the two at the ranks it needs.

    ``values`` maps a 0-based rank to its value; it must hold ``floor(fraction * (count - 1))``
    and the rank after it (or the last). For the databases without a percentile function.
    """
    position = fraction * (count - 1)
    low = math.floor(position)
    high = min(low + 1, count - 1)
    return values[low] + (position - low) * (values[high] - values[low])


#: What an insert returns per job: ``(id, run_after, enqueued_at)``.
Inserted = tuple[int, datetime.datetime, datetime.datetime]
#: How a failed attempt is recorded in the job's history: (error class path, message, traceback).
AttemptError = tuple[str, str, str]
#: The history entry of an attempt whose worker stopped heartbeating (no traceback to keep).
LEASE_EXPIRED_ERROR: AttemptError = (
    "django_jobguard.exceptions.LeaseLost",
    "the lease expired: the worker stopped heartbeating (crashed, frozen or cut off)",
    "",
)
#: The job's ``last_error`` when the reaper takes an expired lease back.
LEASE_EXPIRED_MESSAGE = "lease expired: the worker stopped heartbeating (crashed, frozen or cut off)"


@dataclasses.dataclass(frozen=True, slots=True)
class Clock:
    """A dialect's SQL for the database clock: now, and now plus some seconds.

    Lease times, due times and lock expiries are written with these, never from the
    worker's clock.
    """

    #: SQL for the database clock now.
    now: str
    #: SQL for now plus some seconds: one parameter, as :attr:`seconds` makes it.
    later: str
    #: The parameter of :attr:`later` for a number of seconds.
    seconds: Callable[[float], Any]
    #: SQL for the database clock in whole microseconds since the epoch (an integer).
    epoch_micros: str


@dataclasses.dataclass(frozen=True, slots=True)
class History:
    """A dialect's SQL for the job's attempt history (a JSON array of entries)."""

    #: The history with its last entry marked failed: three parameters, an :data:`AttemptError`.
    failed: str
    #: The history without its last entry (a refunded attempt did not count).
    dropped: str
    #: The start of the entry before the last (the attempt a refunded one followed), a
    #: timestamp, NULL when there is none: the job's ``started_at`` once the last is dropped.
    previous_start: str


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
    #: The workflow the job belongs to: its completion then settles the workflow's bookkeeping.
    workflow_id: int | None = None
    #: The job's stored ``flow_keys`` (as JSON, clipped) when they are not a list of strings,
    #: as a limited claim found them: it counted the job under none of them, and the worker
    #: dead-letters it (see ``flow.stored_flow_keys``). None otherwise.
    unreadable_flow_keys: str | None = None
    #: Its data is stored encrypted: the worker decrypted its arguments (``args`` and
    #: ``kwargs`` hold them in clear now) and seals what it stores of the run.
    sealed: bool = False

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
            workflow_id=row[13] if len(row) > 13 else None,
        )


def placeholders(values: Sequence[Any]) -> str:
    return ", ".join(["%s"] * len(values))


def row_values(row: dict[str, Any]) -> list[Any]:
    """The INSERT_FIELDS of one job row, ``args``/``kwargs``/``flow_keys``/``trace_context`` as JSON text."""
    values = [row.get(field) for field in INSERT_FIELDS]
    if row.get("encrypt"):
        values[2], values[3] = payload_json(row, "args"), payload_json(row, "kwargs")
    else:  # the plain path: no call more than before
        values[2] = json.dumps(values[2])
        values[3] = json.dumps(values[3])
    values[10] = json.dumps(values[10] or [])
    values[11] = trace_context_json(row)
    return values


def payload_json(row: dict[str, Any], name: str) -> str:
    """A job row's ``args`` or ``kwargs`` as the JSON text stored: sealed when the row says
    ``encrypt`` (see :func:`django_jobguard.enqueue.prepare`), which the caller's row keeps in clear."""
    value = row.get(name)
    if not row.get("encrypt"):
        return json.dumps(value)
    if name == "kwargs" and value == {}:
        # Nothing to hide, and its absence shows anyway (a ciphertext's length follows its
        # value's): a call without keyword arguments is sealed and opened once, not twice.
        # The arguments beside it are always sealed, which is how a row says it is encrypted.
        return "{}"
    return seal_json_text(value, name)


def trace_context_json(row: dict[str, Any]) -> str | None:
    """The row's trace context as JSON text, or None (stored as NULL) when it has none."""
    context = row.get("trace_context")
    return None if context is None else json.dumps(context)


def sqlite_datetime(value: Any) -> datetime.datetime:
    """A timestamp SQLite returned (its converters may already have parsed it), aware under USE_TZ."""
    parsed = value if isinstance(value, datetime.datetime) else parse_datetime(value)
    if parsed is None:  # pragma: no cover - SQLite returned what we wrote
        raise ValueError(f"not a datetime: {value!r}")
    # SQLite stores UTC (its 'now' and Django's writes under USE_TZ) without an offset.
    return parsed.replace(tzinfo=datetime.UTC) if parsed.tzinfo is None and settings.USE_TZ else parsed


# -- model instances and ORM reads (the same on both databases) ----------------------------
# The models are imported inside these functions: the package's __init__ imports the store
# (through context) before Django's app registry is ready, when models cannot be imported.


def build_job(alias: str, fields: dict[str, Any], inserted: Inserted) -> Job:
    """The saved ``Job`` of ``fields`` and what its insert returned: ``(id, run_after, enqueued_at)``."""
    from ..models import Job  # app registry: see above

    names, defaults = _job_layout()
    pk, run_after, enqueued_at = inserted
    values = {**defaults, **fields, "id": pk, "run_after": run_after, "enqueued_at": enqueued_at}
    values["checkpoints"] = {}
    values["attempt_history"] = []
    # from_db builds the instance positionally, as a query would: about a third of the
    # cost of keyword construction, on the enqueue hot path.
    return Job.from_db(alias, names, [values[name] for name in names])


@functools.cache
def _job_layout() -> tuple[list[str], dict[str, Any]]:
    """The Job's column attributes in order, and the fixed defaults of a new row."""
    from ..models import Job  # app registry: see above

    fields = Job._meta.concrete_fields
    return [field.attname for field in fields], {
        field.attname: None if callable(field.default) else field.get_default() for field in fields
    }


def paused_queue_names(alias: str) -> set[str]:
    """The paused queues' names: a raw read, as it runs before every claim on SQLite (measured:
    the ORM query it replaces cost the claim loop more than the claim statement itself)."""
    with connections[alias].cursor() as cursor:
        # The same condition as the partial index of paused rows, on both databases.
        cursor.execute("SELECT queue_name FROM jobguard_queuestate WHERE paused = %s", [True])
        return {row[0] for row in cursor.fetchall()}


def read_checkpoints(alias: str, job_id: int) -> dict[str, Any]:
    from ..models import Job  # app registry: see above

    value = Job.objects.using(alias).filter(pk=job_id).values_list("checkpoints", flat=True).first()
    return dict(value or {})


def write_checkpoints(alias: str, job_id: int, lease_token: str | None, checkpoints: dict[str, Any]) -> bool:
    from ..models import Job  # app registry: see above

    return bool(
        Job.objects.using(alias).filter(pk=job_id, lease_token=lease_token).update(checkpoints=checkpoints)
    )


def write_progress(alias: str, reports: Sequence[tuple[int, str, dict[str, Any]]]) -> int:
    """Store each job's reported progress, ``(id, lease token, progress)``, in one statement.

    Fenced like every write of a running job: a row whose token moved on keeps its value.
    The number of rows written. Through the ORM, which adapts the JSON to each database's
    column (as the checkpoints do): a worker sends this at most once per heartbeat tick.
    """
    from ..models import Job  # app registry: see above

    jobs = Job.objects.using(alias)
    if len(reports) == 1:
        job_id, token, progress = reports[0]
        return jobs.filter(pk=job_id, lease_token=token).update(progress=progress)
    fenced = Q()
    for job_id, token, _ in reports:
        fenced |= Q(pk=job_id, lease_token=token)
    values = [
        When(pk=job_id, then=Value(progress, output_field=JSONField())) for job_id, _, progress in reports
    ]
    return jobs.filter(fenced).update(progress=Case(*values, output_field=JSONField()))


# -- idempotency keys (the same statements on both databases) -------------------------------

# ON CONFLICT DO NOTHING waits for a concurrent inserter of the key to finish, then yields to
# it without an error, so the caller's transaction is never aborted by a unique violation.
_INSERT_KEY = (
    f'INSERT INTO "{KEY_TABLE}" ("key", "scope", "fingerprint", "status", "duplicates", "expires_at", '
    "\"job_id\") VALUES (%s, %s, %s, 'in_progress', 0, %s, %s) "
    'ON CONFLICT ("scope", "key") DO NOTHING RETURNING "id"'
)
_KEY_OWNER = f"SELECT job_id, status FROM {KEY_TABLE} WHERE scope = %s AND key = %s"


def insert_key(
    alias: str, scope: str, key: str, digest: str, job_id: int | None, *, expires_at: datetime.datetime
) -> int | None:
    connection = connections[alias]
    with connection.cursor() as cursor:
        expiry = connection.ops.adapt_datetimefield_value(expires_at)
        cursor.execute(_INSERT_KEY, [key, scope, digest, expiry, job_id])
        row = cursor.fetchone()
    return row[0] if row else None


def key_owner(alias: str, scope: str, key: str) -> tuple[int | None, str] | None:
    with connections[alias].cursor() as cursor:
        cursor.execute(_KEY_OWNER, [scope, key])
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


# -- settling a held job (the same statements on both databases, in each one's clock) -------


def _fenced_update(alias: str, sets: list[str], params: list[Any], job_id: int, lease_token: str) -> bool:
    """``UPDATE`` the job with ``sets`` if ``lease_token`` is still its token; whether it was."""
    sql = f"UPDATE {TABLE} SET {', '.join(sets)} WHERE id = %s AND lease_token = %s"
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, [*params, job_id, lease_token])
        return bool(cursor.rowcount == 1)


def requeue(
    clock: Clock,
    history: History,
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
    """The dialects' ``requeue``, written in ``clock`` and ``history``."""
    sets = [
        "status = 'queued'",
        "lease_token = NULL",
        "lease_expires_at = NULL",
        "worker_id = ''",
        f"run_after = {clock.later}",
        f"attempts = attempts - {1 if refund_attempt else 0}",
        f"lock_contentions = lock_contentions + {1 if contention else 0}",
    ]
    params: list[Any] = [clock.seconds(delay)]
    if error is not None:
        sets += ["last_error = %s", f"first_failed_at = COALESCE(first_failed_at, {clock.now})"]
        params.append(error)
    if refund_attempt:
        # The refunded claim's start goes with its entry: the job's start is its last counted
        # attempt's again (NULL if none), not the contended claim's. Before the history's own
        # assignment: MySQL assigns left to right, so it must read the history unchanged.
        sets.append(f"started_at = {history.previous_start}")
        sets.append(f"attempt_history = {history.dropped}")
    elif attempt_error is not None:
        sets.append(f"attempt_history = {history.failed}")
        params += list(attempt_error)
    return _fenced_update(alias, sets, params, job_id, lease_token)


def mark_dead(
    clock: Clock,
    history: History,
    alias: str,
    job_id: int,
    lease_token: str,
    error: str,
    attempt_error: AttemptError | None,
) -> bool:
    """The dialects' ``mark_dead``, written in ``clock`` and ``history``."""
    sets = [
        "status = 'dead'",
        f"finished_at = {clock.now}",
        "lease_token = NULL",
        "lease_expires_at = NULL",
        "last_error = %s",
        f"first_failed_at = COALESCE(first_failed_at, {clock.now})",
    ]
    params: list[Any] = [error]
    if attempt_error is not None:
        sets.append(f"attempt_history = {history.failed}")
        params += list(attempt_error)
    return _fenced_update(alias, sets, params, job_id, lease_token)


def reap(
    alias: str, requeue_sql: str, requeue_params: Sequence[Any], exhausted_sql: str, batch_size: int
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Run a dialect's two reaper statements: ``(id, queue)`` requeued, ``(id, token)`` exhausted."""
    with connections[alias].cursor() as cursor:
        cursor.execute(requeue_sql, list(requeue_params))
        requeued = [(row[0], row[1]) for row in cursor.fetchall()]
        cursor.execute(exhausted_sql, [batch_size])
        exhausted = [(row[0], row[1]) for row in cursor.fetchall()]
    return requeued, exhausted


def acquire_lock_on_conflict(clock: Clock, alias: str, key: str, token: str, ttl: float) -> int | None:
    """The database lock's acquire as one ``INSERT ... ON CONFLICT ... RETURNING`` (PostgreSQL, SQLite).

    Takes the row only if it is free or expired, and bumps the key's fencing counter in the
    same statement (see :mod:`.locks`).
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LOCK_TABLE} (key, token, expires_at, fencing_token, acquired_at) "
            f"VALUES (%s, %s, {clock.later}, {clock.epoch_micros}, {clock.now}) "
            "ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at, "
            f"fencing_token = {LOCK_TABLE}.fencing_token + 1, acquired_at = excluded.acquired_at "
            f"WHERE {LOCK_TABLE}.token IS NULL OR {LOCK_TABLE}.expires_at <= {clock.now} "
            "RETURNING fencing_token",
            [key, token, clock.seconds(ttl)],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


#: One change to a workflow's counters: ``(workflow id, shard, pending, succeeded, failed)`` to add.
CounterChange = tuple[int, int, int, int, int]


def workflow_children(alias: str, parent_ids: Sequence[int]) -> list[tuple[int, int, str]]:
    """``(parent_id, child_id, result_as)`` of the jobs waiting for any of ``parent_ids``.

    Raw SQL, not the ORM: every ack of workflow members asks it, and compiling the query cost
    more than running it.
    """
    found: list[tuple[int, int, str]] = []
    with connections[alias].cursor() as cursor:
        for start in range(0, len(parent_ids), SQLITE_INSERT_CHUNK):
            chunk = parent_ids[start : start + SQLITE_INSERT_CHUNK]
            cursor.execute(
                "SELECT parent_id, child_id, result_as FROM jobguard_jobdependency "
                f"WHERE parent_id IN ({placeholders(chunk)})",
                list(chunk),
            )
            found += cursor.fetchall()
    return found


def workflow_totals(alias: str, workflow_id: int) -> tuple[str, int, int, int] | None:
    """Lock a workflow's row, then sum its counters: ``(state, pending, succeeded, failed)``.

    None if the workflow is gone. Two statements: the sum, read once the lock is granted, sees
    every completion committed before it. Raw SQL: the tail of a large batch asks once per
    counter row it empties, and compiling the ORM's two queries cost more than running them.
    """
    lock = " FOR UPDATE" if connections[alias].features.has_select_for_update else ""
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT state FROM {WORKFLOW_TABLE} WHERE id = %s{lock}", [workflow_id])
        row = cursor.fetchone()
        if row is None:
            return None
        cursor.execute(
            "SELECT COALESCE(SUM(pending), 0), COALESCE(SUM(succeeded), 0), COALESCE(SUM(failed), 0) "
            f"FROM {COUNTER_TABLE} WHERE workflow_id = %s",
            [workflow_id],
        )
        pending, succeeded, failed = cursor.fetchone()
    return str(row[0]), int(pending), int(succeeded), int(failed)


def add_workflow_counts_on_conflict(alias: str, changes: Sequence[CounterChange]) -> list[tuple[int, int]]:
    """Add to workflow counter rows, creating missing ones, as one ``INSERT ... ON CONFLICT ... RETURNING``.

    PostgreSQL and SQLite. The upsert takes its rows' locks in the order of its VALUES, the
    callers' (workflow, shard) order. ``(workflow id, pending)`` of each row after the change.
    """
    # Integers only, written as literals: binding five parameters a row cost the worker more
    # CPU than the rest of a member's ack.
    values = ", ".join(
        f"({int(w)}, {int(s)}, {int(p)}, {int(ok)}, {int(failed)})" for w, s, p, ok, failed in changes
    )
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {COUNTER_TABLE} (workflow_id, shard, pending, succeeded, failed) VALUES {values} "
            "ON CONFLICT (workflow_id, shard) DO UPDATE SET "
            f"pending = {COUNTER_TABLE}.pending + excluded.pending, "
            f"succeeded = {COUNTER_TABLE}.succeeded + excluded.succeeded, "
            f"failed = {COUNTER_TABLE}.failed + excluded.failed "
            "RETURNING workflow_id, pending"
        )
        return [(int(workflow_id), int(pending)) for workflow_id, pending in cursor.fetchall()]


def is_unique_violation(exc: BaseException) -> bool:
    """Whether ``exc`` is a database unique-constraint violation (PostgreSQL, MariaDB/MySQL, SQLite)."""
    from django.db import IntegrityError

    if not isinstance(exc, IntegrityError):
        return False
    # psycopg puts the SQLSTATE on the original error; 23505 is unique_violation.
    if getattr(exc.__cause__, "sqlstate", None) == "23505":
        return True
    # mysqlclient: the server's error number first, 1062 is a duplicate entry (ER_DUP_ENTRY).
    if exc.args and exc.args[0] == ER_DUP_ENTRY:
        return True
    return str(exc).startswith("UNIQUE constraint failed")
