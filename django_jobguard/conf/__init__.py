"""The ``JOBGUARD`` setting: every default, typed, in one place, validated on first use.

Resolution order for per-job options (visibility timeout, attempts, retry schedule):
the ``@task(...)`` option, then the queue's entry in ``JOBGUARD["QUEUES"]``, then the
global default in :mod:`.defaults`. Top-level keys and group keys (``LOCKS``...) are upper
case; queue options and retry policies are lower case because they mirror ``@task`` keyword
arguments.

Values are parsed once and cached; the cache is dropped on ``setting_changed`` so
``override_settings(JOBGUARD=...)`` works in tests.

Where things are: :mod:`.defaults` (every key, its default and its comment), :mod:`.settings`
(``Settings`` and ``parse()``), and one module per area, each with its dataclasses and their
checks: :mod:`.queue_settings` (queues and retries), :mod:`.limits` (shared limits, breakers, retry
budgets), :mod:`.workers` (the worker process, its databases, ``TUNING``), :mod:`.services`
(``LOCKS``, ``IDEMPOTENCY``, ``REPLAY``, ``CACHE``), :mod:`.horizon` (``HORIZON``, the vacuum
horizon), :mod:`.retention` (``RETENTION``, how long finished jobs are kept), :mod:`.api`,
:mod:`.payloads`, :mod:`.schedule_settings` and :mod:`.outbox` (``OUTBOX``). Import every
name from ``django_jobguard.conf``.
"""

from __future__ import annotations

import functools
from typing import Any

from .api import ApiSettings
from .defaults import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_PAYLOAD_DEPTH,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_VISIBILITY_TIMEOUT_SECONDS,
    DEFAULTS,
)
from .encryption import EncryptionSettings
from .horizon import HorizonSettings
from .limits import (
    BREAKER_DEFAULTS,
    LIMIT_OPTIONS,
    RETRY_BUDGET_DEFAULTS,
    BreakerSpec,
    NamedLimit,
    RetryBudgetSpec,
)
from .outbox import DestinationConfig, OutboxSettings
from .payloads import MAX_PAYLOAD_DEPTH_CEILING
from .queue_settings import (
    QUEUE_ONLY_OPTIONS,
    QUEUE_OPTION_KEYS,
    QUEUE_OPTIONS,
    QueueConfig,
    RetryOverrides,
    RetryPolicy,
)
from .retention import RETENTION_STATUSES, RetentionPolicy, RetentionSettings
from .schedule_settings import MAX_SCHEDULE_NAME_LENGTH, MISSED_POLICIES, ScheduleConfig, SchedulerSettings
from .services import CacheSettings, IdempotencySettings, LockSettings, ReplaySettings
from .settings import Settings, parse
from .workers import MAX_ACK_WINDOW_SECONDS, NOTIFY_MODES, WORKER_ID_MAX_LENGTH, TuningSettings

__all__ = [
    "BREAKER_DEFAULTS",
    "DEFAULTS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_PAYLOAD_DEPTH",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_VISIBILITY_TIMEOUT_SECONDS",
    "LIMIT_OPTIONS",
    "MAX_ACK_WINDOW_SECONDS",
    "MAX_PAYLOAD_DEPTH_CEILING",
    "MAX_SCHEDULE_NAME_LENGTH",
    "MISSED_POLICIES",
    "NOTIFY_MODES",
    "QUEUE_ONLY_OPTIONS",
    "QUEUE_OPTIONS",
    "QUEUE_OPTION_KEYS",
    "RETENTION_STATUSES",
    "RETRY_BUDGET_DEFAULTS",
    "WORKER_ID_MAX_LENGTH",
    "ApiSettings",
    "BreakerSpec",
    "CacheSettings",
    "DestinationConfig",
    "EncryptionSettings",
    "HorizonSettings",
    "IdempotencySettings",
    "LockSettings",
    "NamedLimit",
    "OutboxSettings",
    "QueueConfig",
    "ReplaySettings",
    "RetentionPolicy",
    "RetentionSettings",
    "RetryBudgetSpec",
    "RetryOverrides",
    "RetryPolicy",
    "ScheduleConfig",
    "SchedulerSettings",
    "Settings",
    "TuningSettings",
    "get_settings",
    "parse",
    "reload",
]


@functools.cache
def get_settings() -> Settings:
    """The current settings, parsed from ``django.conf.settings.JOBGUARD`` on first use."""
    from django.conf import settings

    return parse(getattr(settings, "JOBGUARD", None))


def reload(**kwargs: Any) -> None:
    """Drop the cached settings (connected to ``setting_changed``)."""
    if kwargs.get("setting", "JOBGUARD") == "JOBGUARD":
        get_settings.cache_clear()
