"""Checks of the caches jobguard leans on: Redis locks, the wake-up, durable invalidation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS

from .. import cache
from .._redis import is_django_redis
from ..conf import get_settings

if TYPE_CHECKING:
    pass


@checks.register(checks.Tags.caches)
def check_lock_backend(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E004: the Redis lock back end names a cache that is not django-redis."""
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
def check_wakeup_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E006: ``WAKEUP_CACHE`` names a cache that is not django-redis."""
    try:
        alias = get_settings().wakeup_cache
    except ImproperlyConfigured:
        return []
    if not alias:
        return []
    cache = getattr(settings, "CACHES", {}).get(alias)
    if cache is None:
        problem = "is not in CACHES"
    elif not is_django_redis(str(cache.get("BACKEND", ""))):
        backend = cache.get("BACKEND")
        problem = f"has BACKEND {backend!r}; wake-ups go through Redis pub/sub, which needs django-redis"
    else:
        return []
    return [
        checks.Error(
            f"JOBGUARD['WAKEUP_CACHE'] is {alias!r}, which {problem}.",
            hint="Point it at a cache with BACKEND 'django_redis.cache.RedisCache', or set it to '' "
            "(workers then find new jobs at their next poll).",
            id="jobguard.E006",
        )
    ]


@checks.register(checks.Tags.caches)
def check_cache_alias(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E005: the cache invalidation feature names a cache alias that is not in CACHES.

    Only when the feature is configured (``JOBGUARD["CACHE"]`` given) or used (a model
    declared with ``cache.invalidates()``), so projects that do not use it are not bothered.
    """
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


@checks.register()
def check_durable_invalidation(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W020: durable invalidation is the default, but jobs live on another database.

    A durable invalidation inserts its job in the write's transaction, so the write must run
    on ``JOBGUARD["DATABASE_ALIAS"]``; ``invalidate()`` takes Django's default alias unless
    given ``using=``, and then raises.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    if not conf.cache.durable or conf.database_alias == DEFAULT_DB_ALIAS:
        return []
    return [
        checks.Warning(
            f"JOBGUARD['CACHE']['DURABLE'] is True, but JOBGUARD['DATABASE_ALIAS'] is "
            f"{conf.database_alias!r}: an invalidate() of a write on {DEFAULT_DB_ALIAS!r} cannot put "
            "its job in that write's transaction, and raises ValueError.",
            hint=f"Pass using={conf.database_alias!r} for writes on that database and durable=False "
            "for others, or leave JOBGUARD['CACHE']['DURABLE'] off and pass durable=True where it applies.",
            id="jobguard.W020",
        )
    ]
