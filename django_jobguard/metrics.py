"""Prometheus metrics: worker counters, durations, and the scrape-time queue collector.

Everything is a no-op when ``prometheus_client`` is not installed (the ``metrics`` extra),
so the hot path never has to ask. Labels stay bounded: queue, task, status, category,
reason, where. Never a job id or a key.
"""

from __future__ import annotations

from typing import Any

try:
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only without the metrics extra
    prometheus_client = None  # type: ignore[assignment]

__all__ = ["ENABLED"]

ENABLED = prometheus_client is not None

#: Histogram buckets for handler durations: milliseconds up to an hour.
DURATION_BUCKETS_SECONDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
)


class _Noop:
    def labels(self, *args: Any, **kwargs: Any) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


def _counter(name: str, documentation: str, labels: tuple[str, ...]) -> Any:
    if prometheus_client is None:
        return _Noop()
    return prometheus_client.Counter(name, documentation, labels)


def _histogram(name: str, documentation: str, labels: tuple[str, ...]) -> Any:
    if prometheus_client is None:
        return _Noop()
    return prometheus_client.Histogram(name, documentation, labels, buckets=DURATION_BUCKETS_SECONDS)


ENQUEUED = _counter("jobguard_jobs_enqueued_total", "Jobs enqueued.", ("queue", "task"))
SUCCEEDED = _counter(
    "jobguard_jobs_succeeded_total", "Jobs that succeeded and were acked.", ("queue", "task")
)
FAILED = _counter(
    "jobguard_jobs_failed_total", "Failed attempts, by error category.", ("queue", "task", "category")
)
RETRIED = _counter(
    "jobguard_jobs_retried_total", "Failed attempts scheduled for a retry.", ("queue", "task", "category")
)
DEAD_LETTERED = _counter(
    "jobguard_jobs_dead_lettered_total", "Jobs moved to the dead-letter queue.", ("queue", "task", "reason")
)
DURATION = _histogram(
    "jobguard_job_duration_seconds", "Handler run time per attempt, in seconds.", ("queue", "task", "status")
)
LOCK_CONTENTION = _counter(
    "jobguard_lock_contentions_total",
    "Jobs put back because their lock was held by another worker.",
    ("queue", "task"),
)
LOCK_FAILURES = _counter(
    "jobguard_lock_failures_total",
    "Lock operations that failed because the back end was unreachable, or renewals that found the lock lost.",
    ("queue", "task", "reason"),
)
REAPPEARANCES = _counter(
    "jobguard_visibility_timeout_reappearances_total",
    "Jobs whose lease expired and that became visible again.",
    ("queue",),
)
LEASE_LOST = _counter(
    "jobguard_lease_lost_total",
    "Acks, retries or heartbeats refused because the worker's lease had moved on.",
    ("queue", "task", "operation"),
)
DUPLICATES = _counter(
    "jobguard_idempotency_duplicates_total",
    "Duplicates stopped by an idempotency key, at enqueue or at execution.",
    ("task", "where"),
)
KEY_CONFLICTS = _counter(
    "jobguard_idempotency_unique_conflicts_total",
    "Idempotency key inserts that met the unique constraint (the key existed), at enqueue or execution.",
    ("task", "where"),
)


def job_enqueued(queue: str, task: str, count: int = 1) -> None:
    ENQUEUED.labels(queue, task).inc(count)


def job_succeeded(queue: str, task: str, duration: float) -> None:
    SUCCEEDED.labels(queue, task).inc()
    DURATION.labels(queue, task, "succeeded").observe(duration)


def job_failed(queue: str, task: str, category: str, duration: float | None, *, retried: bool) -> None:
    FAILED.labels(queue, task, category).inc()
    if duration is not None:
        DURATION.labels(queue, task, "failed").observe(duration)
    if retried:
        RETRIED.labels(queue, task, category).inc()


def job_dead_lettered(queue: str, task: str, reason: str) -> None:
    DEAD_LETTERED.labels(queue, task, reason).inc()


def lock_contended(queue: str, task: str) -> None:
    LOCK_CONTENTION.labels(queue, task).inc()


def lock_failed(queue: str, task: str, reason: str) -> None:
    LOCK_FAILURES.labels(queue, task, reason).inc()


def reappeared(queue: str, count: int = 1) -> None:
    REAPPEARANCES.labels(queue).inc(count)


def lease_lost(queue: str, task: str, operation: str) -> None:
    LEASE_LOST.labels(queue, task, operation).inc()


def duplicate_prevented(task: str, where: str) -> None:
    DUPLICATES.labels(task, where).inc()


def key_conflict(task: str, where: str) -> None:
    KEY_CONFLICTS.labels(task, where).inc()
