"""``Settings``, the parsed ``JOBGUARD``, and ``parse()``, which builds it area by area."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._values import (
    boolean,
    fail,
    integer,
    mapping,
    merged_group,
    number,
    queue_setting,
    reject_unknown,
    string,
)
from .api import ApiSettings, parse_api_settings, parse_page_sizes
from .defaults import DEFAULTS
from .encryption import EncryptionSettings, parse_encryption_settings
from .horizon import HorizonSettings, parse_horizon_settings
from .limits import NamedLimit, parse_limits
from .outbox import OutboxSettings, parse_outbox_settings
from .payloads import parse_depth, parse_redact
from .queue_settings import (
    QueueConfig,
    RetryPolicy,
    parse_queues,
    parse_retry_policies,
    parse_unclassified_errors,
)
from .retention import RetentionPolicy, RetentionSettings, parse_retention_settings
from .schedule_settings import ScheduleConfig, SchedulerSettings, parse_scheduler_settings, parse_schedules
from .services import (
    CacheSettings,
    IdempotencySettings,
    LockSettings,
    ReplaySettings,
    parse_cache_settings,
    parse_idempotency_settings,
    parse_lock_settings,
    parse_locks_group,
    parse_replay_settings,
)
from .workers import (
    TuningSettings,
    parse_ack_window,
    parse_listen_database,
    parse_liveness_file,
    parse_notify,
    parse_notify_interval,
    parse_pooled_databases,
    parse_store,
    parse_tuning_settings,
    parse_wakeup_cache,
    parse_worker_id,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """The parsed, validated ``JOBGUARD`` setting."""

    database_alias: str
    #: ``STORE``: "database", or "memory" (tests only, see :mod:`django_jobguard.store.memory`).
    store: str
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
    #: ``WAKEUP_CACHE``: the django-redis cache alias enqueues publish wake-ups through, or "".
    wakeup_cache: str
    #: ``NOTIFY``: "coalesced", "row" or "none" (how an enqueue on PostgreSQL wakes idle workers).
    notify: str
    #: ``NOTIFY_INTERVAL``: seconds between two coalesced NOTIFYs of one queue from one process.
    notify_interval: float
    locks: LockSettings
    idempotency: IdempotencySettings
    replay: ReplaySettings
    cache: CacheSettings
    api: ApiSettings
    queues: Mapping[str, QueueConfig]
    allow_undeclared_queues: bool
    max_payload_bytes: int
    max_payload_depth: int
    #: ``MAX_RESULT_BYTES``: bytes a return value may take as stored JSON (a task may set its own).
    max_result_bytes: int
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

    @property
    def outbox_alias(self) -> str:
        """The alias of the outbox tables: ``OUTBOX["DATABASE_ALIAS"]``, else ``DATABASE_ALIAS``."""
        return self.outbox.database_alias or self.database_alias

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
    # Frozen, so one shared default instance is safe (ruff cannot tell across modules).
    scheduler: SchedulerSettings = SchedulerSettings(interval=1.0, missed_after=60.0, catch_up_max=100)  # noqa: RUF009
    limits: Mapping[str, NamedLimit] = dataclasses.field(default_factory=dict)
    #: ``OPENTELEMETRY``: trace enqueues and runs (see :mod:`django_jobguard.monitoring.tracing`).
    opentelemetry: bool = False
    #: ``OPENTELEMETRY_PARENT``: the run's span is a child of the enqueue's, not linked to it.
    opentelemetry_parent: bool = False
    #: ``OPENTELEMETRY_BAGGAGE``: the baggage entries that cross the queue (none by default).
    opentelemetry_baggage: frozenset[str] = frozenset()
    #: ``HORIZON``: when a held vacuum horizon is named; how long an atomic task may run.
    horizon: HorizonSettings = HorizonSettings()  # noqa: RUF009 (frozen)
    #: ``RETENTION``: how long finished jobs are kept, and the workers' pruning pass.
    retention: RetentionSettings = RetentionSettings()  # noqa: RUF009 (frozen)
    #: ``TESTING["MODE"]``: "manual" (jobs wait for a worker or run_jobs()) or "inline".
    testing_mode: str = "manual"
    #: ``ENCRYPTION``: the keys payloads at rest are encrypted with (see :mod:`django_jobguard.encryption`).
    encryption: EncryptionSettings = EncryptionSettings()  # noqa: RUF009 (frozen)
    #: ``OUTBOX``: the destinations publish() may name, and the relay (see :mod:`django_jobguard.outbox`).
    outbox: OutboxSettings = OutboxSettings()  # noqa: RUF009 (frozen)

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

    def retention_for(self, queue: str) -> RetentionPolicy:
        """How long queue ``queue``'s finished jobs are kept: its own ``retention``, else ``RETENTION``."""
        config = self.queues.get(queue)
        if config is not None and config.retention is not None:
            return config.retention
        return self.retention.policy

    def listen_alias(self, alias: str) -> str | None:
        """The alias to LISTEN on for workers of ``alias``; None when only polling is safe or
        ``NOTIFY`` is "none" (nothing would arrive: no connection is held for it).

        ``LISTEN`` needs a session of its own, which a transaction-mode pooler does not
        give: notifications would reach whichever client next borrows that server connection.
        """
        if self.notify == "none":
            return None
        if self.listen_database:
            return self.listen_database
        return None if alias in self.pooled_databases else alias


