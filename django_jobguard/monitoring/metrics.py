"""Prometheus metrics: worker counters, durations, and the scrape-time queue collector.

Two kinds of metrics, served by different processes:

- **Counters and the duration histogram** (``jobguard_jobs_*``, ``jobguard_lock_*``...) are
  incremented where things happen: enqueues in the web process, everything else in the
  worker. ``manage.py jobguard_worker --metrics-port P`` serves a worker's own (or use
  prometheus_client's multiprocess mode, see ``docs/how-to/monitoring.md``).
- **Queue gauges** (``jobguard_queue_*``) are computed from the database when scraped,
  by :class:`QueueCollector` through :func:`django_jobguard.monitoring.stats.queue_stats`. The app
  registers the collector in every process at start-up, so django-prometheus's
  ``/metrics`` view serves it in the web process; the worker's metrics server leaves it
  out, so N workers do not each run the same queries and export the same numbers.

Everything is a no-op when ``prometheus_client`` is not installed (the ``metrics`` extra),
so the hot path never has to ask. Labels stay bounded: queue, task, status, category,
reason, where, operation, action, cache (a cache alias), schedule (a declared schedule's
name: bounded by configuration), destination (a declared outbox destination's). Never a job
id, a message id or a key.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

from django.core.signals import setting_changed

try:
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only without the metrics extra
    prometheus_client = None  # type: ignore[assignment]

from .. import events
from ..conf import get_settings
from ..outbox import events as outbox_events
from ..outbox.stats import destination_stats
from .stats import breaker_stats, limit_stats, queue_stats, workflow_stats

logger = logging.getLogger("django_jobguard.metrics")

__all__ = [
    "CATALOGUE",
    "ENABLED",
    "MetricInfo",
    "QueueCollector",
    "WorkerMetricsServer",
    "metrics_view",
    "multiprocess_collector",
    "reference_table",
    "register_queue_collector",
    "serve_worker_metrics",
    "set_exemplar_source",
    "unregister_queue_collector",
]

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

#: The only label names a jobguard metric may carry (each with a small, bounded set of values).
ALLOWED_LABELS = frozenset(
    # limit: a declared flow-control limit's name (never one of its keys); kind: concurrency or rate,
    # or a workflow's kind (chain, group, batch, graph); when: a callback's (success, complete, dead);
    # destination: a name declared in JOBGUARD["OUTBOX"]["DESTINATIONS"] (never a message's key).
    {
        "queue",
        "task",
        "status",
        "category",
        "reason",
        "where",
        "operation",
        "action",
        "cache",
        "schedule",
        "limit",
        "kind",
        "when",
        "destination",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class MetricInfo:
    """One metric as exposed: the name to query, its type, labels and meaning.

    ``CATALOGUE`` lists them all; ``docs/reference/metrics.md`` is generated from it.
    """

    name: str
    type: str
    labels: tuple[str, ...]
    documentation: str
    #: Which process counts it: "worker", "enqueuing process" (often the web), or "web (scrape)":
    #: computed from the database by whichever process serves /metrics.
    source: str


class _Noop:
    def labels(self, *args: Any, **kwargs: Any) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        pass


_CATALOGUE: list[MetricInfo] = []


def _counter(name: str, documentation: str, labels: tuple[str, ...], source: str = "worker") -> Any:
    _CATALOGUE.append(MetricInfo(name, "counter", labels, documentation, source))
    if prometheus_client is None:
        return _Noop()
    return prometheus_client.Counter(name, documentation, labels)


def _histogram(name: str, documentation: str, labels: tuple[str, ...], source: str = "worker") -> Any:
    _CATALOGUE.append(MetricInfo(name, "histogram", labels, documentation, source))
    if prometheus_client is None:
        return _Noop()
    return prometheus_client.Histogram(name, documentation, labels, buckets=DURATION_BUCKETS_SECONDS)


def _gauge(name: str, documentation: str, labels: tuple[str, ...]) -> MetricInfo:
    info = MetricInfo(name, "gauge", labels, documentation, "web (scrape)")
    _CATALOGUE.append(info)
    return info


def _worker_gauge(name: str, documentation: str) -> Any:
    """A gauge the worker process sets itself (served by ``jobguard_worker --metrics-port``)."""
    _CATALOGUE.append(MetricInfo(name, "gauge", (), documentation, "worker"))
    if prometheus_client is None:
        return _NoopGauge()
    return prometheus_client.Gauge(name, documentation, multiprocess_mode="livemax")


class _NoopGauge:
    def set(self, value: float) -> None:
        pass


ENQUEUED = _counter(
    "jobguard_jobs_enqueued_total", "Jobs enqueued.", ("queue", "task"), source="enqueuing process"
)
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
REPLAYS = _counter(
    "jobguard_replays_total",
    "Dead-letter replay transitions (requested, approved, rejected, replayed).",
    ("queue", "task", "action"),
    source="web (admin, API) and worker (redrive)",
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
JOBS_PRUNED = _counter(
    "jobguard_jobs_pruned_total",
    "Finished jobs deleted by the workers' pruning passes past their retention (JOBGUARD['RETENTION'] "
    "and each queue's retention), by the status they finished in: succeeded, cancelled or dead.",
    ("status",),
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
    source="enqueuing process and worker",
)
UNIQUE_CONFLICTS = _counter(
    "jobguard_unique_conflicts_total",
    "Attempts that failed on a unique-constraint violation: a duplicate effect the database refused.",
    ("queue", "task"),
)
STATEMENT_RETRIES = _counter(
    "jobguard_store_statement_retries_total",
    "Store transactions run again: after a deadlock or a lock-wait timeout (MariaDB/MySQL, `reason` "
    "`deadlock` or `lock_wait_timeout`), or after an undeclared pooler lost a prepared statement "
    "(PostgreSQL, `prepared_statement_lost`).",
    ("operation", "reason"),
    source="enqueuing process and worker",
)

KEY_CONFLICTS = _counter(
    "jobguard_idempotency_unique_conflicts_total",
    "Idempotency key inserts that met the unique constraint (the key existed), at enqueue or execution.",
    ("task", "where"),
    source="enqueuing process and worker",
)
CACHE_INVALIDATIONS = _counter(
    "jobguard_cache_invalidations_total",
    "Cache keys invalidated after a commit (deleted, or replaced by a version tombstone); "
    "status error: the cache failed and the key may hold a stale value until it expires.",
    ("cache", "status"),
    source="web or worker (the process that committed the write)",
)
CACHE_STALE_WRITES = _counter(
    "jobguard_cache_stale_writes_rejected_total",
    "Versioned cache writes refused because the cache held that version or a newer one.",
    ("cache",),
    source="web or worker (the process that fills the cache)",
)
SCHEDULE_TICKS = _counter(
    "jobguard_schedule_ticks_enqueued_total",
    "Schedule ticks whose job was enqueued (each tick once, whichever worker's scheduler won it).",
    ("schedule",),
)
SCHEDULE_MISSED = _counter(
    "jobguard_schedule_ticks_missed_total",
    "Schedule ticks that got no job: missed by more than JOBGUARD['SCHEDULER']['MISSED_AFTER'] "
    "and dropped by the schedule's missed policy, or refused by the task.",
    ("schedule",),
)
WORKFLOW_CALLBACKS = _counter(
    "jobguard_workflow_callbacks_total",
    "Callbacks of finished workflows enqueued (each exactly once), by workflow kind and by when "
    "they run (success, complete, dead).",
    ("kind", "when"),
)
CLAIMS_THROTTLED = _counter(
    "jobguard_claims_throttled_total",
    "Limited claims that took fewer jobs than asked while a limit was at its bound, a breaker "
    "open or a retry budget spent (reason: concurrency, rate, breaker, budget).",
    ("reason",),
)
BREAKER_TRANSITIONS = _counter(
    "jobguard_breaker_transitions_total",
    "State changes of a named limit's circuit breaker made by this process, by the state entered "
    "(status: open, half_open, closed).",
    ("limit", "status"),
    source="worker and web (admin, API)",
)
OUTBOX_DELIVERED = _counter(
    "jobguard_outbox_delivered_total",
    "Outbox messages the relay delivered (each counted once, when its delivery was recorded).",
    ("destination",),
)
OUTBOX_FAILED = _counter(
    "jobguard_outbox_failed_total",
    "Outbox sends that failed, by error category (transient or permanent).",
    ("destination", "category"),
)
OUTBOX_RETRIED = _counter(
    "jobguard_outbox_retried_total",
    "Failed outbox sends whose message waits out the destination's backoff for another attempt.",
    ("destination",),
)
OUTBOX_THROTTLED = _counter(
    "jobguard_outbox_throttled_total",
    "Outbox sends the destination's LIMIT did not admit then, by reason (breaker, budget, rate): "
    "the key was given back unsent, with no attempt counted.",
    ("destination", "reason"),
)
OUTBOX_DEAD = _counter(
    "jobguard_outbox_dead_total",
    "Outbox messages that ran out of attempts or were refused for good; status held: the message "
    "holds its key (ON_FAILURE hold), passed: the key moved on (ON_FAILURE skip).",
    ("destination", "status"),
)
OUTBOX_RESOLVED = _counter(
    "jobguard_outbox_resolved_total",
    "Dead outbox messages an operator settled, by action (replayed, skipped).",
    ("destination", "action"),
    source="web (admin) or wherever replay() and skip() are called",
)
OUTBOX_DELIVERY_LAG = _histogram(
    "jobguard_outbox_delivery_lag_seconds",
    "Seconds from an outbox message's publish (its transaction's time) to its recorded delivery.",
    ("destination",),
)
SCHEDULE_LAG = _histogram(
    "jobguard_schedule_lag_seconds",
    "Seconds from a tick's time to the enqueue of its job (database clock).",
    ("schedule",),
)
CACHE_DURABLE = _counter(
    "jobguard_cache_durable_invalidations_total",
    "Durable invalidations (the keys of one transaction for one cache alias, in one job): enqueued "
    "(counted at commit), completed_at_commit (the committing process deleted the keys and removed the "
    "job), completed_by_worker, retried (the cache failed in the worker), failed (attempts exhausted, "
    "dead-lettered).",
    ("cache", "status"),
    source="web or worker (the committing process; the worker for completed_by_worker, retried, failed)",
)
CACHE_REFILL_LEASES = _counter(
    "jobguard_cache_refill_leases_total",
    "get_or_set() misses that took the refill lease and so called the loader for everyone.",
    ("cache",),
    source="web or worker (the process that reads the cache)",
)
CACHE_REFILL_WAITS = _counter(
    "jobguard_cache_refill_waits_total",
    "get_or_set() misses that waited for another caller's refill; status filled (the value came) or "
    "timeout (waited past JOBGUARD['CACHE']['REFILL_WAIT'] and loaded itself).",
    ("cache", "status"),
    source="web or worker (the process that reads the cache)",
)
CACHE_REFILL_LOADS = _counter(
    "jobguard_cache_refill_loads_total",
    "Loader calls made by get_or_set(); status ok or error (the lease was released for the next caller).",
    ("cache", "status"),
    source="web or worker (the process that reads the cache)",
)

# Queue gauges: computed from the database at scrape time by QueueCollector.
ASYNC_SLOTS = _worker_gauge(
    "jobguard_worker_async_slots", "Coroutines the worker's event loop may run at once."
)
ASYNC_SLOTS_IN_USE = _worker_gauge(
    "jobguard_worker_async_slots_in_use", "Coroutines running on the worker's event loop (--async-slots)."
)
EVENT_LOOP_LAG = _worker_gauge(
    "jobguard_worker_event_loop_lag_seconds",
    "How late the worker's event loop last woke from a 0.1 s sleep: time a coroutine held the loop.",
)
VACUUM_HORIZON_AGE = _worker_gauge(
    "jobguard_vacuum_horizon_age_seconds",
    "Seconds the oldest holder of PostgreSQL's vacuum horizon (a transaction, a prepared transaction, "
    "a replication slot or a standby with hot_standby_feedback) has held it, as the worker that runs "
    "maintenance last saw (JOBGUARD['HORIZON']['INTERVAL']); a slot's or a standby's: since that "
    "worker first saw its xmin. PostgreSQL only.",
)
VACUUM_HORIZON_XID_AGE = _worker_gauge(
    "jobguard_vacuum_horizon_xid_age",
    "Transactions started since the xmin of the oldest holder of PostgreSQL's vacuum horizon: the "
    "dead rows it keeps grow with it. PostgreSQL only.",
)
JOB_TRANSACTION_AGE = _worker_gauge(
    "jobguard_worker_job_transaction_age_seconds",
    "Seconds the worker's longest open job transaction (an atomic=True job's: its handler and ack "
    "in one transaction) has been open; 0 with none. It holds the vacuum horizon meanwhile. On SQLite "
    "the heartbeat that sets it waits while a job holds the database's write lock.",
)
QUEUE_DEPTH = _gauge(
    "jobguard_queue_depth", "Queued jobs that are due: the work waiting for a worker.", ("queue",)
)
QUEUE_SCHEDULED = _gauge(
    "jobguard_queue_scheduled",
    "Queued jobs that may not start yet (retries waiting out their backoff, delayed jobs).",
    ("queue",),
)
QUEUE_IN_FLIGHT = _gauge(
    "jobguard_queue_in_flight", "Running jobs: claimed by a worker and holding a lease.", ("queue",)
)
QUEUE_OLDEST_AGE = _gauge(
    "jobguard_queue_oldest_age_seconds",
    "Seconds the oldest due job has waited since its run_after (0 when none is due).",
    ("queue",),
)
QUEUE_DEAD_LETTERS = _gauge(
    "jobguard_queue_dead_letters",
    "Dead letters not replayed and not rejected: the dead-letter queue's size.",
    ("queue",),
)
QUEUE_PENDING_APPROVALS = _gauge(
    "jobguard_queue_replays_pending_approval",
    "Dead letters whose replay was requested and awaits approval.",
    ("queue",),
)
QUEUE_PAUSED = _gauge(
    "jobguard_queue_paused",
    "1 while the queue is paused (workers do not claim from it; enqueues still work), else 0.",
    ("queue",),
)
# Flow-control gauges: computed from the database at scrape time by QueueCollector, when
# limits are declared. `limit` names a declared limit (bounded), never a key.
LIMIT_RUNNING = _gauge(
    "jobguard_queue_limit_running",
    "Running jobs counted under a flow-control limit (every key of a keyed one together).",
    ("limit", "kind"),
)
LIMIT_FULL_KEYS = _gauge(
    "jobguard_queue_limit_full_keys",
    "Keys of a flow-control concurrency limit at their bound: their due jobs wait.",
    ("limit", "kind"),
)
LIMIT_WAITING = _gauge(
    "jobguard_queue_limit_waiting",
    "Due queued jobs counted under a flow-control limit (they wait while it is full).",
    ("limit", "kind"),
)
_LIMIT_FIELDS = ((LIMIT_RUNNING, "running"), (LIMIT_FULL_KEYS, "full_keys"), (LIMIT_WAITING, "waiting"))
# Workflow gauges: computed from the database at scrape time by QueueCollector (one query on
# the partial index of unfinished workflows). `kind`: chain, group, batch or graph.
WORKFLOWS_OPEN = _gauge(
    "jobguard_queue_workflows_open",
    "Workflows not finished: open batches, and closed ones whose members have not all settled.",
    ("kind",),
)
WORKFLOW_OLDEST_OPEN_AGE = _gauge(
    "jobguard_queue_workflow_oldest_open_age_seconds",
    "Seconds since the oldest unfinished workflow of the kind was created (0 when none is).",
    ("kind",),
)
_WORKFLOW_FIELDS = ((WORKFLOWS_OPEN, "open"), (WORKFLOW_OLDEST_OPEN_AGE, "oldest_age_seconds"))
# Outbox gauges: computed from the database at scrape time by QueueCollector, when a destination
# is declared (django_jobguard.outbox.stats: three queries on the pending messages' partial index,
# their first rows and the dead messages). One series per destination, never per key.
OUTBOX_PENDING = _gauge(
    "jobguard_outbox_pending",
    "Outbox messages waiting for delivery: due, waiting out a retry, or behind a message that holds its key.",
    ("destination",),
)
OUTBOX_OLDEST_AGE = _gauge(
    "jobguard_outbox_oldest_age_seconds",
    "Seconds the oldest undelivered outbox message has waited since its publish (the first pending "
    "one, or one that holds its key, whichever is older; 0 with none).",
    ("destination",),
)
OUTBOX_HELD_KEYS = _gauge(
    "jobguard_outbox_held_keys",
    "Keys a dead outbox message holds (ON_FAILURE hold): nothing behind it is delivered until an "
    "operator replays or skips it.",
    ("destination",),
)
OUTBOX_DEAD_MESSAGES = _gauge(
    "jobguard_outbox_dead_messages",
    "Dead outbox messages no operator replayed or skipped yet (holding their key or passed over).",
    ("destination",),
)
_OUTBOX_FIELDS = (
    (OUTBOX_PENDING, "pending"),
    (OUTBOX_OLDEST_AGE, "oldest_age_seconds"),
    (OUTBOX_HELD_KEYS, "held_keys"),
    (OUTBOX_DEAD_MESSAGES, "dead"),
)
# Breaker gauges: one series per named limit that declares a breaker or a retry budget (the
# budget's gauge only for a limit that declares one).
BREAKER_STATE = _gauge(
    "jobguard_breaker_state",
    "A named limit's circuit breaker: 0 closed, 1 half-open (probing), 2 open (its jobs wait).",
    ("limit",),
)
BREAKER_WAITING = _gauge(
    "jobguard_breaker_waiting",
    "Due queued jobs of the tasks behind a named limit's breaker or retry budget.",
    ("limit",),
)
RETRY_BUDGET_REMAINING = _gauge(
    "jobguard_retry_budget_remaining",
    "Retries a named limit's retry budget still allows in its current window (0: retries wait); "
    "no series for a limit without a budget.",
    ("limit",),
)
_BREAKER_FIELDS = (
    (BREAKER_STATE, "state_value"),
    (BREAKER_WAITING, "waiting"),
    (RETRY_BUDGET_REMAINING, "budget_remaining"),
)
QUEUE_STATS_UP = _gauge(
    "jobguard_queue_stats_up",
    "1 if the last scrape read the queue statistics from the database, 0 if that failed.",
    (),
)
QUEUE_STATS_DURATION = _gauge(
    "jobguard_queue_stats_duration_seconds",
    "Seconds the last scrape spent reading the queue statistics from the database.",
    (),
)

#: Every metric django-jobguard exposes, in the order of the reference page.
CATALOGUE: tuple[MetricInfo, ...] = tuple(_CATALOGUE)

#: Prefix shared by the scrape-time gauges of queues and limits (none of them is served by a worker).
QUEUE_GAUGE_PREFIX = "jobguard_queue_"
#: Prefixes of every scrape-time gauge: the queues' and limits', the breakers' and the budgets',
#: the outbox's (named whole: the outbox's counters, served by workers, share their prefix).
SCRAPE_GAUGE_PREFIXES = (
    QUEUE_GAUGE_PREFIX,
    "jobguard_breaker_",
    "jobguard_retry_budget_",
    *(info.name for info, _ in _OUTBOX_FIELDS),
)


_children: dict[tuple[int, tuple[str, ...]], Any] = {}

#: The label of undeclared queues past JOBGUARD["METRICS_MAX_UNDECLARED_QUEUES"] (per process),
#: so free-form names (a caller's typo, one queue per tenant) cannot grow the series without bound.
OTHER_QUEUE_LABEL = "other"
_queue_labels: dict[str, str] = {}
_undeclared_labels: set[str] = set()
_queue_labels_lock = threading.Lock()


def queue_label(queue: str) -> str:
    """The ``queue`` label for ``queue``: its name, or ``"other"`` past the undeclared cap."""
    label = _queue_labels.get(queue)
    if label is not None:
        return label
    conf = get_settings()
    with _queue_labels_lock:
        if queue in conf.queues or queue in (conf.default_queue, conf.cache.queue):
            label = queue
        elif queue in _undeclared_labels or len(_undeclared_labels) < conf.metrics_max_undeclared_queues:
            _undeclared_labels.add(queue)
            label = queue
        else:
            label = OTHER_QUEUE_LABEL
        _queue_labels[queue] = label
    return label


def _forget_queue_labels(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBGUARD":
        with _queue_labels_lock:
            _queue_labels.clear()
            _undeclared_labels.clear()
            _succeeded_children.clear()


setting_changed.connect(_forget_queue_labels)


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, remembered: prometheus_client validates and locks on every call."""
    key = (id(metric), labels)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*labels)
    return child


