"""Per-resource locks with a TTL, an owner token and a fencing token.

``lock("order:123", ttl=30)`` returns a lock of the configured back end
(``JOBGUARD["LOCKS"]["BACKEND"]``: ``"database"`` or ``"redis"``), usable as a context
manager or through ``acquire()`` / ``extend()`` / ``release()`` / ``locked()``.
"""

from __future__ import annotations

from typing import Any

from ..conf import get_settings
from .base import BaseLock

__all__ = ["BaseLock", "lock"]


def lock(key: str, ttl: float | None = None, *, backend: str | None = None, **options: Any) -> BaseLock:
    """A lock on ``key`` (prefixed with ``JOBGUARD["LOCKS"]["PREFIX"]``), ``ttl`` seconds."""
    conf = get_settings().locks
    ttl = conf.ttl if ttl is None else ttl
    backend = backend or conf.backend
    if backend == "redis":
        from .redis import RedisLock

        return RedisLock(
            key, ttl=ttl, prefix=conf.prefix, cache_alias=options.pop("cache_alias", conf.cache_alias)
        )
    if backend == "database":
        from .db import DatabaseLock

        return DatabaseLock(key, ttl=ttl, prefix=conf.prefix, **options)
    raise ValueError(f"unknown lock back end {backend!r}; use 'database' or 'redis'")
