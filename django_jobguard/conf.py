"""The ``JOBGUARD`` setting: every default, typed, in one place, validated on first use.

Resolution order for per-job options (visibility timeout, attempts, retry schedule):
the ``@task(...)`` option, then the queue's entry in ``JOBGUARD["QUEUES"]``, then the
global default below. Top-level keys and group keys (``LOCKS``...) are upper case; queue
options and retry policies are lower case because they mirror ``@task`` keyword arguments.

Values are parsed once and cached; the cache is dropped on ``setting_changed`` so
``override_settings(JOBGUARD=...)`` works in tests.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .flow import Rate, parse_rate

__all__ = [
    "CacheSettings",
    "QueueConfig",
    "RetryOverrides",
    "RetryPolicy",
    "ScheduleConfig",
    "SchedulerSettings",
    "Settings",
    "TuningSettings",
    "get_settings",
    "reload",
]

DEFAULT_VISIBILITY_TIMEOUT_SECONDS = 60
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_MAX_PAYLOAD_DEPTH = 64
# Deeper than this, PostgreSQL's JSON parser and json.loads come near their own stack limits.
MAX_PAYLOAD_DEPTH_CEILING = 500
#: Characters of a worker id (the ``worker_id`` column's length).
WORKER_ID_MAX_LENGTH = 128

#: Every setting with its default. The settings reference in docs/ is generated from this.
DEFAULTS: dict[str, Any] = {
    # Database alias that stores jobs, keys and dead letters. Enqueue joins the caller's
    # transaction only when it runs on this alias.
    "DATABASE_ALIAS": "default",
    # Queue used when a task names none.
    "DEFAULT_QUEUE": "default",
    # Per-queue options: visibility_timeout, max_attempts, retry, recoverable_retry, and
    # concurrency (jobs of the queue running at once across every worker). Once any
    # queue is declared here, enqueue, jobguard_worker --queue and jobguard_status --queue
    # refuse a queue that is neither declared nor DEFAULT_QUEUE.
    "QUEUES": {},
    # Shared limits that tasks name with @task(limit="stripe"): {"stripe": {"rate": "25/s",
    # "burst": 25, "concurrency": 10}}. Each entry needs rate or concurrency (or both); burst
    # defaults to one second's worth of the rate. Enforced at claim across every worker.
    "LIMITS": {},
    # Accept queue names QUEUES does not declare (free-form queues, as with no QUEUES at all).
    "ALLOW_UNDECLARED_QUEUES": False,
    # Bytes a job's args and kwargs may take together as compact UTF-8 JSON (1 MiB); checked
    # at enqueue and replay, before anything is written.
    "MAX_PAYLOAD_BYTES": DEFAULT_MAX_PAYLOAD_BYTES,
    # Seconds the queue gauges of one /metrics scrape are reused by the next ones: one set of
    # queries per interval however many scrapers ask (their cost grows with the backlog). 0
    # computes them at every scrape.
    "METRICS_CACHE_SECONDS": 5.0,
    # Queue names not declared in QUEUES that one process gives a metric label of their own;
    # past that they are counted under queue="other", so free-form names cannot grow the
    # series without bound.
    "METRICS_MAX_UNDECLARED_QUEUES": 20,
    # Characters of an error message and of a traceback stored per attempt (on the job, its
    # attempt history and its dead letter); longer ones keep their head and tail.
    "MAX_ERROR_CHARS": 8192,
    # Argument names whose values are kept out of logs and stored error text: a keyword
    # argument (or a key of a dict at any depth of the payload) with one of these names, in any
    # case, has each of its values replaced by "[redacted]" in the error messages and
    # tracebacks stored on jobs, attempts and dead letters, and in the keys log records carry.
    # Best effort: it replaces the values' text wherever it appears. Payloads are kept as sent.
    "REDACT": [],
    # Levels of nesting one argument, a result or a checkpoint may have ([] is one level).
    "MAX_PAYLOAD_DEPTH": DEFAULT_MAX_PAYLOAD_DEPTH,
    # Seconds a claimed job stays invisible to other workers without a heartbeat.
    "VISIBILITY_TIMEOUT": DEFAULT_VISIBILITY_TIMEOUT_SECONDS,
    # Attempts before a failing job is dead-lettered (the first run counts).
    "MAX_ATTEMPTS": DEFAULT_MAX_ATTEMPTS,
    # Backoff for transient errors: min(max, base * 2**(attempt-1)) + uniform(0, jitter).
    "RETRY": {"base": 5.0, "max": 300.0, "jitter": 3.0},
    # Backoff for recoverable errors (a degraded dependency): the same formula, longer.
    "RECOVERABLE_RETRY": {"base": 60.0, "max": 3600.0, "jitter": 30.0},
    # How an exception that is not classified is treated: "transient" or "permanent".
    "UNCLASSIFIED_ERRORS": "transient",
    # Handler version recorded on jobs and dead letters when a task names none.
    "HANDLER_VERSION": "",
    # Worker: seconds an idle worker waits between polls (LISTEN/NOTIFY wakes it sooner).
    "POLL_INTERVAL": 1.0,
    # Worker: seconds between passes of the reaper over expired leases.
    "REAPER_INTERVAL": 2.0,
    # Worker: most jobs held and claimed per round trip. 0 adapts: twice the concurrency,
    # then, once the worker has seen its jobs are short, about 20 ms of work per thread (at
    # most 64); for jobs over a second, only what its threads can start.
    "BATCH_SIZE": 0,
    # Worker: seconds in-flight jobs get to finish after SIGTERM before they are handed back.
    "SHUTDOWN_GRACE": 30.0,
    # Worker: seconds the acks of non-atomic tasks wait to be written together, in one
    # statement and one commit (ACK_BATCH_SIZE acks flush at once). A crash in that window
    # runs those jobs again, as a crash before any ack does. 0 writes each ack on its own.
    "ACK_WINDOW": 0.005,
    # Worker: the most acks written in one statement.
    "ACK_BATCH_SIZE": 100,
    # Worker: run the reaper, redrive and key pruning only in the one worker holding the
    # leadership row (a database lease, PgBouncer-safe); others skip them. Saves queries with
    # many workers; a dead leader delays reaping by up to three REAPER_INTERVALs.
    "MAINTENANCE_LEADER": False,
    # Worker: a file the heartbeat thread touches (at most once a second) while it runs, for a
    # liveness probe (e.g. Kubernetes exec: fail when older than a minute); "" for none.
    "LIVENESS_FILE": "",
    # Worker: its name in job rows and logs; "" means host:pid:random (unique across hosts).
    # Set it per container (e.g. from the pod name); --worker-id overrides it.
    "WORKER_ID": "",
    # Database aliases that reach PostgreSQL through a pooler in transaction mode (PgBouncer):
    # jobguard keeps no session state on them and checks their settings (jobguard.W060).
    "POOLED_DATABASES": [],
    # Alias the worker LISTENs on for enqueue wake-ups; "" means DATABASE_ALIAS unless that
    # is pooled (then workers poll). Point it at a direct connection that bypasses the pooler.
    "LISTEN_DATABASE": "",
    # Carry the OpenTelemetry trace context from the code that enqueues to the worker that
    # runs, with spans from the tracer provider the project configured (extra: [otel]).
    "OPENTELEMETRY": False,
    # With OPENTELEMETRY: the worker's span is a child of the enqueuing span (one trace)
    # instead of the start of a trace of its own that links to it.
    "OPENTELEMETRY_PARENT": False,
    "LOCKS": {
        # "database" (embedded default, any database) or "redis" (django-redis).
        "BACKEND": "database",
        # Cache alias whose django-redis connection the redis back end uses.
        "CACHE_ALIAS": "default",
        # Prefix of every lock key, so keys read jobguard:lock:order:123.
        "PREFIX": "jobguard:lock:",
        # Seconds a task lock lives without renewal; the heartbeat renews it.
        "TTL": 30.0,
        # Seconds a job waits before it is retried when its lock is taken (no attempt used).
        "CONTENTION_DELAY": 2.0,
    },
    "IDEMPOTENCY": {
        # Seconds an idempotency key is remembered after it was created.
        "TTL": 7 * 24 * 3600.0,
        # Let each worker prune expired keys while idle.
        "PRUNE_IN_WORKER": False,
    },
    "REPLAY": {
        # Let the user who requested a replay approve it too.
        "ALLOW_SELF_APPROVAL": False,
        # Approved replays redriven per minute at most, across all workers.
        "RATE_PER_MINUTE": 60,
    },
    "CACHE": {
        # Cache alias that invalidate(), invalidates(), set_versioned() and get_versioned() use
        # when the call names none.
        "ALIAS": "default",
        # Seconds the tombstone of a versioned invalidation lives: it must outlast the longest
        # time between a reader loading a row and writing it to the cache.
        "TOMBSTONE_TTL": 60.0,
        # Whether invalidate() and invalidates() are durable when the call does not say: the
        # keys are also written to a job in the writer's transaction, which a worker runs if
        # the delete after the commit did not happen (process killed, cache unreachable).
        "DURABLE": False,
        # Queue of the durable invalidation jobs; workers serve every queue unless --queue is given.
        "QUEUE": "jobguard.cache",
        # Attempts of a durable invalidation job while the cache is unreachable (the queue's
        # retry schedule spaces them) before it is dead-lettered.
        "MAX_ATTEMPTS": 20,
        # Seconds a durable invalidation job waits before a worker may run it: the committing
        # process deletes the keys itself and removes the job well within it.
        "DURABLE_DELAY": 5.0,
        # Seconds a get_or_set() refill lease lives: a loader that hangs blocks the others no longer.
        "REFILL_LEASE_TTL": 10.0,
        # Seconds a get_or_set() miss waits for another caller's refill before loading itself.
        "REFILL_WAIT": 3.0,
    },
    "TUNING": {
        # Seconds a heartbeat may come late in a slow moment (a busy machine, a database that
        # answers late). A visibility timeout should exceed a task's expected duration by it,
        # a lock TTL should be at least twice it, and jobguard_tune recommends no less.
        "HEARTBEAT_MARGIN": 5.0,
        # jobguard_tune recommends a visibility timeout of the observed p99 duration times this.
        "SAFETY_FACTOR": 2.0,
        # Tasks of one queue whose durations differ by more than this factor should be split
        # into a fast and a slow queue (check jobguard.W006, jobguard_tune).
        "QUEUE_SPLIT_FACTOR": 20.0,
        # Seconds of finished jobs that `check --database` reads for observed durations.
        "WINDOW": 24 * 3600.0,
        # Finished runs of a task in the window before its observed durations are trusted.
        "MIN_RUNS": 20,
    },
    "API": {
        # Largest JSON size, in bytes, of a job's args plus kwargs accepted by the REST API
        # (POST jobs/ and corrected replay payloads); a bigger one is refused with 400.
        "MAX_PAYLOAD_BYTES": 256 * 1024,
        # Deepest nesting of lists and objects accepted in args and kwargs over the REST API.
        "MAX_DEPTH": 32,
        # Jobs and dead letters per page of the REST API's lists (?page_size= up to MAX_PAGE_SIZE).
        "PAGE_SIZE": 50,
        # Largest ?page_size= a REST API list accepts.
        "MAX_PAGE_SIZE": 500,
        # DRF throttle rate of POST jobs/ per user ("600/minute"), or None for no limit.
        "ENQUEUE_THROTTLE_RATE": "600/minute",
        # DRF throttle rate of the other REST API writes (cancel, retry, replay steps) per user.
        "OPERATE_THROTTLE_RATE": "120/minute",
        # Seconds before now a run_after sent to the REST API may lie (older is refused, 400).
        "RUN_AFTER_PAST": 24 * 3600.0,
        # Seconds after now a run_after sent to the REST API may lie (later is refused, 400).
        "RUN_AFTER_FUTURE": 365 * 24 * 3600.0,
    },
    # Recurring jobs declared in settings: {"name": {"task": "app.tasks.f", "cron": "0 2 * * *",
    # "timezone": "UTC", "args": [], "kwargs": {}, "queue_name": None, "missed": "run_once"}}.
    # Tasks can declare their own with @task(schedule="*/5 * * * *").
    "SCHEDULES": {},
    "SCHEDULER": {
        # Seconds between two passes of a worker's scheduler over the schedules that are due.
        "INTERVAL": 1.0,
        # Seconds after its time past which a tick not yet enqueued counts as missed (then the
        # schedule's "missed" policy decides); ticks younger than this are all enqueued.
        "MISSED_AFTER": 60.0,
        # Missed ticks a "catch_up" schedule enqueues at most after an outage (the latest ones).
        "CATCH_UP_MAX": 100,
    },
}

#: The options a queue in JOBGUARD["QUEUES"] may set (QueueConfig's fields but its name).
QUEUE_OPTIONS = {"visibility_timeout", "max_attempts", "retry", "recoverable_retry", "concurrency"}
#: Queue options with no global setting behind them: what each does, for the settings reference.
QUEUE_ONLY_OPTIONS = {
    "concurrency": (
        "Jobs of this queue running at once across every worker (an integer of at least 1), "
        "enforced when jobs are claimed: a job over it waits queued, with no attempt charged. "
        "Unset: no limit, and the queue's claims stay the plain claim."
    ),
}
#: The options of an entry of JOBGUARD["LIMITS"].
LIMIT_OPTIONS = {"rate", "burst", "concurrency"}
_RETRY_KEYS = {"base", "max", "jitter"}
_CLASSIFICATIONS = {"transient", "permanent"}
_LOCK_BACKENDS = {"database", "redis"}
_SCHEDULE_KEYS = {"task", "cron", "timezone", "args", "kwargs", "queue_name", "missed"}
#: What a schedule does with ticks missed while no scheduler ran (see docs/how-to/recurring-jobs.md).
MISSED_POLICIES = ("skip", "run_once", "catch_up")
#: Schedule names are part of each tick's idempotency key, which holds 255 characters.
MAX_SCHEDULE_NAME_LENGTH = 200


def _key(*parts: str) -> str:
    return "JOBGUARD" + "".join(f"[{p!r}]" for p in parts)


def _fail(path: tuple[str, ...], message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{_key(*path)} {message}")


def _number(value: Any, path: tuple[str, ...], *, minimum: float = 0, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, f"must be a number of seconds, not {value!r}.")
    if value < minimum or (not allow_zero and value == 0):
        raise _fail(
            path, f"must be {'more than' if not allow_zero else 'at least'} {minimum}, not {value!r}."
        )
    return float(value)


def _integer(value: Any, path: tuple[str, ...], *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(path, f"must be an integer of at least {minimum}, not {value!r}.")
    return value


def _mapping(value: Any, path: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"must be a dict, not {type(value).__name__}.")
    return value


def _unknown(given: Mapping[str, Any], allowed: set[str], path: tuple[str, ...]) -> None:
    extra = sorted(set(given) - allowed)
    if extra:
        raise _fail(
            (*path, extra[0]),
            f"is not a known setting; known keys here: {', '.join(sorted(allowed))}. "
            "See docs/reference/settings.md.",
        )


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: ``min(max, base * 2**(attempt-1)) + uniform(0, jitter)``."""

    base: float
    max: float
    jitter: float

    @classmethod
    def parse(cls, value: Any, path: tuple[str, ...], fallback: RetryPolicy | None = None) -> RetryPolicy:
        """Build a policy from a dict, filling missing keys from ``fallback``."""
        if isinstance(value, RetryPolicy):
            return value
        data = _mapping(value, path)
        _unknown(data, _RETRY_KEYS, path)
        merged = {**(dataclasses.asdict(fallback) if fallback else {}), **data}
        missing = _RETRY_KEYS - set(merged)
        if missing:
            raise _fail((*path, sorted(missing)[0]), "is required.")
        policy = cls(
            base=_number(merged["base"], (*path, "base")),
            max=_number(merged["max"], (*path, "max")),
            jitter=_number(merged["jitter"], (*path, "jitter")),
        )
        if policy.max < policy.base:
            raise _fail((*path, "max"), f"({policy.max}) must not be below base ({policy.base}).")
        return policy


