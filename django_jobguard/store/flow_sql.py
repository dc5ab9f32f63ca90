"""Flow control's SQL: the limited claim, written once for every database.

A claim of the queues where limits are declared (``@task(concurrency=, rate=, limit=)``,
``JOBGUARD["QUEUES"][name]["concurrency"]``) goes through :func:`claim_limited` instead of
the dialect's one-statement claim; every other claim keeps that statement, so a project's
unlimited queues pay nothing for limits elsewhere.

One limited claim is one transaction, and limited claims take turns across the fleet (a
transaction-scoped advisory lock on PostgreSQL, the write lock on SQLite, the row lock of one
row, :data:`TURN_KEY` of the rate table, on MariaDB/MySQL):

1. count the running jobs of every concurrency key, from the job rows themselves: a slot
   *is* a running job, so it frees when the job's lease ends, however it ends (an ack, a
   retry, the reaper taking back a killed worker's lease);
2. read the rate keys that cannot start a job now (GCRA: a key's theoretical arrival time
   more than its burst ahead of the clock);
3. read due jobs in claim order, leaving out those of full or throttled keys in the SQL
   itself, so a saturated key never stands in front of the others (no head-of-line blocking);
   a dialect may read key by key instead when one of those keys has many jobs queued
   (PostgreSQL does), so that its rows are not read past on every claim;
4. admit them in order while each of their keys has room, and lease the admitted ones;
5. write the admitted rate keys' new arrival times.

A dialect may send several of these steps in one round trip (:meth:`FlowSQL.open_turn`,
:meth:`FlowSQL.close_turn`): every claim queued behind the turn pays for each one inside it.

What to admit is decided by :mod:`django_jobguard.flow.admission` from what the turn read
(steps 1, 2 and 4); this module runs the turn and its SQL, and knows no task: the caller
hands it the plan (:class:`~django_jobguard.flow.FlowPlan`).

Counting and leasing in one turn is what keeps "never more than N": a running count can
only fall while a turn is under way (acks and the reaper do not take the lock), so the
count a turn reads is never below the truth when its leases commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from django.db import connections, transaction

from .._text import clip
from ..flow import MAX_STORED_RATE_KEY_LENGTH, FlowPlan, Throttle
from ..flow.admission import (
    BREAKER_FIELDS,
    CANDIDATES_EXTRA,
    CANDIDATES_PER_JOB,
    REFILL_PASSES,
    Admission,
    GateState,
    count_running,
    count_waiting,
    hot_keys,
    note_throttle,
    read_gates,
)
from .common import ClaimedJob, paused_queue_names, placeholders

__all__ = [
    "BREAKER_TABLE",
    "RATE_TABLE",
    "TURN_KEY",
    "ConflictUpserts",
    "FlowSQL",
    "Opening",
    "SequentialTurn",
    "TurnScope",
    "claim_limited",
    "mark_unreadable",
    "usage",
]

RATE_TABLE = "jobguard_flowrate"
BREAKER_TABLE = "jobguard_breaker"
#: The rate table's row whose lock is the limited claims' turn on a database without a
#: transaction-scoped advisory lock (MariaDB/MySQL). Its ``tat`` stays 0, so a claim never
#: reads it as a rate, and pruning leaves it alone; no rate key has this form.
TURN_KEY = "flow:turn"
#: A breaker row as the claim reads it (admission's order of the fields).
_BREAKER_COLUMNS = ", ".join(BREAKER_FIELDS)
#: A new breaker row (closed, no counts): its columns, and one row's values (name, manual).
BREAKER_INSERT_COLUMNS = (
    "name, state, manual, probes, window_start, calls, failures, budget_start, first_attempts, retries, "
    "changed_by_name, reason"
)
BREAKER_INSERT_ROW = "(%s, 'closed', %s, 0, 0, 0, 0, 0, 0, 0, '', '')"


@dataclasses.dataclass(frozen=True, slots=True)
class Opening:
    """What a limited claim reads first, once its turn is taken."""

    paused: set[str]
    #: ``(task_name, queue_name, flow_keys)`` of each running job the plan counts.
    running: list[tuple[str, str, Any]]
    #: The database clock, read after the turn was taken.
    now: float
    #: The rate keys whose arrival time is ahead of ``now``.
    arrivals: dict[str, float]
    #: The breaker rows of the plan's guarded limits (none read when it has none).
    breakers: list[Sequence[Any]]


@dataclasses.dataclass(slots=True)
class TurnScope:
    """How a limited claim's transaction is carried (see :meth:`FlowSQL.turn`)."""

    #: The transaction's BEGIN and COMMIT travel in the turn's own SQL strings, not in
    #: round trips of their own (Django's atomic block is not used).
    in_sql: bool = False
    #: A BEGIN was sent in SQL: the transaction must be ended in SQL too.
    begun: bool = False
    #: The turn's last string carried the COMMIT.
    committed: bool = False


