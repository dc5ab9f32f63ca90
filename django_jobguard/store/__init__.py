"""The store: every SQL statement for jobs and idempotency keys, one module per database.

Claim, heartbeat, complete, requeue, dead-mark, reap, the enqueue inserts, checkpoints and
the LISTEN wake-up; :mod:`.beats` holds the console's worker-beat and per-minute upserts
(the same SQL on both databases). The functions here take a database alias and hand the call to
the alias's dialect, :mod:`.postgres`, :mod:`.mysql` or :mod:`.sqlite`, looked up once per
alias (a dict lookup per call). Each module implements the :class:`~.dialect.Dialect` protocol, which
mypy checks them against.

Every write a worker makes to a job it holds matches ``id AND lease_token``. A claim
writes a fresh random token, and every path that takes a job away from a worker (the
reaper, a shutdown hand-back, an operator) clears it. So a worker whose lease expired
and whose job moved on updates zero rows, raises :class:`LeaseLost`, and rolls back:
it cannot commit a stale ack, retry or dead-letter.

Lease times come from the database clock only (``statement_timestamp()`` /
``strftime('now')``), never from the worker's, so a worker with a skewed clock can
neither expire a live lease early nor start a job before its ``run_after``.

The SQL is raw on purpose: this is the hot path (one statement per claim batch, one per
ack) and the ORM cannot express ``FOR UPDATE SKIP LOCKED`` inside an ``UPDATE``. The
database lock back end's statements are here too, in :mod:`.locks`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import connections, transaction

from ..conf import get_settings
from ..flow import FlowPlan, Throttle
from . import common, flow_sql, mysql, postgres, sqlite
from .common import (
    LEASE_EXPIRED_ERROR,
    NOTIFY_CHANNEL,
    PERCENTILES,
    REAP_BATCH,
    SQLITE_INSERT_CHUNK,
    AttemptError,
    ClaimedJob,
    CounterChange,
    DurationRow,
    Inserted,
    build_job,
    is_unique_violation,
    paused_queue_names,
    workflow_children,
    workflow_totals,
)
from .dialect import Dialect, JobStore
from .flow_sql import TURN_KEY as FLOW_TURN_KEY
from .listener import Listener
from .memory import MemoryStore
from .wakeup import announce, install_notify_mode, installed_notify_mode, wakeup_source

if TYPE_CHECKING:
    from ..models import DeadLetter, Job

__all__ = [
    "FLOW_TURN_KEY",
    "LEASE_EXPIRED_ERROR",
    "NOTIFY_CHANNEL",
    "PERCENTILES",
    "REAP_BATCH",
    "SQLITE_INSERT_CHUNK",
    "AttemptError",
    "ClaimedJob",
    "CounterChange",
    "Dialect",
    "DurationRow",
    "JobStore",
    "Listener",
    "add_workflow_counts",
    "announce",
    "asynchronous_commit",
    "atomic",
    "build_job",
    "claim",
    "complete",
    "complete_many",
    "cursor_lock",
    "database_now",
    "dialect_of",
    "discard_queued",
    "flow_usage",
    "heartbeat",
    "insert_jobs",
    "insert_key",
    "insert_keyed_job",
    "install_notify_mode",
    "installed_notify_mode",
    "is_unique_violation",
    "key_owner",
    "load_job",
    "mark_dead",
    "memory_store",
    "needs_database",
    "observed_durations",
    "oldest_due_ages",
    "on_commit",
    "paused_queue_names",
    "read_checkpoints",
    "reap",
    "record_key_success",
    "requeue",
    "retrying",
    "save_dead_letter",
    "statement_lost",
    "substitute",
    "supported_vendors",
    "take_flow_turn",
    "wakeup_source",
    "workflow_children",
    "workflow_totals",
    "write_checkpoints",
    "write_progress",
    "writes_while_busy",
]

#: vendor -> its dialect. The modules are assigned to the protocol, so mypy checks each
#: module's functions against :class:`Dialect`.
_DIALECTS: dict[str, Dialect] = {"mysql": mysql, "postgresql": postgres, "sqlite": sqlite}
#: alias -> what serves its jobs and keys: its database's dialect, filled on first use of
#: each alias (an alias does not change vendor), or a test's substitute.
_by_alias: dict[str, JobStore] = {}
#: Aliases a test's substitute or the settings' memory store serves: their inserts wake no
#: worker (none claims from them), so they touch no database connection either.
_substituted: set[str] = set()
#: alias -> the MemoryStore that ``JOBGUARD["STORE"] = "memory"`` puts there: one per alias
#: for the process, kept when the setting changes, so a test kit may hold on to it.
_memory_stores: dict[str, MemoryStore] = {}
#: Aliases the settings' memory store serves now (forgotten when JOBGUARD changes).
_configured: set[str] = set()


def supported_vendors() -> frozenset[str]:
    """The ``connection.vendor`` names that have a dialect (the system check reads them)."""
    return frozenset(_DIALECTS)


def dialect_of(alias: str) -> Dialect:
    """The dialect of ``alias``'s database."""
    vendor = connections[alias].vendor
    found = _DIALECTS.get(vendor)
    if found is None:
        raise NotImplementedError(
            f"django-jobguard supports PostgreSQL, MariaDB/MySQL and SQLite, not {vendor}."
        )
    return found