@dataclasses.dataclass(frozen=True, slots=True)
class RetryOverrides:
    """Some keys of a :class:`RetryPolicy` (``@task(retry={"base": 1})``).

    Resolution order: the task's keys, then its queue's policy, then the global one. The
    merge happens when a retry is scheduled, because the queue and the global settings
    cannot be read when ``@task`` runs at import time.
    """

    base: float | None = None
    max: float | None = None
    jitter: float | None = None

    @classmethod
    def parse(cls, value: Any, path: tuple[str, ...]) -> RetryOverrides:
        """Validate the keys given; the missing ones come from the queue when used."""
        data = _mapping(value, path)
        _unknown(data, _RETRY_KEYS, path)
        overrides = cls(**{key: _number(data[key], (*path, key)) for key in sorted(data)})
        if overrides.base is not None and overrides.max is not None and overrides.max < overrides.base:
            raise _fail((*path, "max"), f"({overrides.max}) must not be below base ({overrides.base}).")
        return overrides

    def over(self, policy: RetryPolicy) -> RetryPolicy:
        """This task's keys over ``policy``; a ``max`` below the merged ``base`` is raised to it."""
        base = policy.base if self.base is None else self.base
        cap = policy.max if self.max is None else self.max
        jitter = policy.jitter if self.jitter is None else self.jitter
        return RetryPolicy(base=base, max=max(cap, base), jitter=jitter)