class FlowSQL(Protocol):
    """What a dialect writes in its own SQL for :func:`claim_limited`."""

    def turn(self, alias: str, plan: FlowPlan) -> AbstractContextManager[TurnScope]:
        """The transaction of one limited claim: committed on leaving, rolled back on an error."""
        ...

    def open_turn(self, alias: str, cursor: Any, plan: FlowPlan, scope: TurnScope) -> Opening:
        """Take the turn (:meth:`take_turn`), then read what the claim starts from."""
        ...

    def close_turn(
        self,
        alias: str,
        cursor: Any,
        ids: Sequence[int],
        worker_id: str,
        arrivals: Mapping[str, float],
        scope: TurnScope,
    ) -> list[ClaimedJob]:
        """Lease ``ids`` (:meth:`lease`) and write ``arrivals`` (:meth:`upsert_rates`): the
        turn's last writes. A dialect may commit the transaction with them."""
        ...

    def take_turn(self, alias: str, cursor: Any) -> None:
        """Wait for this transaction's turn among the fleet's limited claims."""
        ...

    def now_seconds(self, alias: str, cursor: Any) -> float:
        """The database clock in seconds since the epoch."""
        ...

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
        """Due jobs in claim order but those of ``blocked_tasks`` and ``blocked_keys``, and
        the retries (jobs attempted before) of ``blocked_retries``.

        Each as ``(id, task, queue, flow_keys, attempts)``. ``per_key`` is the most jobs one
        stored key can start in a claim (its concurrency, or its burst): a dialect that reads
        key by key needs no more of each. ``watched`` are keys with room that recently filled
        up within a claim and hid the rows behind them: such a dialect may read key by key
        when one of them still has many jobs queued. A dialect may ignore both.
        """
        ...

    def lease(self, alias: str, cursor: Any, ids: Sequence[int], worker_id: str) -> list[ClaimedJob]:
        """Lease the jobs ``ids`` (still queued) as the plain claim leases its rows."""
        ...

    def upsert_rates(self, alias: str, cursor: Any, arrivals: Mapping[str, float]) -> None:
        """Write each rate key's new theoretical arrival time (insert or replace)."""
        ...

    def ensure_breakers(self, alias: str, cursor: Any, names: Sequence[str]) -> None:
        """Insert a closed breaker row for each of ``names`` that has none; leave the others."""
        ...