def _store(alias: str) -> JobStore:
    try:
        return _by_alias[alias]
    except KeyError:
        pass
    found = _by_alias[alias] = _configured_store(alias)
    return found


def _configured_store(alias: str) -> JobStore:
    """What the settings say serves ``alias``: its database's dialect, or the memory store."""
    conf = get_settings()
    if conf.store != "memory" or alias != conf.database_alias:
        return dialect_of(alias)
    from .memory import allowed

    if not allowed():
        raise ImproperlyConfigured(
            "JOBGUARD['STORE'] is 'memory', which is for tests: this process is not running "
            "tests and DEBUG is off, so its jobs would never reach a worker. Use 'database' "
            "(the default) outside tests."
        )
    _configured.add(alias)
    _substituted.add(alias)
    return _memory_stores.setdefault(alias, MemoryStore())


def memory_store(alias: str | None = None) -> MemoryStore | None:
    """The :class:`~.memory.MemoryStore` serving ``alias`` (the settings' alias if None), or None.

    Set by ``JOBGUARD["STORE"] = "memory"`` or a :func:`substitute`; None when the database serves it.
    """
    found = _store(alias or get_settings().database_alias)
    return found if isinstance(found, MemoryStore) else None


def needs_database(alias: str, feature: str) -> None:
    """Raise ImproperlyConfigured naming ``feature`` when a memory store serves ``alias``."""
    if isinstance(_store(alias), MemoryStore):
        raise ImproperlyConfigured(
            f"{feature} need the database store, and the in-memory store serves the jobs here "
            "(JOBGUARD['STORE'] = 'memory', or a test's store.substitute()): run this test "
            "with the database store (JOBGUARD['STORE'] = 'database', the default)."
        )


def atomic(
    alias: str, *, savepoint: bool = True, database: bool = False
) -> contextlib.AbstractContextManager[Any]:
    """A transaction on ``alias`` for writes of ours that commit together or not at all.

    ``transaction.atomic(using=alias)`` when the database serves the alias. With the memory
    store, the store's own (:meth:`~.memory.MemoryStore.transaction`) and, with
    ``database=True`` (an ``atomic=True`` task's handler, whose writes are the database's),
    the database's transaction around it.
    """
    found = _store(alias)
    if not isinstance(found, MemoryStore):
        return transaction.atomic(using=alias, savepoint=savepoint)
    if not database:
        return found.transaction()
    stack = contextlib.ExitStack()
    stack.enter_context(transaction.atomic(using=alias, savepoint=savepoint))
    try:
        stack.enter_context(found.transaction())
    except BaseException:
        stack.close()
        raise
    return stack


