"""What happened, as typed values: the code that does something emits one event, and sinks report it.

A site that enqueues, settles, invalidates or ticks says *what* happened with :func:`emit`;
it does not know who listens. The app's ``ready()`` installs the sinks: Prometheus metrics
(:func:`django_jobguard.monitoring.metrics.sink`) and the console's per-minute counts
(:func:`django_jobguard.monitoring.beats.sink`). A tracer or a test adds its own with :func:`add_sink`.

Events carry names and numbers only (queue, task, reason, duration), never a payload. Sinks
keep no state that must commit with the job: what belongs to the ack is a store write.
A sink that raises does not stop the others, nor the code that emitted.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "BreakerChanged",
    "CacheInvalidated",
    "ClaimThrottled",
    "DuplicatePrevented",
    "DurableInvalidation",
    "EventLoopSampled",
    "HorizonSampled",
    "JobDeadLettered",
    "JobEnqueued",
    "JobFailed",
    "JobSucceeded",
    "JobTransactionSampled",
    "JobsPruned",
    "KeyConflict",
    "LeaseLost",
    "LeaseReappeared",
    "LockContended",
    "LockFailed",
    "RefillLeaseTaken",
    "RefillLoaded",
    "RefillWaited",
    "ReplayMoved",
    "ScheduleTicked",
    "ScheduleTicksMissed",
    "Sink",
    "StaleWriteRejected",
    "StatementRetried",
    "UniqueConflict",
    "WorkflowCallbackEnqueued",
    "add_sink",
    "emit",
    "remove_sink",
]

logger = logging.getLogger("django_jobguard.events")


# -- jobs ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class JobEnqueued:
    queue: str
    task: str
    count: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class JobSucceeded:
    queue: str
    task: str
    duration: float


@dataclasses.dataclass(frozen=True, slots=True)
class EventLoopSampled:
    """A worker's event loop (``--async-slots``) as the heartbeat saw it: coroutines, slots, lag."""

    in_use: int
    slots: int
    lag: float


@dataclasses.dataclass(frozen=True, slots=True)
class HorizonSampled:
    """What holds PostgreSQL's vacuum horizon, as the horizon watcher saw it: the oldest holder's
    seconds and transactions (0 and 0 with none)."""

    age_seconds: float
    xid_age: int


@dataclasses.dataclass(frozen=True, slots=True)
class JobTransactionSampled:
    """A worker's longest open job transaction (an ``atomic=True`` job's), in seconds; 0 with none."""

    age_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class JobFailed:
    """An attempt failed: ``retried`` if the job goes back to wait for another one."""

    queue: str
    task: str
    category: str
    duration: float | None
    retried: bool


@dataclasses.dataclass(frozen=True, slots=True)
class JobDeadLettered:
    queue: str
    task: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class JobsPruned:
    """Finished jobs past their retention deleted by a pruning pass: ``count`` that ended as ``status``."""

    status: str
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseLost:
    """A write of this worker was refused: the lease had moved on (``operation``: ack, retry, ...)."""

    queue: str
    task: str
    operation: str


@dataclasses.dataclass(frozen=True, slots=True)
class LeaseReappeared:
    """The reaper handed back jobs whose lease expired (their worker died or froze)."""

    queue: str
    count: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimThrottled:
    """A limited claim took fewer jobs than it asked for while ``reason`` was closed to some jobs.

    ``reason``: ``concurrency``, ``rate``, ``breaker`` or ``budget``.
    """

    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerChanged:
    """A named limit's circuit breaker moved (``closed``, ``open``, ``half_open``)."""

    limit: str
    from_state: str
    to_state: str


@dataclasses.dataclass(frozen=True, slots=True)
class LockContended:
    queue: str
    task: str


@dataclasses.dataclass(frozen=True, slots=True)
class LockFailed:
    queue: str
    task: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class DuplicatePrevented:
    task: str
    where: str


@dataclasses.dataclass(frozen=True, slots=True)
class UniqueConflict:
    queue: str
    task: str


@dataclasses.dataclass(frozen=True, slots=True)
class KeyConflict:
    task: str
    where: str


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayMoved:
    """A dead letter's replay changed state (``action``: requested, approved, ...)."""

    queue: str
    task: str
    action: str


# -- schedules ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleTicked:
    """A recurring job's tick was enqueued, ``lag`` seconds after its time."""

    schedule: str
    lag: float


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleTicksMissed:
    schedule: str
    count: int = 1


# -- workflows ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowCallbackEnqueued:
    """A finished workflow's callback was enqueued (emitted once its transaction committed)."""

    kind: str
    when: str


# -- the store ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class StatementRetried:
    """A store statement met a deadlock or a lock-wait timeout and ran again (MariaDB/MySQL)."""

    operation: str
    reason: str


# -- the cache ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class CacheInvalidated:
    cache: str
    status: str
    count: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class StaleWriteRejected:
    cache: str


@dataclasses.dataclass(frozen=True, slots=True)
class DurableInvalidation:
    cache: str
    status: str


@dataclasses.dataclass(frozen=True, slots=True)
class RefillLeaseTaken:
    cache: str


@dataclasses.dataclass(frozen=True, slots=True)
class RefillWaited:
    cache: str
    status: str


@dataclasses.dataclass(frozen=True, slots=True)
class RefillLoaded:
    cache: str
    status: str


# -- emitting -----------------------------------------------------------------------------------

#: A sink takes every event; it ignores the kinds it does not report.
Sink = Callable[[Any], None]

_sinks: tuple[Sink, ...] = ()
_sinks_lock = threading.Lock()


def emit(event: Any) -> None:
    """Hand ``event`` to every sink, in the order they were added."""
    for sink in _sinks:  # a tuple, replaced whole: no lock on the hot path
        try:
            sink(event)
        except Exception:  # reporting must never fail the work it reports on
            logger.exception("event_sink_failed event=%s", type(event).__name__)


def add_sink(sink: Sink) -> None:
    """Add ``sink`` (once: adding it again changes nothing)."""
    global _sinks
    with _sinks_lock:
        if sink not in _sinks:
            _sinks = (*_sinks, sink)


def remove_sink(sink: Sink) -> None:
    global _sinks
    with _sinks_lock:
        _sinks = tuple(s for s in _sinks if s is not sink)
