"""Flow control at claim: the limited claim, written once for every database.

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

Counting and leasing in one turn is what keeps "never more than N": a running count can
only fall while a turn is under way (acks and the reaper do not take the lock), so the
count a turn reads is never below the truth when its leases commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from django.db import connections, transaction

from .._text import clip
from ..flow import MAX_STORED_RATE_KEY_LENGTH, stored_flow_keys
from .common import ClaimedJob, paused_queue_names, placeholders

if TYPE_CHECKING:
    from ..conf import BreakerSpec, RetryBudgetSpec, Settings
    from ..flow import Rate
    from ..task import Task

__all__ = [
    "TURN_KEY",
    "ConflictUpserts",
    "FlowPlan",
    "FlowSQL",
    "Guard",
    "Opening",
    "RateSpec",
    "SequentialTurn",
    "Throttle",
    "TurnScope",
    "build_plan",
    "claim_limited",
]

#: Due jobs read per job the claim may take: room to pass over jobs of keys that fill up
#: within this claim (a key with one slot left and ten due jobs) and still fill the batch.
CANDIDATES_PER_JOB = 4
CANDIDATES_EXTRA = 16
#: Candidate reads a limited claim makes again, after keys that filled up during it hid the
#: rows of other keys (one hot key must not stall the rest; each pass costs one more read).
REFILL_PASSES = 2
#: Seconds a key that filled up within a claim and hid other rows is remembered as hot: the
#: process's next claims ask the dialect to read around it from their first read (see
#: :meth:`FlowSQL.candidates`' ``watched``), rather than read its rows and then again.
HOT_KEY_MEMORY_SECONDS = 10.0
#: At most this many such keys are remembered (the most recent).
HOT_KEYS_REMEMBERED = 16
#: Float slack when comparing arrival times (seconds): well under any rate's interval.
EPSILON = 1e-6
RATE_TABLE = "jobguard_flowrate"
BREAKER_TABLE = "jobguard_breaker"
#: The rate table's row whose lock is the limited claims' turn on a database without a
#: transaction-scoped advisory lock (MariaDB/MySQL). Its ``tat`` stays 0, so a claim never
#: reads it as a rate, and pruning leaves it alone; no rate key has this form.
TURN_KEY = "flow:turn"
#: A breaker row as the claim reads it.
_BREAKER_COLUMNS = (
    "name, state, open_until, manual, probes, half_open_since, budget_start, first_attempts, retries"
)
#: A new breaker row (closed, no counts): its columns, and one row's values (name, manual).
BREAKER_INSERT_COLUMNS = (
    "name, state, manual, probes, window_start, calls, failures, budget_start, first_attempts, retries, "
    "changed_by_name, reason"
)
BREAKER_INSERT_ROW = "(%s, 'closed', %s, 0, 0, 0, 0, 0, 0, 0, '', '')"


@dataclasses.dataclass(frozen=True, slots=True)
class Guard:
    """A named limit's breaker and retry budget (either may be None)."""

    breaker: BreakerSpec | None
    budget: RetryBudgetSpec | None


@dataclasses.dataclass(frozen=True, slots=True)
class RateSpec:
    """A rate, as GCRA reads it: seconds between starts, and how many may start at once."""

    interval: float
    burst: int

    @classmethod
    def of(cls, rate: Rate) -> RateSpec:
        return cls(interval=rate.interval, burst=rate.burst_size)

    @property
    def tolerance(self) -> float:
        """How far ahead of the clock a key's arrival time may run and still admit a start."""
        return (self.burst - 1) * self.interval