@dataclasses.dataclass(frozen=True, slots=True)
class QueueConfig:
    """Options of one queue, already merged with the global defaults."""

    name: str
    visibility_timeout: float
    max_attempts: int
    retry: RetryPolicy
    recoverable_retry: RetryPolicy
    #: Jobs of the queue running at once across every worker; None: no limit.
    concurrency: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class NamedLimit:
    """An entry of ``JOBGUARD["LIMITS"]``: a limit several tasks share with ``@task(limit=name)``."""

    name: str
    concurrency: int | None
    rate: Rate | None


@dataclasses.dataclass(frozen=True, slots=True)
class LockSettings:
    """``JOBGUARD["LOCKS"]``."""

    backend: str
    cache_alias: str
    prefix: str
    ttl: float
    contention_delay: float


@dataclasses.dataclass(frozen=True, slots=True)
class IdempotencySettings:
    """``JOBGUARD["IDEMPOTENCY"]``."""

    ttl: float
    prune_in_worker: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ReplaySettings:
    """``JOBGUARD["REPLAY"]``."""

    allow_self_approval: bool
    rate_per_minute: int


@dataclasses.dataclass(frozen=True, slots=True)
class CacheSettings:
    """``JOBGUARD["CACHE"]``."""

    alias: str
    tombstone_ttl: float
    durable: bool = False
    queue: str = "jobguard.cache"
    max_attempts: int = 20
    durable_delay: float = 5.0
    refill_lease_ttl: float = 10.0
    refill_wait: float = 3.0