def job_enqueued(queue: str, task: str, count: int = 1) -> None:
    label = queue_label(queue)
    _child(ENQUEUED, label, task).inc(count)


#: The exemplar of an observed duration (the current span's ids), while tracing is on.
_exemplar: Callable[[], dict[str, str] | None] | None = None


def set_exemplar_source(source: Callable[[], dict[str, str] | None] | None) -> None:
    """Attach what ``source`` returns as the exemplar of each job duration; None stops it.

    Set by the app while ``JOBGUARD["OPENTELEMETRY"]`` is on: a slow bucket of
    ``jobguard_job_duration_seconds`` then leads to a trace (OpenMetrics exposition only).
    """
    global _exemplar
    _exemplar = source


#: Per (queue, task): the children a success updates, so the hot path (one success per job)
#: reads one dict instead of resolving the queue's label and two children.
_succeeded_children: dict[tuple[str, str], tuple[Any, Any]] = {}


def job_succeeded(queue: str, task: str, duration: float) -> None:
    children = _succeeded_children.get((queue, task))
    if children is None:
        label = queue_label(queue)
        children = _succeeded_children[(queue, task)] = (
            _child(SUCCEEDED, label, task),
            _child(DURATION, label, task, "succeeded"),
        )
    children[0].inc()
    children[1].observe(duration, _exemplar() if _exemplar is not None else None)