class SequentialTurn:
    """:meth:`FlowSQL.turn` as Django's atomic block, and :meth:`FlowSQL.open_turn` and
    :meth:`FlowSQL.close_turn` as one statement after another (MariaDB/MySQL, SQLite)."""

    @contextlib.contextmanager
    def turn(self, alias: str, plan: FlowPlan) -> Iterator[TurnScope]:
        with transaction.atomic(using=alias):
            yield TurnScope()

    def open_turn(self, alias: str, cursor: Any, plan: FlowPlan, scope: TurnScope) -> Opening:
        flow_sql: FlowSQL = self  # type: ignore[assignment]
        flow_sql.take_turn(alias, cursor)
        paused = paused_queue_names(alias)
        cursor.execute(*running_statement(plan))
        running = list(cursor.fetchall())
        now = flow_sql.now_seconds(alias, cursor)
        key_column = connections[alias].ops.quote_name("key")  # reserved on MariaDB/MySQL
        cursor.execute(f"SELECT {key_column}, tat FROM {RATE_TABLE} WHERE tat > %s", [now])
        arrivals = {key: float(tat) for key, tat in cursor.fetchall()}
        breakers: list[Sequence[Any]] = []
        if plan.guards:
            cursor.execute(*gates_statement(plan))
            breakers = list(cursor.fetchall())
        return Opening(paused, running, now, arrivals, breakers)

    def close_turn(
        self,
        alias: str,
        cursor: Any,
        ids: Sequence[int],
        worker_id: str,
        arrivals: Mapping[str, float],
        scope: TurnScope,
    ) -> list[ClaimedJob]:
        flow_sql: FlowSQL = self  # type: ignore[assignment]
        jobs = flow_sql.lease(alias, cursor, ids, worker_id)
        if arrivals:
            flow_sql.upsert_rates(alias, cursor, arrivals)
        return jobs


class ConflictUpserts:
    """:meth:`FlowSQL.upsert_rates` and :meth:`FlowSQL.ensure_breakers` as ``INSERT ... ON CONFLICT``
    (PostgreSQL, SQLite)."""

    def upsert_rates(self, alias: str, cursor: Any, arrivals: Mapping[str, float]) -> None:
        cursor.execute(*upsert_rates_statement(arrivals))

    def ensure_breakers(self, alias: str, cursor: Any, names: Sequence[str]) -> None:
        cursor.execute(
            f"INSERT INTO {BREAKER_TABLE} ({BREAKER_INSERT_COLUMNS}) VALUES "
            + ", ".join([BREAKER_INSERT_ROW] * len(names))
            + " ON CONFLICT (name) DO NOTHING",
            [value for name in names for value in (name, False)],
        )


def upsert_rates_statement(arrivals: Mapping[str, float]) -> tuple[str, list[Any]]:
    """``INSERT ... ON CONFLICT`` of each rate key's arrival time (PostgreSQL, SQLite)."""
    return (
        f"INSERT INTO {RATE_TABLE} (key, tat) VALUES {', '.join(['(%s, %s)'] * len(arrivals))} "
        "ON CONFLICT (key) DO UPDATE SET tat = excluded.tat",
        [value for pair in arrivals.items() for value in pair],
    )


#: How much of a job's unreadable ``flow_keys`` its dead letter shows.
UNREADABLE_SHOWN_CHARS = 200