@dataclasses.dataclass(frozen=True, slots=True)
class TuningSettings:
    """``JOBGUARD["TUNING"]``: the figures the checks and ``jobguard_tune`` judge timeouts by."""

    heartbeat_margin: float
    safety_factor: float
    queue_split_factor: float
    window: float
    min_runs: int


@dataclasses.dataclass(frozen=True, slots=True)
class ApiSettings:
    """``JOBGUARD["API"]``."""

    max_payload_bytes: int
    max_depth: int
    page_size: int
    max_page_size: int
    enqueue_throttle_rate: str | None
    operate_throttle_rate: str | None
    run_after_past: float
    run_after_future: float


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduleConfig:
    """One recurring job: ``JOBGUARD["SCHEDULES"][name]`` or a task's ``schedule=`` option.

    The cron expression and the time zone are checked by the system checks (``jobguard.E010``)
    and by the scheduler, which never ticks a schedule it cannot parse.
    """

    name: str
    task: str
    cron: str
    timezone: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    queue_name: str | None = None
    missed: str = "run_once"
    #: "settings" or "code" (a task's schedule= option).
    source: str = "settings"


@dataclasses.dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """``JOBGUARD["SCHEDULER"]``."""

    interval: float
    missed_after: float
    catch_up_max: int


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """The parsed, validated ``JOBGUARD`` setting."""

    database_alias: str
    default_queue: str
    visibility_timeout: float
    max_attempts: int
    retry: RetryPolicy
    recoverable_retry: RetryPolicy
    unclassified_errors: str
    handler_version: str
    poll_interval: float
    reaper_interval: float
    batch_size: int
    shutdown_grace: float
    ack_window: float
    ack_batch_size: int
    worker_id: str
    maintenance_leader: bool
    liveness_file: str
    pooled_databases: frozenset[str]
    listen_database: str
    locks: LockSettings
    idempotency: IdempotencySettings
    replay: ReplaySettings
    cache: CacheSettings
    api: ApiSettings
    queues: Mapping[str, QueueConfig]
    allow_undeclared_queues: bool
    max_payload_bytes: int
    max_payload_depth: int
    max_error_chars: int
    #: ``REDACT``, lower-cased.
    redact: frozenset[str]
    metrics_cache_seconds: float
    metrics_max_undeclared_queues: int

    @property
    def known_queues(self) -> list[str]:
        """The queues jobs may be enqueued to, sorted: the declared ones, ``DEFAULT_QUEUE`` and the
        package's own (``CACHE["QUEUE"]``, where durable invalidations wait)."""
        return sorted({*self.queues, self.default_queue, self.cache.queue})

    def undeclared_queue(self, name: str) -> str | None:
        """Why ``name`` is refused as a queue, or None when it is accepted.

        Every name is accepted when ``QUEUES`` declares none or ``ALLOW_UNDECLARED_QUEUES``
        is set; otherwise only :attr:`known_queues` are.
        """
        if not self.queues or self.allow_undeclared_queues or name in self.known_queues:
            return None
        return (
            f"queue {name!r} is not declared in JOBGUARD['QUEUES']; known queues: "
            f"{', '.join(self.known_queues)}. Check the spelling, declare it there, or set "
            "JOBGUARD['ALLOW_UNDECLARED_QUEUES'] = True to allow free-form queue names."
        )

    tuning: TuningSettings
    schedules: Mapping[str, ScheduleConfig] = dataclasses.field(default_factory=dict)
    scheduler: SchedulerSettings = SchedulerSettings(interval=1.0, missed_after=60.0, catch_up_max=100)
    limits: Mapping[str, NamedLimit] = dataclasses.field(default_factory=dict)
    #: ``OPENTELEMETRY``: trace enqueues and runs (see :mod:`django_jobguard.tracing`).
    opentelemetry: bool = False
    #: ``OPENTELEMETRY_PARENT``: the run's span is a child of the enqueue's, not linked to it.
    opentelemetry_parent: bool = False

    def queue(self, name: str) -> QueueConfig:
        """The configuration of queue ``name`` (global defaults for queues not listed)."""
        config = self.queues.get(name)
        if config is None:
            config = QueueConfig(
                name=name,
                visibility_timeout=self.visibility_timeout,
                max_attempts=self.max_attempts,
                retry=self.retry,
                recoverable_retry=self.recoverable_retry,
            )
        return config

    def listen_alias(self, alias: str) -> str | None:
        """The alias to LISTEN on for workers of ``alias``; None when only polling is safe.

        ``LISTEN`` needs a session of its own, which a transaction-mode pooler does not
        give: notifications would reach whichever client next borrows that server connection.
        """
        if self.listen_database:
            return self.listen_database
        return None if alias in self.pooled_databases else alias