def job_failed(queue: str, task: str, category: str, duration: float | None, *, retried: bool) -> None:
    label = queue_label(queue)
    FAILED.labels(label, task, category).inc()
    if duration is not None:
        exemplar = _exemplar() if _exemplar is not None else None
        DURATION.labels(label, task, "failed").observe(duration, exemplar)
    if retried:
        RETRIED.labels(label, task, category).inc()


def job_dead_lettered(queue: str, task: str, reason: str) -> None:
    label = queue_label(queue)
    DEAD_LETTERED.labels(label, task, reason).inc()


def replay_transition(queue: str, task: str, action: str) -> None:
    label = queue_label(queue)
    REPLAYS.labels(label, task, action).inc()


def lock_contended(queue: str, task: str) -> None:
    label = queue_label(queue)
    LOCK_CONTENTION.labels(label, task).inc()


def lock_failed(queue: str, task: str, reason: str) -> None:
    label = queue_label(queue)
    LOCK_FAILURES.labels(label, task, reason).inc()


def reappeared(queue: str, count: int = 1) -> None:
    label = queue_label(queue)
    REAPPEARANCES.labels(label).inc(count)


def lease_lost(queue: str, task: str, operation: str) -> None:
    label = queue_label(queue)
    LEASE_LOST.labels(label, task, operation).inc()