def shown_flow_keys(value: Any) -> str:
    """A row's unreadable ``flow_keys`` as its dead letter shows them: JSON, clipped."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return clip(text, UNREADABLE_SHOWN_CHARS)


def mark_unreadable(jobs: list[ClaimedJob], unreadable: Mapping[int, Any]) -> list[ClaimedJob]:
    """Mark the leased jobs whose ``flow_keys`` could not be read (by id), for the worker."""
    if unreadable:
        for job in jobs:
            if job.id in unreadable:
                job.unreadable_flow_keys = shown_flow_keys(unreadable[job.id])
    return jobs


def candidate_filters(
    due: str,
    key_held: str,
    queues: Sequence[str] | None,
    exclude: Sequence[str],
    blocked_tasks: Sequence[str],
    blocked_keys: Sequence[str],
    blocked_retries: Sequence[str],
) -> tuple[list[str], list[Any]]:
    """The WHERE conditions (and parameters) of a limited claim's candidate read, in ``%s`` style.

    For the dialects that spell lists as ``IN (%s, ...)``; ``key_held`` is a subquery, with
    ``{keys}`` for the list, that finds one of a row's flow keys among the full ones.
    """
    where = [due]
    params: list[Any] = []
    if queues:
        where.append(f"queue_name IN ({placeholders(queues)})")
        params += list(queues)
    elif exclude:
        where.append(f"queue_name NOT IN ({placeholders(exclude)})")
        params += list(exclude)
    if blocked_tasks:
        where.append(f"task_name NOT IN ({placeholders(blocked_tasks)})")
        params += list(blocked_tasks)
    if blocked_keys:
        where.append(f"NOT EXISTS ({key_held.format(keys=placeholders(blocked_keys))})")
        params += list(blocked_keys)
    if blocked_retries:
        # A spent retry budget: that dependency's first attempts still start.
        where.append(f"(attempts = 0 OR task_name NOT IN ({placeholders(blocked_retries)}))")
        params += list(blocked_retries)
    return where, params


def running_statement(plan: FlowPlan) -> tuple[str, list[Any]]:
    """The read of the running jobs of limited tasks and limited queues (and its parameters)."""
    tasks, queues = plan.limited_tasks, plan.limited_queues
    conditions = []
    params: list[Any] = []
    if tasks:
        conditions.append(f"task_name IN ({placeholders(tasks)})")
        params += tasks
    if queues:
        conditions.append(f"queue_name IN ({placeholders(queues)})")
        params += queues
    return (
        "SELECT task_name, queue_name, flow_keys FROM jobguard_job "
        f"WHERE status = 'running' AND ({' OR '.join(conditions)})",
        params,
    )


def usage(alias: str, now_sql: str, plan: FlowPlan) -> tuple[Counter[str], Counter[str]]:
    """Running jobs per concurrency key, and due queued jobs per limit key (for reports).

    Two grouped reads of the limited queues; what a claim would do is not decided here.
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(*running_statement(plan))
        running = count_running(plan, cursor.fetchall())
        queues = sorted(plan.queues)
        cursor.execute(
            "SELECT task_name, queue_name, flow_keys, count(*) FROM jobguard_job "
            f"WHERE status = 'queued' AND run_after <= {now_sql} AND attempts < max_attempts "
            f"AND queue_name IN ({placeholders(queues)}) GROUP BY task_name, queue_name, flow_keys",
            queues,
        )
        waiting = count_waiting(plan, cursor.fetchall())
    return running, waiting


def gates_statement(plan: FlowPlan) -> tuple[str, list[Any]]:
    """The read of the guarded limits' breaker rows (and its parameters)."""
    names = sorted(plan.guards)
    return f"SELECT {_BREAKER_COLUMNS} FROM {BREAKER_TABLE} WHERE name IN ({placeholders(names)})", names


def write_gates(
    sql: FlowSQL, alias: str, cursor: Any, gates: Mapping[str, GateState], now: float
) -> list[tuple[str, str, str]]:
    """Write what this claim moved; the breakers it half-opened, as ``(name, from, to)``."""
    from ..models import Breaker, BreakerEvent, BreakerState

    moved = [
        gate
        for gate in gates.values()
        if gate.budget_moved or gate.half_opened or gate.new_round or gate.probes_taken
    ]
    if not moved:
        return []
    sql.ensure_breakers(alias, cursor, [gate.name for gate in moved])
    changes = []
    for gate in moved:
        if gate.budget_moved:
            cursor.execute(
                f"UPDATE {BREAKER_TABLE} SET budget_start = %s, first_attempts = %s, retries = %s "
                "WHERE name = %s",
                [gate.budget_start, gate.first_attempts, gate.retries, gate.name],
            )
        if gate.half_opened:
            # Only from the open state it was read in: an operator or an outcome may have
            # moved it since (they do not take the claims' turn).
            updated = (
                Breaker.objects.using(alias)
                .filter(name=gate.name, state=BreakerState.OPEN, manual=False)
                .update(state=BreakerState.HALF_OPEN, probes=gate.probes_taken, half_open_since=now)
            )
            if updated:
                BreakerEvent.objects.using(alias).create(
                    name=gate.name,
                    from_state=BreakerState.OPEN,
                    to_state=BreakerState.HALF_OPEN,
                    actor_name="system",
                    reason="open time over: probing the dependency",
                )
                changes.append((gate.name, "open", "half_open"))
        elif gate.new_round:
            cursor.execute(
                f"UPDATE {BREAKER_TABLE} SET probes = %s, half_open_since = %s "
                "WHERE name = %s AND state = %s",
                [gate.probes_taken, now, gate.name, "half_open"],
            )
        elif gate.probes_taken:
            cursor.execute(
                f"UPDATE {BREAKER_TABLE} SET probes = probes + %s WHERE name = %s AND state = %s",
                [gate.probes_taken, gate.name, "half_open"],
            )
    return changes


