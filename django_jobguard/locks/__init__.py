"""Per-resource locks with a TTL, an owner token and a fencing token.

``lock("order:123", ttl=30)`` returns a lock of the configured back end
(``JOBGUARD["LOCKS"]["BACKEND"]``: ``"database"`` or ``"redis"``), usable as a context
manager or through ``acquire()`` / ``extend()`` / ``release()`` / ``locked()``::

    with lock(f"invoice:{invoice.pk}", ttl=60) as held:
        reconcile(invoice, fencing_token=held.fencing_token)

Every lock has a TTL: a holder that dies frees it when the TTL runs out.
"""

from __future__ import annotations

from ..conf import get_settings
from .base import BaseLock

__all__ = ["BaseLock", "lock"]


def lock(
    key: str,
    ttl: float | None = None,
    *,
    blocking: bool = True,
    timeout: float | None = None,
    backend: str | None = None,
    using: str | None = None,
    cache_alias: str | None = None,
    owner: str = "",
    blind: bool = False,
) -> BaseLock:
    """A lock on business resource ``key``, stored as ``JOBGUARD["LOCKS"]["PREFIX"] + key``.

    - ``ttl``: seconds the lock lives unless extended (default ``JOBGUARD["LOCKS"]["TTL"]``).
      There is no lock without a TTL.
    - ``blocking`` / ``timeout``: how ``with lock(...)`` (and ``acquire()`` without
      arguments) waits for a held lock; ``with`` raises
      :class:`~django_jobguard.LockNotAcquired` if it could not take it.
    - ``backend``: ``"database"`` or ``"redis"`` (default ``JOBGUARD["LOCKS"]["BACKEND"]``).
    - ``using``: database alias of the database back end (default ``JOBGUARD["DATABASE_ALIAS"]``).
    - ``cache_alias``: django-redis cache of the Redis back end (default
      ``JOBGUARD["LOCKS"]["CACHE_ALIAS"]``).
    - ``owner``: who holds it, written at the start of each owner token (letters, digits,
      ``.-_``, at most 47): a worker passes the job's claim, so the lock names its holder.
    - ``blind``: store the key as its blind index under ``JOBGUARD["ENCRYPTION"]["KEYS"]``
      (a keyed HMAC), not in clear: the lock a task with ``encrypt=True`` and ``lock=`` takes
      for the same business value (see docs/how-to/encrypt-payloads.md).
    """
    conf = get_settings().locks
    if blind:
        from ..task import blind_lock_key

        key = blind_lock_key(key, using or get_settings().database_alias)
    backend = backend or conf.backend
    ttl = conf.ttl if ttl is None else ttl
    if backend == "redis":
        if using is not None:
            raise ValueError("using= names a database; the redis lock back end takes cache_alias=")
        from .redis import RedisLock

        return RedisLock(
            key,
            ttl=ttl,
            prefix=conf.prefix,
            blocking=blocking,
            timeout=timeout,
            cache_alias=cache_alias or conf.cache_alias,
            owner=owner,
        )
    if backend == "database":
        if cache_alias is not None:
            raise ValueError("cache_alias= names a cache; the database lock back end takes using=")
        from .db import DatabaseLock

        return DatabaseLock(
            key, ttl=ttl, prefix=conf.prefix, blocking=blocking, timeout=timeout, using=using, owner=owner
        )
    raise ValueError(f"unknown lock back end {backend!r}; use 'database' or 'redis'")