def duplicate_prevented(task: str, where: str) -> None:
    DUPLICATES.labels(task, where).inc()


def unique_conflict(queue: str, task: str) -> None:
    """Count a unique-constraint conflict (handlers that catch their own may call this too)."""
    label = queue_label(queue)
    UNIQUE_CONFLICTS.labels(label, task).inc()


def statement_retried(operation: str, reason: str) -> None:
    """Count a store statement run again after a deadlock or a lock-wait timeout."""
    STATEMENT_RETRIES.labels(operation, reason).inc()


# -- the queue collector ---------------------------------------------------------------

_QUEUE_FIELDS = (
    (QUEUE_DEPTH, "depth"),
    (QUEUE_SCHEDULED, "scheduled"),
    (QUEUE_IN_FLIGHT, "in_flight"),
    (QUEUE_OLDEST_AGE, "oldest_age_seconds"),
    (QUEUE_DEAD_LETTERS, "dead_letters"),
    (QUEUE_PENDING_APPROVALS, "pending_approvals"),
    (QUEUE_PAUSED, "paused"),
)


def _family(info: MetricInfo) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(info.name, info.documentation, labels=info.labels)


class QueueCollector:
    """Computes the ``jobguard_queue_*`` gauges from the database, at most once per
    ``JOBGUARD["METRICS_CACHE_SECONDS"]``.

    It runs :func:`django_jobguard.monitoring.stats.queue_stats` (a fixed, small number of indexed
    queries) on ``alias``. An error (the database is down, or a test forbids database
    access) does not break the scrape of the other metrics: it is logged, and
    ``jobguard_queue_stats_up`` reads 0.
    """

    def __init__(self, alias: str | None = None) -> None:
        self.alias = alias
        # (monotonic time, rows) of the last computation; scrapers queue on the lock, so
        # concurrent scrapes run one set of queries and share it.
        self._lock = threading.Lock()
        self._computed: tuple[float, tuple[list[Any], ...]] | None = None

    def _queue_stats(self, alias: str) -> tuple[list[Any], ...]:
        """The queues' statistics, the flow-control limits', the breakers' (none, with no query,
        if none is declared), the workflows' and the outbox destinations' (none, with no query,
        if none is declared)."""
        ttl = get_settings().metrics_cache_seconds
        with self._lock:
            now = time.monotonic()
            if ttl > 0 and self._computed is not None and now - self._computed[0] < ttl:
                return self._computed[1]
            computed = (
                list(queue_stats(alias)),
                limit_stats(alias),
                breaker_stats(alias),
                workflow_stats(alias),
                destination_stats() if get_settings().outbox.destinations else [],
            )
            self._computed = (time.monotonic(), computed)
            return computed

    def describe(self) -> list[Any]:
        # Registering calls describe(), or collect() if there is none: keep the
        # registration free of database queries.
        return [
            _family(info)
            for info, _ in (
                *_QUEUE_FIELDS,
                *_LIMIT_FIELDS,
                *_BREAKER_FIELDS,
                *_WORKFLOW_FIELDS,
                *_OUTBOX_FIELDS,
            )
        ] + [
            _family(QUEUE_STATS_UP),
            _family(QUEUE_STATS_DURATION),
        ]

    def collect(self) -> Iterator[Any]:
        from django.db import connections, transaction

        alias = self.alias or get_settings().database_alias
        connection = connections[alias]
        # A scrape served outside a request (e.g. a metrics thread) must not leave a
        # connection open per thread: close what we opened, unless a transaction holds it.
        opened_here = connection.connection is None
        families = [(_family(info), field) for info, field in _QUEUE_FIELDS]
        began = time.perf_counter()
        up = 1.0
        try:
            # Inside a transaction (ATOMIC_REQUESTS), a savepoint, so a failed query cannot
            # poison it; in autocommit a failed query harms nothing.
            guard = transaction.atomic(using=alias) if connection.in_atomic_block else nullcontext()
            with guard:
                rows, limits, breakers, flows, outboxes = self._queue_stats(alias)
            for queue, values in _by_label(rows).items():
                for family, field in families:
                    family.add_metric([queue], values[field])
            limit_families = [(_family(info), field) for info, field in _LIMIT_FIELDS] if limits else []
            for limit in limits:
                for family, field in limit_families:
                    family.add_metric([limit.limit, limit.kind], float(getattr(limit, field)))
            families += limit_families
            workflow_families = [(_family(info), field) for info, field in _WORKFLOW_FIELDS]
            for flow in flows:
                for family, field in workflow_families:
                    family.add_metric([flow.kind], float(getattr(flow, field)))
            families += workflow_families
            breaker_families = [(_family(info), field) for info, field in _BREAKER_FIELDS] if breakers else []
            for breaker in breakers:
                for family, field in breaker_families:
                    value = getattr(breaker, field)
                    if value is not None:  # a limit with a breaker and no budget: no budget series
                        family.add_metric([breaker.limit], float(value))
            families += breaker_families
            outbox_families = [(_family(info), field) for info, field in _OUTBOX_FIELDS] if outboxes else []
            for outbox in outboxes:
                for family, field in outbox_families:
                    family.add_metric([outbox.destination], float(getattr(outbox, field)))
            families += outbox_families
        except Exception:
            # Whatever went wrong (database down, no database access at all), the rest of the
            # page must still be served: the scrape reports the gauges as down instead.
            logger.warning("queue_stats_failed alias=%s", alias, exc_info=True)
            up = 0.0
            families = [(_family(info), field) for info, field in _QUEUE_FIELDS]
        finally:
            if opened_here and not connection.in_atomic_block:
                connection.close()
        elapsed = time.perf_counter() - began
        for family, _ in families:
            yield family
        up_family = _family(QUEUE_STATS_UP)
        up_family.add_metric([], up)
        yield up_family
        duration_family = _family(QUEUE_STATS_DURATION)
        duration_family.add_metric([], elapsed)
        yield duration_family


