"""Flow control at claim: the limited claim, written once for every database.

A claim of the queues where limits are declared (``@task(concurrency=, rate=, limit=)``,
``JOBGUARD["QUEUES"][name]["concurrency"]``) goes through :func:`claim_limited` instead of
the dialect's one-statement claim; every other claim keeps that statement, so a project's
unlimited queues pay nothing for limits elsewhere.

One limited claim is one transaction, and limited claims take turns across the fleet (a
transaction-scoped advisory lock on PostgreSQL, the write lock on SQLite):

1. count the running jobs of every concurrency key, from the job rows themselves: a slot
   *is* a running job, so it frees when the job's lease ends, however it ends (an ack, a
   retry, the reaper taking back a killed worker's lease);
2. read the rate keys that cannot start a job now (GCRA: a key's theoretical arrival time
   more than its burst ahead of the clock);
3. read due jobs in claim order, leaving out those of full or throttled keys in the SQL
   itself, so a saturated key never stands in front of the others (no head-of-line blocking);
4. admit them in order while each of their keys has room, and lease the admitted ones;
5. write the admitted rate keys' new arrival times.

Counting and leasing in one turn is what keeps "never more than N": a running count can
only fall while a turn is under way (acks and the reaper do not take the lock), so the
count a turn reads is never below the truth when its leases commit.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from django.db import connections, transaction

from ._common import ClaimedJob, paused_queue_names

if TYPE_CHECKING:
    from ..conf import Settings
    from ..flow import Rate
    from ..task import Task

__all__ = ["FlowPlan", "FlowSQL", "RateSpec", "Throttle", "build_plan", "claim_limited"]

#: Due jobs read per job the claim may take: room to pass over jobs of keys that fill up
#: within this claim (a key with one slot left and ten due jobs) and still fill the batch.
CANDIDATES_PER_JOB = 4
CANDIDATES_EXTRA = 16
#: Float slack when comparing arrival times (seconds): well under any rate's interval.
_EPSILON = 1e-6
RATE_TABLE = "jobguard_flowrate"


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
        task_keys[task.name] = tuple(keys)
        queues.add(task.queue_name or conf.default_queue)
    if not queues:
        return None
    return FlowPlan(capacities, rates, task_keys, keyed_capacity, keyed_rates, frozenset(queues), templates)


class FlowSQL(Protocol):
    """What a dialect writes in its own SQL for :func:`claim_limited`."""

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
    ) -> list[tuple[int, str, str, Any]]:
        """Due jobs in claim order but those of ``blocked_tasks`` and ``blocked_keys``.

        Each as ``(id, task, queue, flow_keys)``.
        """
        ...

    def lease(self, alias: str, cursor: Any, ids: Sequence[int], worker_id: str) -> list[ClaimedJob]:
        """Lease the jobs ``ids`` (still queued) as the plain claim leases its rows."""
        ...


def _keys(value: Any) -> list[str]:
    if isinstance(value, str | bytes):
        value = json.loads(value)
    return list(value or [])


def _placeholders(values: Sequence[Any]) -> str:
    return ", ".join(["%s"] * len(values))


def running_counts(cursor: Any, plan: FlowPlan) -> Counter[str]:
    """Running jobs per concurrency key (the rows of limited tasks and limited queues only)."""
    tasks, queues = plan.limited_tasks, plan.limited_queues
    conditions = []
    params: list[Any] = []
    if tasks:
        conditions.append(f"task_name IN ({_placeholders(tasks)})")
        params += tasks
    if queues:
        conditions.append(f"queue_name IN ({_placeholders(queues)})")
        params += queues
    cursor.execute(
        "SELECT task_name, queue_name, flow_keys FROM jobguard_job "
        f"WHERE status = 'running' AND ({' OR '.join(conditions)})",
        params,
    )
    counts: Counter[str] = Counter()
    for task_name, queue_name, flow_keys in cursor.fetchall():
        for key in plan.keys_of(task_name, queue_name, _keys(flow_keys)):
            if plan.capacity(key) is not None:
                counts[key] += 1
    return counts


def _next_start(plan: FlowPlan, arrivals: Mapping[str, float], now: float) -> float | None:
    """Seconds until the earliest throttled rate key admits a start again, or None."""
    waits = []
    for key, arrival in arrivals.items():
        rate = plan.rate(key)
        if rate is not None and arrival - now > rate.tolerance + _EPSILON:
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
        running = running_counts(cursor, plan)
        queues = sorted(plan.queues)
        cursor.execute(
            "SELECT task_name, queue_name, flow_keys, count(*) FROM jobguard_job "
            f"WHERE status = 'queued' AND run_after <= {now_sql} AND attempts < max_attempts "
            f"AND queue_name IN ({_placeholders(queues)}) GROUP BY task_name, queue_name, flow_keys",
            queues,
        )
        waiting: Counter[str] = Counter()
        for task_name, queue_name, flow_keys, count in cursor.fetchall():
            for key in plan.keys_of(task_name, queue_name, _keys(flow_keys)):
                waiting[key] += count
    return running, waiting


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
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        sql.take_turn(alias, cursor)
        exclude = sorted({*exclude, *paused_queue_names(alias)})
        if queues:
            queues = [name for name in queues if name not in exclude]
            if not queues:
                return []
            exclude = []
        running = running_counts(cursor, plan)
        now = sql.now_seconds(alias, cursor)
        cursor.execute(f"SELECT key, tat FROM {RATE_TABLE} WHERE tat > %s", [now])
        arrivals = {key: float(tat) for key, tat in cursor.fetchall()}

        def full(key: str) -> bool:
            capacity = plan.capacity(key)
            if capacity is not None and running[key] >= capacity:
                return True
            rate = plan.rate(key)
            return rate is not None and max(arrivals.get(key, now), now) - now > rate.tolerance + _EPSILON

        blocked = {key for key in [*running, *arrivals] if full(key)}
        blocked_tasks = sorted(task for task, keys in plan.task_keys.items() if blocked.intersection(keys))
        blocked_queues = {key[6:] for key in blocked if key.startswith("queue:")}
        blocked_keys = sorted(key for key in blocked if key[:2] in ("c:", "r:"))
        if queues:
            queues = [name for name in queues if name not in blocked_queues]
            if not queues:
                return []
        else:
            exclude = sorted({*exclude, *blocked_queues})
        rows = sql.candidates(
            alias,
            cursor,
            queues,
            exclude,
            blocked_tasks,
            blocked_keys,
            limit * CANDIDATES_PER_JOB + CANDIDATES_EXTRA,
        )
        admitted: list[int] = []
        advanced: dict[str, float] = {}
        for job_id, task_name, queue_name, flow_keys in rows:
            keys = plan.keys_of(task_name, queue_name, _keys(flow_keys))
            if any(full(key) for key in keys):
                continue
            admitted.append(job_id)
            for key in keys:
                if plan.capacity(key) is not None:
                    running[key] += 1
                rate = plan.rate(key)
                if rate is not None:
                    arrivals[key] = advanced[key] = max(arrivals.get(key, now), now) + rate.interval
            if len(admitted) >= limit:
                break
        if throttle is not None:
            throttle.retry_after = _next_start(plan, arrivals, now)
        if not admitted:
            return []
        jobs = sql.lease(alias, cursor, admitted, worker_id)
        if advanced:
            cursor.execute(
                f"INSERT INTO {RATE_TABLE} (key, tat) VALUES {', '.join(['(%s, %s)'] * len(advanced))} "
                "ON CONFLICT (key) DO UPDATE SET tat = excluded.tat",
                [value for pair in advanced.items() for value in pair],
            )
        return jobs