@dataclasses.dataclass(slots=True)
class Throttle:
    """What a limited claim tells its caller beside the jobs: when a rate next admits a start."""

    #: Seconds until the earliest rate key that held jobs back admits one again; None if no
    #: rate held any back (a full concurrency key frees only when a job ends).
    retry_after: float | None = None
    #: What was closed to some jobs in this claim: a concurrency key at its bound, a rate key
    #: ahead of the clock, an open breaker, a spent retry budget.
    held_back: set[str] = dataclasses.field(default_factory=set)
    #: Breakers this claim moved, as ``(name, from state, to state)``.
    breaker_changes: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    #: Each breaker's state as this claim read it (after any half-opening it made).
    breaker_states: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class FlowPlan:
    """The limits a claim enforces, by key.

    Keys: ``queue:<name>`` (a queue's concurrency), ``task:<name>`` and ``limit:<name>``
    (a task's unkeyed concurrency, a shared limit's), ``rate:task:<name>`` and
    ``rate:limit:<name>`` (their rates), and the keys stored with each job,
    ``c:<task>|<key>`` and ``r:<task>|<key>`` (keyed concurrency and rate).
    """

    #: Concurrency per unkeyed key (``queue:``, ``task:``, ``limit:``).
    capacities: Mapping[str, int]
    #: Rate per unkeyed key (``rate:task:``, ``rate:limit:``).
    rates: Mapping[str, RateSpec]
    #: Each limited task's unkeyed keys (its own and its shared limit's).
    task_keys: Mapping[str, tuple[str, ...]]
    #: Concurrency per key of a task's stored ``c:`` keys.
    keyed_capacity: Mapping[str, int]
    #: Rate per key of a task's stored ``r:`` keys.
    keyed_rates: Mapping[str, RateSpec]
    #: The queues the limited claim serves: queues with a concurrency, limited tasks' queues.
    queues: frozenset[str]
    #: The key template of each keyed family (``c:<task>``, ``r:<task>``), for reports.
    templates: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The breaker and budget of each named limit that declares one.
    guards: Mapping[str, Guard] = dataclasses.field(default_factory=dict)
    #: The guarded named limit of each task that uses one.
    guarded_tasks: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The most jobs one stored key may start at once (None when no limit is keyed): a claim
    #: reads no more of one key's jobs than this.
    most_per_key: int | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        bounds = [*self.keyed_capacity.values(), *(rate.burst for rate in self.keyed_rates.values())]
        object.__setattr__(self, "most_per_key", max(bounds, default=None))

    def covers(self, queues: Sequence[str] | None, exclude: Sequence[str]) -> bool:
        """Whether a claim of ``queues`` (all but ``exclude`` if None) may meet a limited job."""
        if queues is None:
            return bool(self.queues - set(exclude))
        return not self.queues.isdisjoint(queues)

    @property
    def limited_tasks(self) -> list[str]:
        return sorted(self.task_keys)

    @property
    def limited_queues(self) -> list[str]:
        return sorted(key[6:] for key in self.capacities if key.startswith("queue:"))

    def keys_of(self, task_name: str, queue_name: str, flow_keys: Iterable[str]) -> list[str]:
        """Every limit key a job counts under."""
        keys = [*self.task_keys.get(task_name, ()), *flow_keys]
        if f"queue:{queue_name}" in self.capacities:
            keys.append(f"queue:{queue_name}")
        return keys

    def capacity(self, key: str) -> int | None:
        """The concurrency of ``key``; None if it is not a concurrency key (or no longer declared)."""
        if key.startswith("c:"):
            return self.keyed_capacity.get(key[2:].split("|", 1)[0])
        return self.capacities.get(key)

    def rate(self, key: str) -> RateSpec | None:
        """The rate of ``key``; None if it is not a rate key (or no longer declared)."""
        if key.startswith("r:"):
            return self.keyed_rates.get(key[2:].split("|", 1)[0])
        return self.rates.get(key)


def build_plan(conf: Settings, tasks: Iterable[Task[Any, Any]]) -> FlowPlan | None:
    """The plan of the declared limits, or None when nothing is limited (the plain claim)."""
    capacities: dict[str, int] = {}
    rates: dict[str, RateSpec] = {}
    task_keys: dict[str, tuple[str, ...]] = {}
    keyed_capacity: dict[str, int] = {}
    keyed_rates: dict[str, RateSpec] = {}
    templates: dict[str, str] = {}
    guards: dict[str, Guard] = {}
    guarded_tasks: dict[str, str] = {}
    queues: set[str] = set()
    for name, queue in conf.queues.items():
        if queue.concurrency is not None:
            capacities[f"queue:{name}"] = queue.concurrency
            queues.add(name)
    for task in tasks:
        if not getattr(task, "limited", False):
            continue
        keys: list[str] = []
        if task.concurrency is not None:
            if task.concurrency.key is None:
                capacities[f"task:{task.name}"] = task.concurrency.n
                keys.append(f"task:{task.name}")
            else:
                keyed_capacity[task.name] = task.concurrency.n
                templates[f"c:{task.name}"] = task.concurrency.key
        if task.rate is not None:
            if task.rate.key is None:
                rates[f"rate:task:{task.name}"] = RateSpec.of(task.rate)
                keys.append(f"rate:task:{task.name}")
            else:
                keyed_rates[task.name] = RateSpec.of(task.rate)
                templates[f"r:{task.name}"] = task.rate.key
        shared = conf.limits.get(task.limit) if task.limit is not None else None
        if shared is not None:
            if shared.concurrency is not None:
                capacities[f"limit:{shared.name}"] = shared.concurrency
                keys.append(f"limit:{shared.name}")
            if shared.rate is not None:
                rates[f"rate:limit:{shared.name}"] = RateSpec.of(shared.rate)
                keys.append(f"rate:limit:{shared.name}")
            if shared.breaker is not None or shared.retry_budget is not None:
                guards[shared.name] = Guard(shared.breaker, shared.retry_budget)
                guarded_tasks[task.name] = shared.name
        task_keys[task.name] = tuple(keys)
        queues.add(task.queue_name or conf.default_queue)
    if not queues:
        return None
    return FlowPlan(
        capacities,
        rates,
        task_keys,
        keyed_capacity,
        keyed_rates,
        frozenset(queues),
        templates,
        guards,
        guarded_tasks,
    )


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