def _by_label(rows: list[Any]) -> dict[str, dict[str, float]]:
    """Each queue's gauge values under its label; queues past the label cap summed as "other"
    (their oldest age and paused flag: the largest)."""
    merged: dict[str, dict[str, float]] = {}
    for stats in rows:
        values = {field: float(getattr(stats, field)) for _, field in _QUEUE_FIELDS}
        label = queue_label(stats.queue)
        if label not in merged:
            merged[label] = values
            continue
        into = merged[label]
        for field, value in values.items():
            largest = field in ("oldest_age_seconds", "paused")
            into[field] = max(into[field], value) if largest else into[field] + value
    return merged


_registered: dict[int, QueueCollector] = {}
_registered_lock = threading.Lock()


def register_queue_collector(registry: Any = None, alias: str | None = None) -> QueueCollector | None:
    """Register the queue collector in ``registry`` (prometheus_client's default), once.

    The app calls this at start-up, so django-prometheus's ``/metrics`` view serves the
    gauges. Returns the collector, or None without prometheus_client.
    """
    if prometheus_client is None:
        return None
    registry = registry if registry is not None else prometheus_client.REGISTRY
    with _registered_lock:
        collector = _registered.get(id(registry))
        if collector is None:
            collector = QueueCollector(alias)
            registry.register(collector)
            _registered[id(registry)] = collector
    return collector