def on_commit(alias: str, callback: Callable[[], None]) -> None:
    """Run ``callback`` once the transaction open on ``alias`` commits (see :func:`atomic`)."""
    found = _store(alias)
    if isinstance(found, MemoryStore):
        found.on_commit(callback)
    else:
        transaction.on_commit(callback, using=alias)


def load_job(alias: str, job_id: int) -> Job:
    """The job ``job_id`` as a ``Job`` (the ORM's row, or one built from the memory store's)."""
    found = _store(alias)
    if isinstance(found, MemoryStore):
        return found.job_model(alias, job_id)
    from ..models import Job  # app registry: see common

    return Job.objects.using(alias).get(pk=job_id)


def save_dead_letter(alias: str, letter: DeadLetter) -> DeadLetter:
    """Store a new dead letter: an ORM insert, or kept by the memory store."""
    found = _store(alias)
    if isinstance(found, MemoryStore):
        return found.save_dead_letter(letter)
    letter.save(using=alias, force_insert=True)
    return letter


def read_checkpoints(alias: str, job_id: int) -> dict[str, Any]:
    """The job's checkpoints (see :class:`~django_jobguard.context.JobContext`)."""
    found = _store(alias)
    if isinstance(found, MemoryStore):
        return found.read_checkpoints(job_id)
    return common.read_checkpoints(alias, job_id)


def write_checkpoints(alias: str, job_id: int, lease_token: str | None, checkpoints: dict[str, Any]) -> bool:
    """Replace the job's checkpoints if ``lease_token`` still holds it; whether it did."""
    found = _store(alias)
    if isinstance(found, MemoryStore):
        return found.write_checkpoints(job_id, lease_token, checkpoints)
    return common.write_checkpoints(alias, job_id, lease_token, checkpoints)


def write_progress(alias: str, reports: Sequence[tuple[int, str, dict[str, Any]]]) -> int:
    """Store the jobs' reported progress, ``(id, lease token, progress)`` each, fenced; rows written."""
    found = _store(alias)
    if isinstance(found, MemoryStore):
        return found.write_progress(reports)
    return common.write_progress(alias, reports)


@contextlib.contextmanager
def substitute(alias: str, job_store: JobStore) -> Iterator[JobStore]:
    """Serve ``alias``'s job and key operations from ``job_store`` inside the block.

    For unit tests with no database: ``with store.substitute("default", MemoryStore()):``
    (``JOBGUARD["STORE"] = "memory"`` does the same for every test, with one store).
    """
    previous = _by_alias.get(alias)
    was_substituted = alias in _substituted
    _by_alias[alias] = job_store
    _substituted.add(alias)
    try:
        yield job_store
    finally:
        if not was_substituted:
            _substituted.discard(alias)
        if previous is None:
            _by_alias.pop(alias, None)
        else:
            _by_alias[alias] = previous


def _forget_aliases(*, setting: str, **kwargs: Any) -> None:
    if setting == "DATABASES":  # a test's override_settings(DATABASES=...)
        _by_alias.clear()
        _substituted.difference_update(_configured)
        _configured.clear()
    elif setting == "JOBGUARD":  # STORE or DATABASE_ALIAS may have changed
        for alias in list(_by_alias):
            if alias in _configured or alias not in _substituted:  # a substitute's stays
                del _by_alias[alias]
        _substituted.difference_update(_configured)
        _configured.clear()


setting_changed.connect(_forget_aliases, dispatch_uid="jobguard_store_aliases")


_T = TypeVar("_T")


def retrying(alias: str, operation: str, run: Callable[[], _T]) -> _T:
    """Run ``run`` (a whole transaction of ours); again after a failure that a rerun cures.

    On MariaDB/MySQL after a deadlock; on PostgreSQL after a prepared statement that an
    undeclared pooler lost, once: the pooler is detected by then and the rerun sends text.
    The failure rolled the whole transaction back, so only a caller that owns it can run it
    again: call this outside any atomic block, with ``run`` opening its own. Each retry is a
    :class:`~django_jobguard.events.StatementRetried` event. On SQLite ``run`` runs once.
    """
    vendor = connections[alias].vendor
    if vendor == "mysql":
        return mysql.retry_deadlocks(alias, operation, run)
    if vendor == "postgresql":
        return postgres.rerun_after_lost_statement(alias, operation, run)
    return run()