def read_flow_keys(value: Any) -> list[str] | None:
    """A row's ``flow_keys`` as the database returns them (JSON text, or decoded) as its keys;
    None when they are not a JSON array of strings (see :func:`~django_jobguard.flow.stored_flow_keys`)."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return stored_flow_keys(value)


def _keys(value: Any) -> list[str]:
    """A row's stored flow keys; none when they cannot be read (the job is then dead-lettered)."""
    keys = read_flow_keys(value)
    return [] if keys is None else keys


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


def count_running(plan: FlowPlan, rows: Iterable[tuple[str, str, Any]]) -> Counter[str]:
    """Running jobs per concurrency key, from the rows of :func:`running_statement`."""
    counts: Counter[str] = Counter()
    for task_name, queue_name, flow_keys in rows:
        for key in plan.keys_of(task_name, queue_name, _keys(flow_keys)):
            if plan.capacity(key) is not None:
                counts[key] += 1
    return counts


def _next_start(plan: FlowPlan, arrivals: Mapping[str, float], now: float) -> float | None:
    """Seconds until the earliest throttled rate key admits a start again, or None."""
    waits = []
    for key, arrival in arrivals.items():
        rate = plan.rate(key)
        if rate is not None and arrival - now > rate.tolerance + EPSILON:
            waits.append(arrival - now - rate.tolerance)
    return min(waits) if waits else None


def family(key: str) -> str:
    """The limit a key belongs to: the key itself, or ``c:<task>`` / ``r:<task>`` for a keyed one."""
    return key.split("|", 1)[0] if key[:2] in ("c:", "r:") else key


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
        waiting: Counter[str] = Counter()
        for task_name, queue_name, flow_keys, count in cursor.fetchall():
            for key in plan.keys_of(task_name, queue_name, _keys(flow_keys)):
                waiting[key] += count
    return running, waiting


@dataclasses.dataclass(slots=True)
class _Gate:
    """A guarded limit inside one limited claim: what its breaker and budget let through."""

    name: str
    guard: Guard
    state: str = "closed"
    open_until: float | None = None
    manual: bool = False
    #: Half-open: probes this claim may still admit (None: not half-open, no cap).
    probe_room: int | None = None
    probes_taken: int = 0
    budget_start: float = 0.0
    first_attempts: int = 0
    retries: int = 0
    #: What this claim writes back: the budget's counts, a half-opening, a new probe round.
    budget_moved: bool = False
    half_opened: bool = False
    new_round: bool = False

    @property
    def closed_to_all(self) -> bool:
        return self.state == "open" or (self.probe_room is not None and self.probe_room <= 0)

    @property
    def retries_spent(self) -> bool:
        budget = self.guard.budget
        return budget is not None and self.retries >= budget.allowed(self.first_attempts)

    def admits(self, attempts: int) -> bool:
        return not self.closed_to_all and not (attempts > 0 and self.retries_spent)

    def admit(self, attempts: int) -> None:
        if self.probe_room is not None:
            self.probe_room -= 1
            self.probes_taken += 1
        if self.guard.budget is not None:
            self.budget_moved = True
            if attempts > 0:
                self.retries += 1
            else:
                self.first_attempts += 1

    def wait(self, now: float) -> float | None:
        """Seconds until this gate may admit more, when it is the reason jobs wait."""
        if self.state == "open":
            return None if self.open_until is None else max(0.0, self.open_until - now)
        if self.closed_to_all and self.guard.breaker is not None:
            return self.guard.breaker.open_for
        if self.retries_spent and self.guard.budget is not None:
            return max(0.0, self.budget_start + self.guard.budget.window - now)
        return None