def _aliases(value: Any, path: tuple[str, ...]) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise _fail(path, f"must be a list of database aliases, not {value!r}.")
    return frozenset(_string(alias, path) for alias in value)


def _redact(value: Any) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise _fail(("REDACT",), f"must be a list of argument names such as ['card_number'], not {value!r}.")
    return frozenset(_string(name, ("REDACT",)).lower() for name in value)


def _database_alias(value: Any, path: tuple[str, ...]) -> str:
    from django.db import connections

    if value not in connections.settings:
        raise _fail(path, f"names {value!r}, which is not in DATABASES ({', '.join(connections.settings)}).")
    return str(value)


def _string(value: Any, path: tuple[str, ...]) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, f"must be a non-empty string, not {value!r}.")
    return value


def _queue_name(value: Any, path: tuple[str, ...]) -> str:
    name = _string(value, path)
    if len(name) > 100:  # the width of Job.queue_name
        raise _fail(path, f"must be at most 100 characters, not {len(name)}.")
    return name


def _boolean(value: Any, path: tuple[str, ...]) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, f"must be True or False, not {value!r}.")
    return value


_RATE_PERIODS = ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")


def _rate(value: Any, path: tuple[str, ...]) -> str | None:
    """A DRF throttle rate such as ``"600/minute"``, or None (no throttle)."""
    if value is None:
        return None
    count, _, period = value.partition("/") if isinstance(value, str) else ("", "", "")
    if not (count.isdigit() and period in _RATE_PERIODS):
        raise _fail(
            path,
            f'must be a rate such as "600/minute" (per second, minute, hour or day) or None, not {value!r}.',
        )
    return str(value)