def statement_lost(alias: str, exc: BaseException) -> bool:
    """Whether ``exc`` failed a transaction only because a prepared statement went stale.

    PostgreSQL behind an undeclared pooler (the pooler is detected by then, so a rerun sends
    text); never on the other databases. The caller that owns the transaction runs it again.
    """
    return connections[alias].vendor == "postgresql" and postgres.lost_statement(exc)


def asynchronous_commit(alias: str) -> None:
    """Let the current transaction commit without waiting for the disk, where the database can.

    For writes a crash may lose at no cost but a delay (a breaker's count of calls). On
    PostgreSQL, ``synchronous_commit`` off for this transaction only (``SET LOCAL``): the
    commit returns before its WAL is flushed, and is still atomic. Elsewhere nothing. Call
    inside the transaction.
    """
    if connections[alias].vendor == "postgresql":
        with connections[alias].cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def add_workflow_counts(alias: str, changes: Sequence[CounterChange]) -> list[tuple[int, int]]:
    """Add ``(workflow, shard, pending, succeeded, failed)`` changes to the workflow counters.

    Missing rows are created. Give the changes in (workflow, shard) order, one per row: the
    rows are locked in that order (the workflow bookkeeping's rule, see
    :mod:`django_jobguard.workflows`). ``(workflow id, pending)`` of each row after the
    change. Call it inside the transaction that settles the members.
    """
    if not changes:
        return []
    return dialect_of(alias).add_workflow_counts(alias, changes)


def cursor_lock(alias: str) -> threading.RLock | None:
    """On SQLite, a lock this thread's connection holds while any cursor of it is open.

    Shutdown closes a running job's connection from the worker's main thread (SQLite,
    see ``writes_while_busy``), which is safe only while it holds this lock. None on
    PostgreSQL, where nothing does.
    """
    return _store(alias).cursor_lock(alias)


def writes_while_busy(alias: str) -> bool:
    """Whether another connection can write while a job's transaction is open.

    True on PostgreSQL (row locks). False on SQLite, where an open write transaction
    holds the whole database, so a running atomic job blocks every other write.
    """
    return _store(alias).writes_while_busy(alias)


def database_now(alias: str) -> datetime.datetime:
    """The database clock, now (aware): what due times are compared against, never the host's."""
    return _store(alias).database_now(alias)


# -- enqueue -------------------------------------------------------------------------------


def insert_jobs(
    alias: str,
    rows: Sequence[dict[str, Any]],
    run_after: datetime.datetime | datetime.timedelta | None = None,
) -> list[Inserted]:
    """Insert queued jobs in one statement (chunks on SQLite); ``(id, run_after, enqueued_at)`` each.

    ``rows`` hold the fields of ``INSERT_FIELDS`` with ``args``/``kwargs`` as Python
    values. ``run_after`` applies to every row: None is "now", a timedelta counts from the
    database clock. The ORM's ``bulk_create`` spends most of its time compiling per-field
    SQL; this path is the enqueue hot path.
    """
    if not rows:
        return []
    results = _store(alias).insert_jobs(alias, rows, run_after)
    if len(results) != len(rows):  # pragma: no cover - the database returned a row per insert
        raise RuntimeError(f"inserted {len(rows)} jobs but got {len(results)} rows back")
    if alias not in _substituted:
        # Due now only: a delayed job would wake every idle worker for a claim that finds nothing.
        due_now = {row["queue_name"] for row, (_, due, at) in zip(rows, results, strict=True) if due <= at}
        announce(alias, due_now)
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
    """Insert a job and its new idempotency key together; None, writing nothing, if the key exists.

    On PostgreSQL one statement does both (atomic on its own, so it needs no transaction
    around it); on SQLite three, in the caller's transaction or one of their own.
    """
    inserted = _store(alias).insert_keyed_job(
        alias, row, run_after, scope=scope, fingerprint=fingerprint, expires_at=expires_at
    )
    if inserted is not None and inserted[1] <= inserted[2] and alias not in _substituted:  # due now
        announce(alias, (row["queue_name"],))
    return inserted


