"""Django system checks (``jobguard.E0xx`` errors, ``jobguard.W0xx`` warnings).

IDs are listed in docs/reference/checks.md; a retired ID is never reused.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E001: the JOBGUARD setting is invalid."""
    from .conf import get_settings

    try:
        get_settings()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="See the settings reference in the django-jobguard docs (docs/reference/settings.md).",
                id="jobguard.E001",
            )
        ]
    return []


# Not tagged "database": these read settings only and never connect, so they run with
# every command (Django skips database-tagged checks unless --database is given).
@checks.register()
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E002: unknown alias; E003: unsupported database; W001: SQLite without IMMEDIATE."""
    from django.db import connections

    from .conf import get_settings

    try:
        alias = get_settings().database_alias
    except ImproperlyConfigured:
        return []
    if alias not in connections.settings:
        return [
            checks.Error(
                f"JOBGUARD['DATABASE_ALIAS'] is {alias!r}, which is not in DATABASES.",
                hint="Name one of your DATABASES aliases.",
                id="jobguard.E002",
            )
        ]
    connection = connections[alias]
    messages: list[checks.CheckMessage] = []
    if connection.vendor not in ("postgresql", "sqlite"):
        messages.append(
            checks.Error(
                f"django-jobguard supports PostgreSQL and SQLite; {alias!r} is {connection.vendor}.",
                hint="Point JOBGUARD['DATABASE_ALIAS'] at a PostgreSQL or SQLite database.",
                id="jobguard.E003",
            )
        )
    elif connection.vendor == "sqlite":
        options = connection.settings_dict.get("OPTIONS", {})
        if options.get("transaction_mode") != "IMMEDIATE":
            messages.append(
                checks.Warning(
                    "SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE': concurrent workers "
                    "can fail with 'database is locked' when a transaction upgrades to a write.",
                    hint="Set OPTIONS={'transaction_mode': 'IMMEDIATE', 'timeout': 20} "
                    "(and 'init_command': 'PRAGMA journal_mode=WAL;').",
                    id="jobguard.W001",
                )
            )
    return messages


@checks.register(checks.Tags.caches)
def check_lock_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E004: the Redis lock back end names a cache that is not django-redis."""
    from django.conf import settings

    from ._redis import is_django_redis
    from .conf import get_settings

    try:
        locks = get_settings().locks
    except ImproperlyConfigured:
        return []
    if locks.backend != "redis":
        return []
    cache = getattr(settings, "CACHES", {}).get(locks.cache_alias)
    if cache is None:
        problem = "is not in CACHES"
    elif not is_django_redis(str(cache.get("BACKEND", ""))):
        problem = (
            f"has BACKEND {cache.get('BACKEND')!r}; the Redis lock back end needs django-redis "
            "(or a subclass of its cache)"
        )
    else:
        return []
    return [
        checks.Error(
            f"JOBGUARD['LOCKS']['CACHE_ALIAS'] is {locks.cache_alias!r}, which {problem}.",
            hint="Point it at a cache with BACKEND 'django_redis.cache.RedisCache', or set "
            "JOBGUARD['LOCKS']['BACKEND'] = 'database'.",
            id="jobguard.E004",
        )
    ]


