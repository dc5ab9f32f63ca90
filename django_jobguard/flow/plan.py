"""The plan of the declared limits: what a limited claim enforces, by key.

Built from plain values the caller gives (each limited task's name, queue and specs, the
queues' concurrency, the settings' shared limits), never from a task object: the caller
that holds the registry builds it (``registry.flow_plan()``) and hands it to the store's
claim. A worker builds it once at its start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from .specs import BreakerSpec, Limit, NamedLimit, Rate, RetryBudgetSpec

__all__ = ["BreakerGate", "FlowPlan", "RateSpec", "TaskLimits", "build_plan", "family"]


@dataclasses.dataclass(frozen=True, slots=True)
class TaskLimits:
    """One limited task as the plan reads it: its name, its queue and what it declares."""

    name: str
    #: The queue its jobs go to (the task's own, or the default queue).
    queue: str
    concurrency: Limit | None = None
    rate: Rate | None = None
    #: The shared limit of ``JOBGUARD["LIMITS"]`` it counts under (``@task(limit=name)``).
    limit: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerGate:
    """A named limit's breaker and retry budget (either may be None): what gates its jobs."""

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
    guards: Mapping[str, BreakerGate] = dataclasses.field(default_factory=dict)
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


def build_plan(
    queue_concurrency: Mapping[str, int],
    limits: Mapping[str, NamedLimit],
    tasks: Iterable[TaskLimits],
) -> FlowPlan | None:
    """The plan of the declared limits, or None when nothing is limited (the plain claim).

    ``queue_concurrency``: each queue's declared concurrency (``JOBGUARD["QUEUES"]``; a queue
    without one left out); ``limits``: ``JOBGUARD["LIMITS"]`` by name; ``tasks``: the limited
    tasks.
    """
    capacities: dict[str, int] = {}
    rates: dict[str, RateSpec] = {}
    task_keys: dict[str, tuple[str, ...]] = {}
    keyed_capacity: dict[str, int] = {}
    keyed_rates: dict[str, RateSpec] = {}
    templates: dict[str, str] = {}
    guards: dict[str, BreakerGate] = {}
    guarded_tasks: dict[str, str] = {}
    queues: set[str] = set()
    for name, concurrency in queue_concurrency.items():
        capacities[f"queue:{name}"] = concurrency
        queues.add(name)
    for task in tasks:
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
        shared = limits.get(task.limit) if task.limit is not None else None
        if shared is not None:
            if shared.concurrency is not None:
                capacities[f"limit:{shared.name}"] = shared.concurrency
                keys.append(f"limit:{shared.name}")
            if shared.rate is not None:
                rates[f"rate:limit:{shared.name}"] = RateSpec.of(shared.rate)
                keys.append(f"rate:limit:{shared.name}")
            if shared.breaker is not None or shared.retry_budget is not None:
                guards[shared.name] = BreakerGate(shared.breaker, shared.retry_budget)
                guarded_tasks[task.name] = shared.name
        task_keys[task.name] = tuple(keys)
        queues.add(task.queue)
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


def family(key: str) -> str:
    """The limit a key belongs to: the key itself, or ``c:<task>`` / ``r:<task>`` for a keyed one."""
    return key.split("|", 1)[0] if key[:2] in ("c:", "r:") else key