def insert_key(
    alias: str, scope: str, key: str, digest: str, job_id: int | None = None, *, expires_at: datetime.datetime
) -> int | None:
    """Insert the key unless it exists; the new row's id, or None if it existed."""
    return _store(alias).insert_key(alias, scope, key, digest, job_id, expires_at=expires_at)


def key_owner(alias: str, scope: str, key: str) -> tuple[int | None, str] | None:
    """``(job id, status)`` of the idempotency key, or None if there is none."""
    return _store(alias).key_owner(alias, scope, key)


def record_key_success(alias: str, scope: str, key: str, job_id: int, result: Any) -> bool:
    """Mark the key succeeded with ``result`` if ``job_id`` owns it; call inside the ack's transaction."""
    # Raw SQL: this runs in every keyed ack, where the ORM's update cost more than the rest.
    result_json = None if result is None else json.dumps(result)
    return _store(alias).record_key_success(alias, scope, key, job_id, result_json)


# -- leases --------------------------------------------------------------------------------


def take_flow_turn(alias: str) -> None:
    """Inside a transaction: wait for its turn among the fleet's limited claims, held to its end.

    A breaker that opens by an outcome or by hand takes the turn first, so no claim that read
    it closed can commit a lease after it opened.
    """
    turns: dict[str, flow_sql.FlowSQL] = {
        "mysql": mysql.FLOW_SQL,
        "postgresql": postgres.FLOW_SQL,
        "sqlite": sqlite.FLOW_SQL,
    }
    turn = turns[connections[alias].vendor]
    with connections[alias].cursor() as cursor:
        turn.take_turn(alias, cursor)


def flow_usage(alias: str, plan: FlowPlan) -> tuple[dict[str, int], dict[str, int]]:
    """``(running, waiting)`` per limit key: running jobs per concurrency key, due jobs per key.

    For reports (``jobguard_status``, the metrics); read from the job rows of the limited
    queues, not routed to a substitute store.
    """
    running, waiting = flow_sql.usage(alias, dialect_of(alias).CLOCK.now, plan)
    return dict(running), dict(waiting)