def unregister_queue_collector(registry: Any = None) -> None:
    """Remove the queue collector from ``registry`` (a worker's metrics server does this)."""
    if prometheus_client is None:
        return
    registry = registry if registry is not None else prometheus_client.REGISTRY
    with _registered_lock:
        collector = _registered.pop(id(registry), None)
        if collector is not None:
            registry.unregister(collector)


# -- serving ---------------------------------------------------------------------------


@dataclasses.dataclass
class WorkerMetricsServer:
    """A worker's metrics HTTP server (prometheus_client's), running in a daemon thread."""

    port: int
    addr: str
    _server: Any
    _thread: Any

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_worker_metrics(port: int, addr: str = "0.0.0.0") -> WorkerMetricsServer:  # noqa: S104
    """Serve this process's counters and histogram on ``addr:port``, without the queue gauges.

    The queue gauges come from the database and are the same for every process: the web
    process's ``/metrics`` serves them, so each worker leaves them out instead of running
    the queries on every scrape. Raises :class:`OSError` if the port is taken, and
    :class:`RuntimeError` without prometheus_client.
    """
    if prometheus_client is None:
        raise RuntimeError("metrics need prometheus_client: pip install 'django-jobguard[metrics]'")
    unregister_queue_collector()
    server, thread = prometheus_client.start_http_server(port, addr=addr)
    return WorkerMetricsServer(port=server.server_port, addr=addr, _server=server, _thread=thread)