def parse(raw: Any) -> Settings:
    """Validate ``raw`` (the ``JOBGUARD`` dict) and return the typed settings."""
    raw = mapping(raw if raw is not None else {}, ())
    reject_unknown(raw, set(DEFAULTS), ())
    merged = {**DEFAULTS, **raw}

    # The order of the checks below is the order in which errors are reported: keep it.
    retry, recoverable = parse_retry_policies(merged)
    visibility = number(merged["VISIBILITY_TIMEOUT"], ("VISIBILITY_TIMEOUT",), minimum=1)
    attempts = integer(merged["MAX_ATTEMPTS"], ("MAX_ATTEMPTS",), minimum=1)
    retention = parse_retention_settings(merged_group(raw, "RETENTION"))
    queues = parse_queues(merged["QUEUES"], visibility, attempts, retry, recoverable, retention.policy)
    unclassified = parse_unclassified_errors(merged)
    locks = parse_locks_group(raw)
    worker_id = parse_worker_id(merged["WORKER_ID"])
    liveness_file = parse_liveness_file(merged["LIVENESS_FILE"])
    pooled = parse_pooled_databases(merged["POOLED_DATABASES"])
    listen = parse_listen_database(merged["LISTEN_DATABASE"], pooled)
    idem = merged_group(raw, "IDEMPOTENCY")
    replay = merged_group(raw, "REPLAY")
    cache = merged_group(raw, "CACHE")
    tuning = merged_group(raw, "TUNING")
    api = merged_group(raw, "API")
    page_size, max_page_size = parse_page_sizes(api)
    scheduler = merged_group(raw, "SCHEDULER")
    horizon = merged_group(raw, "HORIZON")
    testing = merged_group(raw, "TESTING")
    encryption = merged_group(raw, "ENCRYPTION")
    outbox = merged_group(raw, "OUTBOX")
    limits = parse_limits(merged["LIMITS"])

    return Settings(
        database_alias=string(merged["DATABASE_ALIAS"], ("DATABASE_ALIAS",)),
        store=parse_store(merged["STORE"]),
        default_queue=queue_setting(merged["DEFAULT_QUEUE"], ("DEFAULT_QUEUE",)),
        visibility_timeout=visibility,
        max_attempts=attempts,
        retry=retry,
        recoverable_retry=recoverable,
        unclassified_errors=unclassified,
        handler_version=merged["HANDLER_VERSION"],
        poll_interval=number(merged["POLL_INTERVAL"], ("POLL_INTERVAL",), allow_zero=False),
        reaper_interval=number(merged["REAPER_INTERVAL"], ("REAPER_INTERVAL",), allow_zero=False),
        batch_size=integer(merged["BATCH_SIZE"], ("BATCH_SIZE",), minimum=0),
        shutdown_grace=number(merged["SHUTDOWN_GRACE"], ("SHUTDOWN_GRACE",)),
        ack_window=parse_ack_window(merged["ACK_WINDOW"]),
        ack_batch_size=integer(merged["ACK_BATCH_SIZE"], ("ACK_BATCH_SIZE",), minimum=1),
        worker_id=worker_id,
        maintenance_leader=boolean(merged["MAINTENANCE_LEADER"], ("MAINTENANCE_LEADER",)),
        liveness_file=liveness_file,
        pooled_databases=pooled,
        listen_database=listen,
        wakeup_cache=parse_wakeup_cache(merged["WAKEUP_CACHE"]),
        notify=parse_notify(merged["NOTIFY"]),
        notify_interval=parse_notify_interval(merged["NOTIFY_INTERVAL"]),
        locks=parse_lock_settings(locks),
        idempotency=parse_idempotency_settings(idem),
        replay=parse_replay_settings(replay),
        cache=parse_cache_settings(cache),
        api=parse_api_settings(api, page_size, max_page_size),
        queues=queues,
        allow_undeclared_queues=boolean(merged["ALLOW_UNDECLARED_QUEUES"], ("ALLOW_UNDECLARED_QUEUES",)),
        max_payload_bytes=integer(merged["MAX_PAYLOAD_BYTES"], ("MAX_PAYLOAD_BYTES",), minimum=1),
        max_payload_depth=parse_depth(merged["MAX_PAYLOAD_DEPTH"]),
        max_result_bytes=integer(merged["MAX_RESULT_BYTES"], ("MAX_RESULT_BYTES",), minimum=1),
        max_error_chars=integer(merged["MAX_ERROR_CHARS"], ("MAX_ERROR_CHARS",), minimum=256),
        redact=parse_redact(merged["REDACT"]),
        metrics_cache_seconds=number(merged["METRICS_CACHE_SECONDS"], ("METRICS_CACHE_SECONDS",)),
        metrics_max_undeclared_queues=integer(
            merged["METRICS_MAX_UNDECLARED_QUEUES"], ("METRICS_MAX_UNDECLARED_QUEUES",), minimum=0
        ),
        tuning=parse_tuning_settings(tuning),
        schedules=parse_schedules(merged["SCHEDULES"]),
        scheduler=parse_scheduler_settings(scheduler),
        limits=limits,
        opentelemetry=boolean(merged["OPENTELEMETRY"], ("OPENTELEMETRY",)),
        opentelemetry_parent=boolean(merged["OPENTELEMETRY_PARENT"], ("OPENTELEMETRY_PARENT",)),
        opentelemetry_baggage=_baggage_names(merged["OPENTELEMETRY_BAGGAGE"]),
        horizon=parse_horizon_settings(horizon),
        retention=retention,
        testing_mode=_testing_mode(testing),
        encryption=parse_encryption_settings(encryption),
        outbox=parse_outbox_settings(outbox, retry, limits),
    )


#: The values of ``TESTING["MODE"]`` (see :mod:`django_jobguard.testing`).
TESTING_MODES = ("manual", "inline")


def _testing_mode(testing: Mapping[str, Any]) -> str:
    """``TESTING["MODE"]``: how enqueued jobs run, "manual" or "inline"."""
    value = testing["MODE"]
    if value not in TESTING_MODES:
        raise fail(("TESTING", "MODE"), f'must be "manual" or "inline", not {value!r}.')
    return str(value)


def _baggage_names(value: Any) -> frozenset[str]:
    """``OPENTELEMETRY_BAGGAGE``: a list of baggage entry names (W3C keys: no spaces, no ``,;=``)."""
    path = ("OPENTELEMETRY_BAGGAGE",)
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise fail(path, f"must be a list of baggage entry names such as ['tenant.id'], not {value!r}.")
    names = frozenset(string(name, path) for name in value)
    for name in sorted(names):
        if any(ch in name for ch in ',;="\\') or not name.isprintable() or any(ch.isspace() for ch in name):
            raise fail(path, f"holds {name!r}, not a baggage entry name (no spaces, commas, ';' or '=').")
    return names