def gates_statement(plan: FlowPlan) -> tuple[str, list[Any]]:
    """The read of the guarded limits' breaker rows (and its parameters)."""
    names = sorted(plan.guards)
    return f"SELECT {_BREAKER_COLUMNS} FROM {BREAKER_TABLE} WHERE name IN ({placeholders(names)})", names


def read_gates(plan: FlowPlan, breaker_rows: Iterable[Sequence[Any]], now: float) -> dict[str, _Gate]:
    """The guarded limits' breaker and budget state, from the rows of :func:`gates_statement`.

    An open breaker whose time is up half-opens here, and a half-open one whose probes all
    went out ``open_for`` ago with no verdict (their workers died) starts a new probe round.
    """
    names = sorted(plan.guards)
    rows = {row[0]: row for row in breaker_rows}
    gates: dict[str, _Gate] = {}
    for name in names:
        guard = plan.guards[name]
        gate = gates[name] = _Gate(name, guard)
        row = rows.get(name)
        if row is None:
            continue
        _, state, open_until, manual, probes, half_open_since, budget_start, first_attempts, retries = row
        breaker = guard.breaker
        if breaker is not None:
            gate.state, gate.open_until, gate.manual = state, open_until, bool(manual)
            if state == "open" and not gate.manual and open_until is not None and open_until <= now:
                gate.state, gate.half_opened, probes, half_open_since = "half_open", True, 0, now
            if gate.state == "half_open":
                since = half_open_since if half_open_since is not None else now
                if probes >= breaker.probes and now - since >= breaker.open_for:
                    gate.new_round, probes = True, 0
                gate.probe_room = breaker.probes - probes
        budget = guard.budget
        if budget is not None and now - float(budget_start) < budget.window:
            gate.budget_start, gate.first_attempts = float(budget_start), first_attempts
            gate.retries = retries
    for gate in gates.values():
        if gate.guard.budget is not None and not gate.budget_start:
            gate.budget_start = now
    return gates


def write_gates(
    sql: FlowSQL, alias: str, cursor: Any, gates: Mapping[str, _Gate], now: float
) -> list[tuple[str, str, str]]:
    """Write what this claim moved; the breakers it half-opened, as ``(name, from, to)``."""
    from ..models import Breaker, BreakerEvent, BreakerState

    moved = [gate for gate in gates.values() if gate.budget_moved or gate.half_opened or gate.new_round]
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


def note_throttle(
    throttle: Throttle | None,
    plan: FlowPlan,
    blocked: set[str],
    gates: Mapping[str, _Gate],
    now: float,
    arrivals: Mapping[str, float],
) -> None:
    """Tell the caller what held jobs back, and when the earliest of them admits more."""
    if throttle is None:
        return
    throttle.breaker_states = {name: gate.state for name, gate in gates.items() if gate.guard.breaker}
    waits = [wait] if (wait := _next_start(plan, arrivals, now)) is not None else []
    for key in blocked:
        throttle.held_back.add("concurrency" if plan.capacity(key) is not None else "rate")
    for gate in gates.values():
        if gate.closed_to_all:
            throttle.held_back.add("breaker")
        elif gate.retries_spent:
            throttle.held_back.add("budget")
        else:
            continue
        if (gate_wait := gate.wait(now)) is not None:
            waits.append(gate_wait)
    throttle.retry_after = min(waits) if waits else None