def _group(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    given = _mapping(raw.get(name, {}), (name,))
    _unknown(given, set(DEFAULTS[name]), (name,))
    return {**DEFAULTS[name], **given}


def _json_value(value: Any, path: tuple[str, ...]) -> None:
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(path, f"must be JSON-serialisable: {exc}.") from None


def _schedules(value: Any) -> dict[str, ScheduleConfig]:
    """Validate ``JOBGUARD["SCHEDULES"]``: the shape of each entry (cron syntax: the checks)."""
    schedules: dict[str, ScheduleConfig] = {}
    for name, entry in _mapping(value, ("SCHEDULES",)).items():
        path = ("SCHEDULES", str(name))
        _string(name, path)
        if len(name) > MAX_SCHEDULE_NAME_LENGTH:
            raise _fail(path, f"is a schedule name of more than {MAX_SCHEDULE_NAME_LENGTH} characters.")
        entry = _mapping(entry, path)
        _unknown(entry, _SCHEDULE_KEYS, path)
        for required in ("task", "cron"):
            if required not in entry:
                raise _fail((*path, required), "is required.")
        args = entry.get("args", [])
        if not isinstance(args, list | tuple):
            raise _fail((*path, "args"), f"must be a list, not {type(args).__name__}.")
        kwargs = _mapping(entry.get("kwargs", {}), (*path, "kwargs"))
        _json_value(list(args), (*path, "args"))
        _json_value(dict(kwargs), (*path, "kwargs"))
        queue_name = entry.get("queue_name")
        if queue_name is not None:
            _string(queue_name, (*path, "queue_name"))
        missed = entry.get("missed", "run_once")
        if missed not in MISSED_POLICIES:
            raise _fail((*path, "missed"), f"must be one of {list(MISSED_POLICIES)}, not {missed!r}.")
        schedules[name] = ScheduleConfig(
            name=name,
            task=_string(entry["task"], (*path, "task")),
            cron=_string(entry["cron"], (*path, "cron")),
            timezone=_string(entry.get("timezone", "UTC"), (*path, "timezone")),
            args=tuple(args),
            kwargs=dict(kwargs),
            queue_name=queue_name,
            missed=missed,
        )
    return schedules


def parse(raw: Any) -> Settings:
    """Validate ``raw`` (the ``JOBGUARD`` dict) and return the typed settings."""
    raw = _mapping(raw if raw is not None else {}, ())
    _unknown(raw, set(DEFAULTS), ())
    merged = {**DEFAULTS, **raw}

    # The order of the checks below is the order in which errors are reported: keep it.
    retry, recoverable = _retry_policies(merged)
    visibility = _number(merged["VISIBILITY_TIMEOUT"], ("VISIBILITY_TIMEOUT",), minimum=1)
    attempts = _integer(merged["MAX_ATTEMPTS"], ("MAX_ATTEMPTS",), minimum=1)
    queues = _queues(merged["QUEUES"], visibility, attempts, retry, recoverable)
    unclassified = _unclassified_errors(merged)
    locks = _locks_group(raw)
    worker_id = _worker_id(merged["WORKER_ID"])
    liveness_file = _liveness_file(merged["LIVENESS_FILE"])
    pooled = _aliases(merged["POOLED_DATABASES"], ("POOLED_DATABASES",))
    for alias in sorted(pooled):
        _database_alias(alias, ("POOLED_DATABASES",))
    listen = _listen_database(merged["LISTEN_DATABASE"], pooled)
    idem = _group(raw, "IDEMPOTENCY")
    replay = _group(raw, "REPLAY")
    cache = _group(raw, "CACHE")
    tuning = _group(raw, "TUNING")
    api = _group(raw, "API")
    page_size, max_page_size = _page_sizes(api)
    scheduler = _group(raw, "SCHEDULER")

    return Settings(
        database_alias=_string(merged["DATABASE_ALIAS"], ("DATABASE_ALIAS",)),
        default_queue=_string(merged["DEFAULT_QUEUE"], ("DEFAULT_QUEUE",)),
        visibility_timeout=visibility,
        max_attempts=attempts,
        retry=retry,
        recoverable_retry=recoverable,
        unclassified_errors=unclassified,
        handler_version=merged["HANDLER_VERSION"],
        poll_interval=_number(merged["POLL_INTERVAL"], ("POLL_INTERVAL",), allow_zero=False),
        reaper_interval=_number(merged["REAPER_INTERVAL"], ("REAPER_INTERVAL",), allow_zero=False),
        batch_size=_integer(merged["BATCH_SIZE"], ("BATCH_SIZE",), minimum=0),
        shutdown_grace=_number(merged["SHUTDOWN_GRACE"], ("SHUTDOWN_GRACE",)),
        ack_window=_ack_window(merged["ACK_WINDOW"]),
        ack_batch_size=_integer(merged["ACK_BATCH_SIZE"], ("ACK_BATCH_SIZE",), minimum=1),
        worker_id=worker_id,
        maintenance_leader=_boolean(merged["MAINTENANCE_LEADER"], ("MAINTENANCE_LEADER",)),
        liveness_file=liveness_file,
        pooled_databases=pooled,
        listen_database=listen,
        locks=_lock_settings(locks),
        idempotency=_idempotency_settings(idem),
        replay=_replay_settings(replay),
        cache=_cache_settings(cache),
        api=_api_settings(api, page_size, max_page_size),
        queues=queues,
        allow_undeclared_queues=_boolean(merged["ALLOW_UNDECLARED_QUEUES"], ("ALLOW_UNDECLARED_QUEUES",)),
        max_payload_bytes=_integer(merged["MAX_PAYLOAD_BYTES"], ("MAX_PAYLOAD_BYTES",), minimum=1),
        max_payload_depth=_depth(merged["MAX_PAYLOAD_DEPTH"]),
        max_error_chars=_integer(merged["MAX_ERROR_CHARS"], ("MAX_ERROR_CHARS",), minimum=256),
        redact=_redact(merged["REDACT"]),
        metrics_cache_seconds=_number(merged["METRICS_CACHE_SECONDS"], ("METRICS_CACHE_SECONDS",)),
        metrics_max_undeclared_queues=_integer(
            merged["METRICS_MAX_UNDECLARED_QUEUES"], ("METRICS_MAX_UNDECLARED_QUEUES",), minimum=0
        ),
        tuning=_tuning_settings(tuning),
        schedules=_schedules(merged["SCHEDULES"]),
        scheduler=_scheduler_settings(scheduler),
        limits=_limits(merged["LIMITS"]),
        opentelemetry=_boolean(merged["OPENTELEMETRY"], ("OPENTELEMETRY",)),
        opentelemetry_parent=_boolean(merged["OPENTELEMETRY_PARENT"], ("OPENTELEMETRY_PARENT",)),
    )


#: The longest ACK_WINDOW: an ack held longer delays what operators see and nears leases' ends.
MAX_ACK_WINDOW_SECONDS = 1.0


def _ack_window(value: Any) -> float:
    window = _number(value, ("ACK_WINDOW",))
    if window > MAX_ACK_WINDOW_SECONDS:
        raise _fail(("ACK_WINDOW",), f"must be at most {MAX_ACK_WINDOW_SECONDS} seconds, not {value!r}.")
    return window


def _retry_policies(merged: Mapping[str, Any]) -> tuple[RetryPolicy, RetryPolicy]:
    """``RETRY`` and ``RECOVERABLE_RETRY``, each over its own default."""
    retry = RetryPolicy.parse(merged["RETRY"], ("RETRY",), RetryPolicy.parse(DEFAULTS["RETRY"], ("RETRY",)))
    recoverable = RetryPolicy.parse(
        merged["RECOVERABLE_RETRY"],
        ("RECOVERABLE_RETRY",),
        RetryPolicy.parse(DEFAULTS["RECOVERABLE_RETRY"], ("RECOVERABLE_RETRY",)),
    )
    return retry, recoverable


def _queues(
    value: Any, visibility: float, attempts: int, retry: RetryPolicy, recoverable: RetryPolicy
) -> dict[str, QueueConfig]:
    """``JOBGUARD["QUEUES"]``: each queue's options over the global ones."""
    queues: dict[str, QueueConfig] = {}
    for name, options in _mapping(value, ("QUEUES",)).items():
        path = ("QUEUES", str(name))
        _string(name, path)
        options = _mapping(options, path)
        _unknown(options, QUEUE_OPTIONS, path)
        queues[name] = QueueConfig(
            name=name,
            visibility_timeout=_number(
                options.get("visibility_timeout", visibility), (*path, "visibility_timeout"), minimum=1
            ),
            max_attempts=_integer(options.get("max_attempts", attempts), (*path, "max_attempts"), minimum=1),
            retry=RetryPolicy.parse(options.get("retry", {}), (*path, "retry"), retry),
            recoverable_retry=RetryPolicy.parse(
                options.get("recoverable_retry", {}), (*path, "recoverable_retry"), recoverable
            ),
            concurrency=_optional_integer(options.get("concurrency"), (*path, "concurrency")),
        )
    return queues


def _optional_integer(value: Any, path: tuple[str, ...]) -> int | None:
    return None if value is None else _integer(value, path, minimum=1)


def _limits(value: Any) -> dict[str, NamedLimit]:
    """``JOBGUARD["LIMITS"]``: shared limits by name, each with a rate, a concurrency or both."""
    limits: dict[str, NamedLimit] = {}
    for name, options in _mapping(value, ("LIMITS",)).items():
        path = ("LIMITS", str(name))
        _string(name, path)
        options = _mapping(options, path)
        _unknown(options, LIMIT_OPTIONS, path)
        if "rate" not in options and "concurrency" not in options:
            raise _fail(path, "needs a 'rate' (such as '25/s'), a 'concurrency' (such as 10), or both.")
        rate = None
        if options.get("rate") is not None:
            try:
                parse_rate(options["rate"])
            except ValueError as exc:
                raise _fail((*path, "rate"), f"is not a rate: {exc}.") from None
            burst = _optional_integer(options.get("burst"), (*path, "burst"))
            rate = Rate(options["rate"], burst=burst)
        elif "burst" in options:
            raise _fail((*path, "burst"), "is set without a 'rate' to burst over.")
        limits[name] = NamedLimit(
            name=name,
            concurrency=_optional_integer(options.get("concurrency"), (*path, "concurrency")),
            rate=rate,
        )
    return limits


def _unclassified_errors(merged: Mapping[str, Any]) -> str:
    """``UNCLASSIFIED_ERRORS``, after which ``HANDLER_VERSION`` is checked to be a string."""
    unclassified: str = merged["UNCLASSIFIED_ERRORS"]
    if unclassified not in _CLASSIFICATIONS:
        raise _fail(
            ("UNCLASSIFIED_ERRORS",), f"must be one of {sorted(_CLASSIFICATIONS)}, not {unclassified!r}."
        )
    if not isinstance(merged["HANDLER_VERSION"], str):
        raise _fail(("HANDLER_VERSION",), "must be a string.")
    return unclassified


def _locks_group(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``LOCKS`` group, its backend checked."""
    locks = _group(raw, "LOCKS")
    if locks["BACKEND"] not in _LOCK_BACKENDS:
        raise _fail(
            ("LOCKS", "BACKEND"), f"must be one of {sorted(_LOCK_BACKENDS)}, not {locks['BACKEND']!r}."
        )
    return locks


def _worker_id(worker_id: Any) -> str:
    if not isinstance(worker_id, str) or len(worker_id) > WORKER_ID_MAX_LENGTH:
        raise _fail(("WORKER_ID",), f"must be a string of at most {WORKER_ID_MAX_LENGTH} characters.")
    return worker_id


def _liveness_file(liveness_file: Any) -> str:
    if not isinstance(liveness_file, str):
        raise _fail(("LIVENESS_FILE",), f"must be a file path (a string), not {liveness_file!r}.")
    return liveness_file


def _listen_database(listen: Any, pooled: frozenset[str]) -> str:
    """``LISTEN_DATABASE``: empty, or a configured alias outside ``POOLED_DATABASES``."""
    if not isinstance(listen, str):
        raise _fail(("LISTEN_DATABASE",), f"must be a database alias, not {listen!r}.")
    if listen:
        _database_alias(listen, ("LISTEN_DATABASE",))
        if listen in pooled:
            raise _fail(
                ("LISTEN_DATABASE",),
                f"names {listen!r}, which is in JOBGUARD['POOLED_DATABASES']: LISTEN needs a "
                "connection that bypasses the pooler.",
            )
    return listen


def _page_sizes(api: Mapping[str, Any]) -> tuple[int, int]:
    """``API["PAGE_SIZE"]`` and ``API["MAX_PAGE_SIZE"]``, the second not below the first."""
    page_size = _integer(api["PAGE_SIZE"], ("API", "PAGE_SIZE"), minimum=1)
    max_page_size = _integer(api["MAX_PAGE_SIZE"], ("API", "MAX_PAGE_SIZE"), minimum=1)
    if max_page_size < page_size:
        raise _fail(("API", "MAX_PAGE_SIZE"), f"({max_page_size}) must not be below PAGE_SIZE ({page_size}).")
    return page_size, max_page_size


def _lock_settings(locks: Mapping[str, Any]) -> LockSettings:
    return LockSettings(
        backend=locks["BACKEND"],
        cache_alias=_string(locks["CACHE_ALIAS"], ("LOCKS", "CACHE_ALIAS")),
        prefix=_string(locks["PREFIX"], ("LOCKS", "PREFIX")),
        ttl=_number(locks["TTL"], ("LOCKS", "TTL"), allow_zero=False),
        contention_delay=_number(locks["CONTENTION_DELAY"], ("LOCKS", "CONTENTION_DELAY")),
    )


def _idempotency_settings(idem: Mapping[str, Any]) -> IdempotencySettings:
    return IdempotencySettings(
        ttl=_number(idem["TTL"], ("IDEMPOTENCY", "TTL"), allow_zero=False),
        prune_in_worker=_boolean(idem["PRUNE_IN_WORKER"], ("IDEMPOTENCY", "PRUNE_IN_WORKER")),
    )


def _replay_settings(replay: Mapping[str, Any]) -> ReplaySettings:
    return ReplaySettings(
        allow_self_approval=_boolean(replay["ALLOW_SELF_APPROVAL"], ("REPLAY", "ALLOW_SELF_APPROVAL")),
        rate_per_minute=_integer(replay["RATE_PER_MINUTE"], ("REPLAY", "RATE_PER_MINUTE"), minimum=1),
    )


def _cache_settings(cache: Mapping[str, Any]) -> CacheSettings:
    return CacheSettings(
        alias=_string(cache["ALIAS"], ("CACHE", "ALIAS")),
        tombstone_ttl=_number(cache["TOMBSTONE_TTL"], ("CACHE", "TOMBSTONE_TTL"), allow_zero=False),
        durable=_boolean(cache["DURABLE"], ("CACHE", "DURABLE")),
        queue=_queue_name(cache["QUEUE"], ("CACHE", "QUEUE")),
        max_attempts=_integer(cache["MAX_ATTEMPTS"], ("CACHE", "MAX_ATTEMPTS"), minimum=1),
        durable_delay=_number(cache["DURABLE_DELAY"], ("CACHE", "DURABLE_DELAY")),
        refill_lease_ttl=_number(cache["REFILL_LEASE_TTL"], ("CACHE", "REFILL_LEASE_TTL"), allow_zero=False),
        refill_wait=_number(cache["REFILL_WAIT"], ("CACHE", "REFILL_WAIT")),
    )


def _api_settings(api: Mapping[str, Any], page_size: int, max_page_size: int) -> ApiSettings:
    return ApiSettings(
        max_payload_bytes=_integer(api["MAX_PAYLOAD_BYTES"], ("API", "MAX_PAYLOAD_BYTES"), minimum=2),
        max_depth=_integer(api["MAX_DEPTH"], ("API", "MAX_DEPTH"), minimum=1),
        page_size=page_size,
        max_page_size=max_page_size,
        enqueue_throttle_rate=_rate(api["ENQUEUE_THROTTLE_RATE"], ("API", "ENQUEUE_THROTTLE_RATE")),
        operate_throttle_rate=_rate(api["OPERATE_THROTTLE_RATE"], ("API", "OPERATE_THROTTLE_RATE")),
        run_after_past=_number(api["RUN_AFTER_PAST"], ("API", "RUN_AFTER_PAST")),
        run_after_future=_number(api["RUN_AFTER_FUTURE"], ("API", "RUN_AFTER_FUTURE")),
    )


def _tuning_settings(tuning: Mapping[str, Any]) -> TuningSettings:
    return TuningSettings(
        heartbeat_margin=_number(tuning["HEARTBEAT_MARGIN"], ("TUNING", "HEARTBEAT_MARGIN")),
        safety_factor=_number(tuning["SAFETY_FACTOR"], ("TUNING", "SAFETY_FACTOR"), minimum=1),
        queue_split_factor=_number(tuning["QUEUE_SPLIT_FACTOR"], ("TUNING", "QUEUE_SPLIT_FACTOR"), minimum=1),
        window=_number(tuning["WINDOW"], ("TUNING", "WINDOW"), allow_zero=False),
        min_runs=_integer(tuning["MIN_RUNS"], ("TUNING", "MIN_RUNS"), minimum=1),
    )


def _scheduler_settings(scheduler: Mapping[str, Any]) -> SchedulerSettings:
    return SchedulerSettings(
        interval=_number(scheduler["INTERVAL"], ("SCHEDULER", "INTERVAL"), allow_zero=False),
        missed_after=_number(scheduler["MISSED_AFTER"], ("SCHEDULER", "MISSED_AFTER")),
        catch_up_max=_integer(scheduler["CATCH_UP_MAX"], ("SCHEDULER", "CATCH_UP_MAX"), minimum=1),
    )


def _depth(value: Any) -> int:
    depth = _integer(value, ("MAX_PAYLOAD_DEPTH",), minimum=1)
    if depth > MAX_PAYLOAD_DEPTH_CEILING:
        raise _fail(
            ("MAX_PAYLOAD_DEPTH",),
            f"must be at most {MAX_PAYLOAD_DEPTH_CEILING} (deeper JSON nears the stack limits of "
            f"PostgreSQL's parser and of json.loads), not {value!r}.",
        )
    return depth


@functools.cache
def get_settings() -> Settings:
    """The current settings, parsed from ``django.conf.settings.JOBGUARD`` on first use."""
    from django.conf import settings

    return parse(getattr(settings, "JOBGUARD", None))


def reload(**kwargs: Any) -> None:
    """Drop the cached settings (connected to ``setting_changed``)."""
    if kwargs.get("setting", "JOBGUARD") == "JOBGUARD":
        get_settings.cache_clear()