def claim_limited(
    sql: FlowSQL,
    alias: str,
    queues: Sequence[str] | None,
    batch_size: int,
    worker_id: str,
    exclude: Sequence[str],
    plan: FlowPlan,
    throttle: Throttle | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``batch_size`` due jobs that every limit they count under has room for.

    ``throttle``, when given, receives when a rate next admits a start (the caller may claim
    again then, rather than at its next poll).
    """
    with sql.turn(alias, plan) as scope, connections[alias].cursor() as cursor:
        opening = sql.open_turn(alias, cursor, plan, scope)
        exclude = sorted({*exclude, *opening.paused})
        if queues:
            queues = [name for name in queues if name not in exclude]
            if not queues:
                return []
            exclude = []
        now, arrivals = opening.now, opening.arrivals
        gates = read_gates(plan, opening.breakers, now) if plan.guards else {}
        admission = Admission(plan, count_running(plan, opening.running), now, arrivals, gates, batch_size)
        count = batch_size * CANDIDATES_PER_JOB + CANDIDATES_EXTRA
        per_key = plan.most_per_key
        remembered = hot_keys.recent(time.monotonic())
        for _ in range(1 + REFILL_PASSES):
            blocked_tasks = admission.blocked_tasks()
            blocked_retries = admission.blocked_retries(blocked_tasks)
            blocked_queues = admission.blocked_queues()
            blocked_keys = admission.blocked_keys()
            if queues:
                queues = [name for name in queues if name not in blocked_queues]
                if not queues:
                    if not admission.admitted:
                        note_throttle(throttle, plan, admission.blocked, gates, now, arrivals)
                        return []
                    break
            else:
                exclude = sorted({*exclude, *blocked_queues})
            watched = [key for key in remembered if key not in admission.blocked]
            rows = sql.candidates(
                alias,
                cursor,
                queues,
                exclude,
                blocked_tasks,
                blocked_keys,
                count,
                blocked_retries,
                per_key,
                watched,
            )
            # Keys that filled up during this claim and hid rows behind them: a hot key's jobs
            # fill the window once its slot frees, and the cold keys' jobs behind them would
            # wait for a claim that finds it full. Read again without it (up to REFILL_PASSES).
            filled = admission.admit(rows)
            if filled:
                hot_keys.note(filled, time.monotonic())
            if admission.done or not filled or len(rows) < count:
                break
        note_throttle(throttle, plan, admission.blocked, gates, now, arrivals)
        changes = write_gates(sql, alias, cursor, gates, now) if gates else []
        if throttle is not None:
            throttle.breaker_changes = changes
        if not admission.admitted:
            return []
        # A stored key the rate table cannot hold (written before enqueue refused it, or by
        # hand) keeps no rate state: its job is leased, and the worker dead-letters it (see
        # worker/pipeline.py), rather than fail every claim of its queue.
        advanced = {
            key: tat for key, tat in admission.advanced.items() if len(key) <= MAX_STORED_RATE_KEY_LENGTH
        }
        jobs = sql.close_turn(alias, cursor, admission.admitted, worker_id, advanced, scope)
        return mark_unreadable(jobs, admission.unreadable)