class _HotKeys:
    """Keys this process saw fill up within a claim while their rows hid others' (recent first)."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def note(self, keys: Iterable[str], now: float) -> None:
        with self._lock:
            for key in keys:
                self._seen.pop(key, None)
                self._seen[key] = now
            while len(self._seen) > HOT_KEYS_REMEMBERED:
                del self._seen[next(iter(self._seen))]

    def recent(self, now: float) -> list[str]:
        with self._lock:
            return [key for key, seen in self._seen.items() if now - seen < HOT_KEY_MEMORY_SECONDS]

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


hot_keys = _HotKeys()


def claim_limited(
    sql: FlowSQL,
    alias: str,
    queues: Sequence[str] | None,
    limit: int,
    worker_id: str,
    exclude: Sequence[str],
    plan: FlowPlan,
    throttle: Throttle | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs that every limit they count under has room for.

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
        running = count_running(plan, opening.running)
        now, arrivals = opening.now, opening.arrivals

        def full(key: str) -> bool:
            capacity = plan.capacity(key)
            if capacity is not None and running[key] >= capacity:
                return True
            rate = plan.rate(key)
            return rate is not None and max(arrivals.get(key, now), now) - now > rate.tolerance + EPSILON

        blocked = {key for key in [*running, *arrivals] if full(key)}
        gates = read_gates(plan, opening.breakers, now) if plan.guards else {}
        closed = {name for name, gate in gates.items() if gate.closed_to_all}
        spent = {name for name, gate in gates.items() if gate.retries_spent}
        admitted: list[int] = []
        advanced: dict[str, float] = {}
        seen: set[int] = set()
        # Admitted jobs whose stored flow keys are not a list of strings, with what they hold:
        # counted under none of them, leased, and dead-lettered by the worker, rather than
        # fail this claim and every one after it.
        unreadable: dict[int, Any] = {}
        count = limit * CANDIDATES_PER_JOB + CANDIDATES_EXTRA
        per_key = plan.most_per_key
        remembered = hot_keys.recent(time.monotonic())
        for _ in range(1 + REFILL_PASSES):
            blocked_tasks = sorted(
                task
                for task, keys in plan.task_keys.items()
                if blocked.intersection(keys) or plan.guarded_tasks.get(task) in closed
            )
            blocked_retries = sorted(
                task
                for task, name in plan.guarded_tasks.items()
                if name in spent and task not in blocked_tasks
            )
            blocked_queues = {key[6:] for key in blocked if key.startswith("queue:")}
            blocked_keys = sorted(key for key in blocked if key[:2] in ("c:", "r:"))
            if queues:
                queues = [name for name in queues if name not in blocked_queues]
                if not queues:
                    if not admitted:
                        note_throttle(throttle, plan, blocked, gates, now, arrivals)
                        return []
                    break
            else:
                exclude = sorted({*exclude, *blocked_queues})
            watched = [key for key in remembered if key not in blocked]
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
            filled = False
            for job_id, task_name, queue_name, flow_keys, attempts in rows:
                if job_id in seen:
                    continue  # our own lock from the pass before: SKIP LOCKED returns it again
                seen.add(job_id)
                stored = read_flow_keys(flow_keys)
                keys = plan.keys_of(task_name, queue_name, stored or [])
                if any(full(key) for key in keys):
                    newly = {key for key in keys if full(key)} - blocked
                    if newly:
                        filled = True
                        hot_keys.note(newly, time.monotonic())
                    blocked.update(newly)
                    continue
                gate = gates.get(plan.guarded_tasks.get(task_name, ""))
                if gate is not None:
                    if not gate.admits(attempts):
                        continue
                    gate.admit(attempts)
                admitted.append(job_id)
                if stored is None:
                    unreadable[job_id] = flow_keys
                for key in keys:
                    if plan.capacity(key) is not None:
                        running[key] += 1
                    rate = plan.rate(key)
                    if rate is not None:
                        arrivals[key] = advanced[key] = max(arrivals.get(key, now), now) + rate.interval
                if len(admitted) >= limit:
                    break
            if len(admitted) >= limit or not filled or len(rows) < count:
                break
        note_throttle(throttle, plan, blocked, gates, now, arrivals)
        changes = write_gates(sql, alias, cursor, gates, now) if gates else []
        if throttle is not None:
            throttle.breaker_changes = changes
        if not admitted:
            return []
        # A stored key the rate table cannot hold (written before enqueue refused it, or by
        # hand) keeps no rate state: its job is leased, and the worker dead-letters it (see
        # worker/pipeline.py), rather than fail every claim of its queue.
        advanced = {key: tat for key, tat in advanced.items() if len(key) <= MAX_STORED_RATE_KEY_LENGTH}
        jobs = sql.close_turn(alias, cursor, admitted, worker_id, advanced, scope)
        return mark_unreadable(jobs, unreadable)