def multiprocess_mode() -> bool:
    """Whether prometheus_client's multiprocess mode is on (``PROMETHEUS_MULTIPROC_DIR`` set)."""
    return "PROMETHEUS_MULTIPROC_DIR" in os.environ or "prometheus_multiproc_dir" in os.environ


def _holds_values(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:  # gone since the directory was listed: it holds nothing now
        return False


def multiprocess_collector(registry: Any = None, path: str | None = None) -> Any:
    """prometheus_client's ``MultiProcessCollector``, skipping files no process has written yet.

    A process creates its file empty and sizes it a moment later. prometheus_client reads an
    empty file as corrupt and fails the whole scrape (client_python#1199), and a process
    killed in that moment leaves the empty file behind, failing every scrape until the
    directory is emptied. Such a file holds no value, so it is left out. ``path`` defaults to
    ``PROMETHEUS_MULTIPROC_DIR``; registers with ``registry`` when one is given.
    """
    return _skipping_collector_class()(registry, path=path)


@functools.cache
def _skipping_collector_class() -> Any:
    """The collector class, built once: prometheus_client is imported only when asked for."""
    from prometheus_client import multiprocess

    class Collector(multiprocess.MultiProcessCollector):
        @staticmethod
        def merge(files: Any, accumulate: bool = True) -> Any:
            written = [name for name in files if _holds_values(name)]
            return multiprocess.MultiProcessCollector.merge(written, accumulate)

    return Collector


def metrics_view(request: Any) -> Any:
    """A ``/metrics`` view that also works in prometheus_client's multiprocess mode.

    Without multiprocess mode it serves the default registry, like django-prometheus's
    view. In multiprocess mode django-prometheus's view serves only what the processes
    wrote to ``PROMETHEUS_MULTIPROC_DIR``; this one adds the queue gauges, which are
    computed at scrape time and never written there, and reads the directory with
    :func:`multiprocess_collector`, which survives a process killed as it started.
    """
    from django.http import HttpResponse

    if prometheus_client is None:
        return HttpResponse("prometheus_client is not installed\n", status=501, content_type="text/plain")
    if multiprocess_mode():
        registry = prometheus_client.CollectorRegistry()
        multiprocess_collector(registry)
        registry.register(QueueCollector())
    else:
        registry = prometheus_client.REGISTRY
    return HttpResponse(
        prometheus_client.generate_latest(registry), content_type=prometheus_client.CONTENT_TYPE_LATEST
    )


def reference_table() -> str:
    """The Markdown table of every metric (the body of ``docs/reference/metrics.md``)."""
    lines = [
        "| Metric | Type | Labels | Exposed by | Meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for info in CATALOGUE:
        labels = ", ".join(f"`{label}`" for label in info.labels) or "none"
        lines.append(f"| `{info.name}` | {info.type} | {labels} | {info.source} | {info.documentation} |")
    return "\n".join(lines) + "\n"


def event_loop_sampled(in_use: int, slots: int, lag: float) -> None:
    """Set the gauges of the worker's event loop."""
    ASYNC_SLOTS.set(slots)
    ASYNC_SLOTS_IN_USE.set(in_use)
    EVENT_LOOP_LAG.set(lag)


def horizon_sampled(age_seconds: float, xid_age: int) -> None:
    """Set the gauges of the vacuum horizon's oldest holder."""
    VACUUM_HORIZON_AGE.set(age_seconds)
    VACUUM_HORIZON_XID_AGE.set(xid_age)


def schedule_tick_enqueued(schedule: str, lag: float) -> None:
    """Count one tick's job of ``schedule``, enqueued ``lag`` seconds after the tick's time."""
    _child(SCHEDULE_TICKS, schedule).inc()
    _child(SCHEDULE_LAG, schedule).observe(max(0.0, lag))


def schedule_ticks_missed(schedule: str, count: int = 1) -> None:
    _child(SCHEDULE_MISSED, schedule).inc(count)


def key_conflict(task: str, where: str) -> None:
    KEY_CONFLICTS.labels(task, where).inc()


def cache_invalidated(cache: str, status: str, count: int = 1) -> None:
    """Count ``count`` keys invalidated on cache alias ``cache`` (status ``ok`` or ``error``)."""
    _child(CACHE_INVALIDATIONS, cache, status).inc(count)


def stale_write_rejected(cache: str) -> None:
    """Count a versioned write that lost to the version the cache held."""
    _child(CACHE_STALE_WRITES, cache).inc()


def durable_invalidation(cache: str, status: str) -> None:
    """Count a durable invalidation event (``enqueued``, ``completed_at_commit``, ...) on ``cache``."""
    _child(CACHE_DURABLE, cache, status).inc()


def refill_lease_taken(cache: str) -> None:
    """Count a get_or_set() miss that took the refill lease."""
    _child(CACHE_REFILL_LEASES, cache).inc()


def refill_waited(cache: str, status: str) -> None:
    """Count a get_or_set() miss that waited for another refill (``filled`` or ``timeout``)."""
    _child(CACHE_REFILL_WAITS, cache, status).inc()


def refill_loaded(cache: str, status: str) -> None:
    """Count a loader call of get_or_set() (``ok`` or ``error``)."""
    _child(CACHE_REFILL_LOADS, cache, status).inc()


def outbox_delivered(destination: str, lag: float) -> None:
    """Count a delivered outbox message and observe its publish-to-delivery lag."""
    _child(OUTBOX_DELIVERED, destination).inc()
    _child(OUTBOX_DELIVERY_LAG, destination).observe(max(0.0, lag))


def outbox_failed(destination: str, category: str, *, retried: bool) -> None:
    """Count a failed outbox send, and its retry when the message waits for another attempt."""
    _child(OUTBOX_FAILED, destination, category).inc()
    if retried:
        _child(OUTBOX_RETRIED, destination).inc()


# -- the events sink --------------------------------------------------------------------------

_REPORTS: dict[type, Callable[[Any], None]] = {
    events.JobEnqueued: lambda e: job_enqueued(e.queue, e.task, e.count),
    events.JobSucceeded: lambda e: job_succeeded(e.queue, e.task, e.duration),
    events.JobFailed: lambda e: job_failed(e.queue, e.task, e.category, e.duration, retried=e.retried),
    events.JobDeadLettered: lambda e: job_dead_lettered(e.queue, e.task, e.reason),
    events.ReplayMoved: lambda e: replay_transition(e.queue, e.task, e.action),
    events.LockContended: lambda e: lock_contended(e.queue, e.task),
    events.ClaimThrottled: lambda e: _child(CLAIMS_THROTTLED, e.reason).inc(),
    events.BreakerChanged: lambda e: _child(BREAKER_TRANSITIONS, e.limit, e.to_state).inc(),
    events.LockFailed: lambda e: lock_failed(e.queue, e.task, e.reason),
    events.LeaseReappeared: lambda e: reappeared(e.queue, e.count),
    events.LeaseLost: lambda e: lease_lost(e.queue, e.task, e.operation),
    events.DuplicatePrevented: lambda e: duplicate_prevented(e.task, e.where),
    events.UniqueConflict: lambda e: unique_conflict(e.queue, e.task),
    events.KeyConflict: lambda e: key_conflict(e.task, e.where),
    events.StatementRetried: lambda e: statement_retried(e.operation, e.reason),
    events.ScheduleTicked: lambda e: schedule_tick_enqueued(e.schedule, e.lag),
    events.ScheduleTicksMissed: lambda e: schedule_ticks_missed(e.schedule, e.count),
    events.WorkflowCallbackEnqueued: lambda e: WORKFLOW_CALLBACKS.labels(e.kind, e.when).inc(),
    events.CacheInvalidated: lambda e: cache_invalidated(e.cache, e.status, e.count),
    events.EventLoopSampled: lambda e: event_loop_sampled(e.in_use, e.slots, e.lag),
    events.HorizonSampled: lambda e: horizon_sampled(e.age_seconds, e.xid_age),
    events.JobTransactionSampled: lambda e: JOB_TRANSACTION_AGE.set(e.age_seconds),
    events.JobsPruned: lambda e: JOBS_PRUNED.labels(e.status).inc(e.count),
    events.StaleWriteRejected: lambda e: stale_write_rejected(e.cache),
    events.DurableInvalidation: lambda e: durable_invalidation(e.cache, e.status),
    events.RefillLeaseTaken: lambda e: refill_lease_taken(e.cache),
    events.RefillWaited: lambda e: refill_waited(e.cache, e.status),
    events.RefillLoaded: lambda e: refill_loaded(e.cache, e.status),
    outbox_events.OutboxDelivered: lambda e: outbox_delivered(e.destination, e.lag),
    outbox_events.OutboxFailed: lambda e: outbox_failed(e.destination, e.category, retried=e.retried),
    outbox_events.OutboxDead: lambda e: _child(
        OUTBOX_DEAD, e.destination, "held" if e.held else "passed"
    ).inc(),
    outbox_events.OutboxResolved: lambda e: _child(OUTBOX_RESOLVED, e.destination, e.action).inc(),
    outbox_events.OutboxThrottled: lambda e: _child(OUTBOX_THROTTLED, e.destination, e.reason).inc(),
}


def sink(event: Any) -> None:
    """The Prometheus sink of :mod:`django_jobguard.events` (installed by the app's ``ready()``)."""
    report = _REPORTS.get(type(event))
    if report is not None:
        report(event)