def claim(
    alias: str,
    queues: Sequence[str] | None,
    batch_size: int,
    worker_id: str,
    exclude: Sequence[str] = (),
    flow: FlowPlan | None = None,
    throttle: Throttle | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``batch_size`` due jobs of ``queues`` (all queues if None) in one statement.

    ``exclude`` names queues to leave alone when ``queues`` is None (every other queue: the
    worker's ``--exclude-queues``); with a list of queues, leave them out of the list
    instead. Paused queues are never claimed from: on PostgreSQL the claim statement reads
    them itself, elsewhere they are read just before it.

    ``flow``: the declared limits (:class:`~django_jobguard.flow.FlowPlan`: the caller builds
    it from its tasks, the store knows none). A claim that may meet a limited job admits only
    the jobs every limit has room for, in one transaction that the fleet's limited claims take
    turns on; a claim of queues without limits is the one statement.
    ``throttle`` receives when a rate that held jobs back next admits a start.
    """
    if throttle is not None:
        throttle.retry_after = None
        throttle.held_back.clear()
        throttle.breaker_changes = []
        throttle.breaker_states = {}
    if batch_size <= 0:
        return []
    db = _store(alias)
    if flow is not None and flow.covers(queues, exclude):
        jobs = db.claim_limited(alias, queues, batch_size, worker_id, exclude, flow, throttle)
        jobs.sort(key=lambda job: (-job.priority, job.id))
        return jobs
    if not db.CLAIM_READS_PAUSES:
        exclude = sorted({*exclude, *paused_queue_names(alias)})
    if queues:
        queues = [name for name in queues if name not in exclude]
        if not queues:
            return []
        exclude = ()
    jobs = db.claim(alias, queues, batch_size, worker_id, exclude)
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
    ids, tokens = [job_id for job_id, _ in leases], [token for _, token in leases]
    rows = _store(alias).heartbeat(alias, ids, tokens)
    if cancel_requested is not None:
        cancel_requested.update(row[0] for row in rows if row[1])
    return {row[0] for row in rows}


def complete(alias: str, job_id: int, lease_token: str, result_json: str, *, commit: bool = False) -> bool:
    """Mark the job succeeded with its JSON result, if the lease is still ours.

    ``commit=True``: the ack is the last statement of the outermost atomic block, so on
    PostgreSQL it may commit that transaction in the same round trip (the block's exit then
    has nothing left to send). When the lease is lost nothing commits: returns False, and the
    caller raises :class:`LeaseLost` so the block rolls back.
    """
    return _store(alias).complete(alias, job_id, lease_token, result_json, commit=commit)


def acks_commit_alone(alias: str) -> bool:
    """Whether :func:`complete_many` outside a transaction still commits its batch as one."""
    return _store(alias).ACKS_COMMIT_ALONE


def complete_many(alias: str, acks: Sequence[tuple[int, str, str]]) -> dict[int, bool]:
    """Mark several jobs succeeded at once: ``(id, lease token, JSON result)`` each.

    Each row is matched by its id and its token, as :func:`complete` matches one; returns
    the ids whose lease was still ours, each mapped to whether another job waits for it
    (read under the write's row lock, so a dependant added while the job ran counts). A job
    missing from it lost its lease, and is left as it is. One statement on PostgreSQL; call
    inside a transaction so the batch commits once, unless :func:`acks_commit_alone`.
    """
    if not acks:
        return {}
    return dict(_store(alias).complete_many(alias, acks))


def discard_queued(alias: str, job_id: int) -> None:
    """Delete a job that is still queued and no longer has anything to do.

    For work the caller has already done itself (a durable cache invalidation whose keys
    were deleted right after the commit). Losing this delete in a crash only lets a worker
    run the job once more, harmlessly, so on PostgreSQL its commit does not wait for the
    WAL to reach the disk (``synchronous_commit`` off for this statement's transaction
    only): the writer pays one round trip, not a second disk flush.
    """
    _store(alias).discard_queued(alias, job_id)


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
    return _store(alias).requeue(
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
    alias: str, job_id: int, lease_token: str, error: str, attempt_error: AttemptError | None = None
) -> bool:
    """Mark the job dead, if the lease is ours. Call inside the dead letter's transaction.

    ``attempt_error`` completes the last attempt's history entry (in the same statement).
    """
    return _store(alias).mark_dead(alias, job_id, lease_token, error, attempt_error)


def reap(alias: str, batch_size: int = REAP_BATCH) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Put expired leases back in their queue; report the out-of-attempts ones.

    Returns ``(requeued, exhausted)``: ``(id, queue_name)`` of jobs made visible again
    (each counted as a visibility-timeout reappearance on the row), and ``(id,
    lease_token)`` of expired jobs with no attempt left, which the caller dead-letters
    (fenced by that token, so a late ack and the reaper cannot both win).
    """
    return _store(alias).reap(alias, batch_size)


# -- reporting -------------------------------------------------------------------------------


def oldest_due_ages(alias: str) -> dict[str, float]:
    """Seconds the oldest due job of each queue with due jobs has waited (database clock).

    On PostgreSQL a skip scan of the due index: its cost grows with the number of (queue,
    priority) pairs, not with the number of queued jobs.
    """
    return _store(alias).oldest_due_ages(alias)


def observed_durations(alias: str, since: float, queue: str | None = None) -> list[DurationRow]:
    """Claim-to-ack seconds of the jobs that succeeded in the last ``since`` seconds, per (queue, task).

    Read through the partial index on finished jobs, so a window is a range of it however
    many older rows the table keeps. Percentiles are ``percentile_cont``'s (linear
    interpolation between the two nearest ranks) on both databases.
    """
    return _store(alias).observed_durations(alias, since, queue)
