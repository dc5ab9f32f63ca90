"""Admission: which due jobs a limited claim may start, decided from what its turn read.

The store's limited claim (``store/flow_sql.py``) takes the fleet's turn, reads the running
jobs, the rate keys' arrival times, the breaker rows and the candidate jobs, and asks this
module what to do with them; it writes back what was decided. Nothing here touches a
database, so every decision is unit-tested on plain values:

- a concurrency key is full when its running jobs reach its bound; a rate key when its
  theoretical arrival time (GCRA) runs more than its burst's tolerance ahead of the clock;
- candidate jobs are admitted in claim order while every key they count under has room, so a
  full key holds back only its own jobs;
- a named limit's breaker and retry budget gate its tasks' jobs (:class:`GateState`): open,
  none pass; half-open, its probes do; a spent budget passes first attempts only;
- a key that fills up within a claim and hides other keys' rows is remembered as hot for a
  while (:data:`hot_keys`), so the process's next claims read around it from the start.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .plan import BreakerGate, FlowPlan
from .specs import read_flow_keys

__all__ = [
    "BREAKER_FIELDS",
    "CANDIDATES_EXTRA",
    "CANDIDATES_PER_JOB",
    "EPSILON",
    "HOT_KEYS_REMEMBERED",
    "HOT_KEY_MEMORY_SECONDS",
    "REFILL_PASSES",
    "Admission",
    "GateState",
    "HotKeys",
    "Throttle",
    "count_running",
    "count_waiting",
    "gates_of",
    "hot_keys",
    "next_start",
    "note_throttle",
    "read_gates",
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
#: ``FlowSQL.candidates``' ``watched`` in the store), rather than read its rows and then again.
HOT_KEY_MEMORY_SECONDS = 10.0
#: At most this many such keys are remembered (the most recent).
HOT_KEYS_REMEMBERED = 16
#: Float slack when comparing arrival times (seconds): well under any rate's interval.
EPSILON = 1e-6
#: A breaker row as admission reads it (:func:`read_gates`), in this order: the store reads
#: these columns of the breaker table.
BREAKER_FIELDS = (
    "name",
    "state",
    "open_until",
    "manual",
    "probes",
    "half_open_since",
    "budget_start",
    "first_attempts",
    "retries",
)


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


@dataclasses.dataclass(slots=True)
class GateState:
    """A guarded limit inside one limited claim: what its breaker and budget let through."""

    name: str
    gate: BreakerGate
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
        budget = self.gate.budget
        return budget is not None and self.retries >= budget.allowed(self.first_attempts)

    def admits(self, attempts: int) -> bool:
        return not self.closed_to_all and not (attempts > 0 and self.retries_spent)

    def admit(self, attempts: int) -> None:
        if self.probe_room is not None:
            self.probe_room -= 1
            self.probes_taken += 1
        if self.gate.budget is not None:
            self.budget_moved = True
            if attempts > 0:
                self.retries += 1
            else:
                self.first_attempts += 1

    def wait(self, now: float) -> float | None:
        """Seconds until this gate may admit more, when it is the reason jobs wait."""
        if self.state == "open":
            return None if self.open_until is None else max(0.0, self.open_until - now)
        if self.closed_to_all and self.gate.breaker is not None:
            return self.gate.breaker.open_for
        if self.retries_spent and self.gate.budget is not None:
            return max(0.0, self.budget_start + self.gate.budget.window - now)
        return None


def read_gates(plan: FlowPlan, breaker_rows: Iterable[Sequence[Any]], now: float) -> dict[str, GateState]:
    """The guarded limits' breaker and budget state, from their breaker rows (:data:`BREAKER_FIELDS`).

    An open breaker whose time is up half-opens here, and a half-open one whose probes all
    went out ``open_for`` ago with no verdict (their workers died) starts a new probe round.
    """
    return gates_of(plan.guards, breaker_rows, now)


def gates_of(
    guards: Mapping[str, BreakerGate], breaker_rows: Iterable[Sequence[Any]], now: float
) -> dict[str, GateState]:
    """:func:`read_gates` for the named limits ``guards`` (the outbox relay's, which has no plan)."""
    names = sorted(guards)
    rows = {row[0]: row for row in breaker_rows}
    gates: dict[str, GateState] = {}
    for name in names:
        declared = guards[name]
        gate = gates[name] = GateState(name, declared)
        row = rows.get(name)
        if row is None:
            continue
        _, state, open_until, manual, probes, half_open_since, budget_start, first_attempts, retries = row
        breaker = declared.breaker
        if breaker is not None:
            gate.state, gate.open_until, gate.manual = state, open_until, bool(manual)
            if state == "open" and not gate.manual and open_until is not None and open_until <= now:
                gate.state, gate.half_opened, probes, half_open_since = "half_open", True, 0, now
            if gate.state == "half_open":
                since = half_open_since if half_open_since is not None else now
                if probes >= breaker.probes and now - since >= breaker.open_for:
                    gate.new_round, probes = True, 0
                gate.probe_room = breaker.probes - probes
        budget = declared.budget
        if budget is not None and now - float(budget_start) < budget.window:
            gate.budget_start, gate.first_attempts = float(budget_start), first_attempts
            gate.retries = retries
    for gate in gates.values():
        if gate.gate.budget is not None and not gate.budget_start:
            gate.budget_start = now
    return gates


def next_start(plan: FlowPlan, arrivals: Mapping[str, float], now: float) -> float | None:
    """Seconds until the earliest throttled rate key admits a start again, or None."""
    waits = []
    for key, arrival in arrivals.items():
        rate = plan.rate(key)
        if rate is not None and arrival - now > rate.tolerance + EPSILON:
            waits.append(arrival - now - rate.tolerance)
    return min(waits) if waits else None


def note_throttle(
    throttle: Throttle | None,
    plan: FlowPlan,
    blocked: set[str],
    gates: Mapping[str, GateState],
    now: float,
    arrivals: Mapping[str, float],
) -> None:
    """Tell the caller what held jobs back, and when the earliest of them admits more."""
    if throttle is None:
        return
    throttle.breaker_states = {name: gate.state for name, gate in gates.items() if gate.gate.breaker}
    waits = [wait] if (wait := next_start(plan, arrivals, now)) is not None else []
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


class HotKeys:
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


#: This process's hot keys, shared by its claims.
hot_keys = HotKeys()


def _keys(value: Any) -> list[str]:
    """A row's stored flow keys; none when they cannot be read (the job is then dead-lettered)."""
    keys = read_flow_keys(value)
    return [] if keys is None else keys


def count_running(plan: FlowPlan, rows: Iterable[tuple[str, str, Any]]) -> Counter[str]:
    """Running jobs per concurrency key, from ``(task_name, queue_name, flow_keys)`` rows."""
    counts: Counter[str] = Counter()
    for task_name, queue_name, flow_keys in rows:
        for key in plan.keys_of(task_name, queue_name, _keys(flow_keys)):
            if plan.capacity(key) is not None:
                counts[key] += 1
    return counts


def count_waiting(plan: FlowPlan, rows: Iterable[tuple[str, str, Any, int]]) -> Counter[str]:
    """Due jobs per limit key, from ``(task_name, queue_name, flow_keys, count)`` rows."""
    waiting: Counter[str] = Counter()
    for task_name, queue_name, flow_keys, count in rows:
        for key in plan.keys_of(task_name, queue_name, _keys(flow_keys)):
            waiting[key] += count
    return waiting


class Admission:
    """One limited claim's decisions: which of its candidate jobs start, under which keys.

    Built from what the claim's turn read: the running jobs per concurrency key
    (:func:`count_running`), the database clock, the rate keys' arrival times ahead of it,
    and the guarded limits' gates (:func:`read_gates`). ``arrivals`` is updated in place as
    jobs are admitted; ``advanced`` holds the arrival times the claim writes back.
    """

    def __init__(
        self,
        plan: FlowPlan,
        running: Counter[str],
        now: float,
        arrivals: dict[str, float],
        gates: Mapping[str, GateState],
        batch_size: int,
    ) -> None:
        self.plan = plan
        self.running = running
        self.now = now
        self.arrivals = arrivals
        self.gates = gates
        self.batch_size = batch_size
        #: Keys with no room: a concurrency key at its bound, a rate key ahead of the clock.
        self.blocked = {key for key in [*running, *arrivals] if self.full(key)}
        #: Named limits whose breaker lets no job through; those whose budget allows no retry.
        self.closed = {name for name, gate in gates.items() if gate.closed_to_all}
        self.spent = {name for name, gate in gates.items() if gate.retries_spent}
        #: The admitted job ids, in claim order.
        self.admitted: list[int] = []
        #: The new arrival time of each rate key an admitted job counts under.
        self.advanced: dict[str, float] = {}
        #: Admitted jobs whose stored flow keys are not a list of strings, with what they hold:
        #: counted under none of them, leased, and dead-lettered by the worker, rather than
        #: fail this claim and every one after it.
        self.unreadable: dict[int, Any] = {}
        self._seen: set[int] = set()

    def full(self, key: str) -> bool:
        """Whether ``key`` has no room for one more start now."""
        capacity = self.plan.capacity(key)
        if capacity is not None and self.running[key] >= capacity:
            return True
        rate = self.plan.rate(key)
        now = self.now
        return rate is not None and max(self.arrivals.get(key, now), now) - now > rate.tolerance + EPSILON

    @property
    def done(self) -> bool:
        """Whether the claim admitted as many jobs as it may take."""
        return len(self.admitted) >= self.batch_size

    def blocked_tasks(self) -> list[str]:
        """Tasks none of whose jobs can start: an unkeyed key of theirs is full, or their breaker open."""
        plan = self.plan
        return sorted(
            task
            for task, keys in plan.task_keys.items()
            if self.blocked.intersection(keys) or plan.guarded_tasks.get(task) in self.closed
        )

    def blocked_retries(self, blocked_tasks: Sequence[str]) -> list[str]:
        """Tasks (not in ``blocked_tasks``) whose retries cannot start: their budget is spent."""
        return sorted(
            task
            for task, name in self.plan.guarded_tasks.items()
            if name in self.spent and task not in blocked_tasks
        )

    def blocked_queues(self) -> set[str]:
        """Queues whose concurrency is full."""
        return {key[6:] for key in self.blocked if key.startswith("queue:")}

    def blocked_keys(self) -> list[str]:
        """Full keys stored with the jobs (keyed concurrency and rate)."""
        return sorted(key for key in self.blocked if key[:2] in ("c:", "r:"))

    def admit(self, rows: Iterable[tuple[int, str, str, Any, int]]) -> list[str]:
        """Admit candidate rows ``(id, task, queue, flow_keys, attempts)`` in order while each
        of their keys and gates has room, up to the claim's batch size.

        Returns the keys that filled up during this claim and hid rows behind them (each
        once, in the order found): a caller may read again without them, and remembers them.
        A row seen in an earlier read is passed over.
        """
        plan, now, arrivals = self.plan, self.now, self.arrivals
        filled: list[str] = []
        for job_id, task_name, queue_name, flow_keys, attempts in rows:
            if job_id in self._seen:
                continue  # our own lock from the read before: SKIP LOCKED returns it again
            self._seen.add(job_id)
            stored = read_flow_keys(flow_keys)
            keys = plan.keys_of(task_name, queue_name, stored or [])
            if any(self.full(key) for key in keys):
                newly = {key for key in keys if self.full(key)} - self.blocked
                filled.extend(newly)
                self.blocked.update(newly)
                continue
            gate = self.gates.get(plan.guarded_tasks.get(task_name, ""))
            if gate is not None:
                if not gate.admits(attempts):
                    continue
                gate.admit(attempts)
            self.admitted.append(job_id)
            if stored is None:
                self.unreadable[job_id] = flow_keys
            for key in keys:
                if plan.capacity(key) is not None:
                    self.running[key] += 1
                rate = plan.rate(key)
                if rate is not None:
                    arrivals[key] = self.advanced[key] = max(arrivals.get(key, now), now) + rate.interval
            if self.done:
                break
        return filled