@checks.register(checks.Tags.caches)
def check_cache_alias(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E005: the cache invalidation feature names a cache alias that is not in CACHES.

    Only when the feature is configured (``JOBGUARD["CACHE"]`` given) or used (a model
    declared with ``cache.invalidates()``), so projects that do not use it are not bothered.
    """
    from django.conf import settings

    from . import cache
    from .conf import get_settings

    try:
        alias = get_settings().cache.alias
    except ImproperlyConfigured:
        return []
    raw = getattr(settings, "JOBGUARD", None)
    wanted: dict[str, str] = {}
    declared = cache.declarations()
    if (isinstance(raw, dict) and "CACHE" in raw) or any(d.cache_alias is None for d in declared):
        wanted[alias] = "JOBGUARD['CACHE']['ALIAS']"
    for declaration in declared:
        if declaration.cache_alias is not None:
            wanted.setdefault(
                declaration.cache_alias, f"invalidates({declaration.model._meta.label})'s cache_alias"
            )
    configured = getattr(settings, "CACHES", {})
    return [
        checks.Error(
            f"{where} is {name!r}, which is not in CACHES.",
            hint="Name one of your CACHES aliases (JOBGUARD['CACHE']['ALIAS'] defaults to 'default').",
            id="jobguard.E005",
        )
        for name, where in sorted(wanted.items())
        if name not in configured
    ]


#: PgBouncer's default port: an undeclared alias on it is most likely pooled (jobguard.W061).
PGBOUNCER_DEFAULT_PORT = "6432"


# Not tagged "database" either: these read DATABASES and never connect. A pooler cannot
# be detected over SQL (PgBouncer answers as the server), so aliases are declared in
# JOBGUARD["POOLED_DATABASES"]; only PgBouncer's default port is taken as a hint.
@checks.register()
def check_pooled_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W060: a pooled alias with settings that break in transaction mode;
    W061: an alias on PgBouncer's port not declared pooled; W062: workers will poll, not LISTEN."""
    from django.db import connections

    from .conf import get_settings

    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    messages: list[checks.CheckMessage] = []
    for alias in sorted(conf.pooled_databases):
        db = connections.settings[alias]
        if not db.get("ENGINE", "").endswith("postgresql"):
            continue
        problems = []
        if not db.get("DISABLE_SERVER_SIDE_CURSORS"):
            problems.append(
                "DISABLE_SERVER_SIDE_CURSORS is not True (server-side cursors outlive a transaction)"
            )
        if db.get("OPTIONS", {}).get("prepare_threshold", 5) is not None:
            problems.append(
                "OPTIONS['prepare_threshold'] is not None (psycopg prepares statements per session)"
            )
        if problems:
            messages.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] is in JOBGUARD['POOLED_DATABASES'] but {'; '.join(problems)}.",
                    hint="Behind PgBouncer in transaction mode set 'DISABLE_SERVER_SIDE_CURSORS': True "
                    "and 'OPTIONS': {'prepare_threshold': None} (docs/how-to/scale-out.md).",
                    id="jobguard.W060",
                )
            )
    for alias, db in connections.settings.items():
        if str(db.get("PORT", "")) == PGBOUNCER_DEFAULT_PORT and alias not in conf.pooled_databases:
            if alias == conf.listen_database:
                continue  # declared as the direct connection: the operator knows what is there
            messages.append(
                checks.Warning(
                    f"DATABASES[{alias!r}] uses port {PGBOUNCER_DEFAULT_PORT}, PgBouncer's default, but "
                    "is not in JOBGUARD['POOLED_DATABASES'].",
                    hint="If it goes through a pooler in transaction mode, add it to "
                    "JOBGUARD['POOLED_DATABASES'] so jobguard keeps no session state on it.",
                    id="jobguard.W061",
                )
            )
    alias = conf.database_alias
    if alias in conf.pooled_databases and alias in connections.settings:
        listen = conf.listen_database
        reason = ""
        if not listen:
            reason = (
                f"JOBGUARD['DATABASE_ALIAS'] {alias!r} is pooled and JOBGUARD['LISTEN_DATABASE'] is not set"
            )
        elif connections.settings[listen].get("NAME") != connections.settings[alias].get("NAME"):
            # NOTIFY is delivered within one database only.
            reason = f"JOBGUARD['LISTEN_DATABASE'] {listen!r} names another database than {alias!r}"
        if reason:
            messages.append(
                checks.Warning(
                    f"Workers poll every POLL_INTERVAL instead of waking on NOTIFY: {reason}.",
                    hint="Add a DATABASES alias for the same database that bypasses the pooler and "
                    "name it in JOBGUARD['LISTEN_DATABASE'].",
                    id="jobguard.W062",
                )
            )
    return messages
