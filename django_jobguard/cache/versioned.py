"""``set_versioned()`` / ``get_versioned()``: a write refused unless its version is newer."""

from __future__ import annotations

from typing import Any

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT

from .. import events
from .._redis import milliseconds, run_script
from ._entries import MARKER, SET, Versioned, alias_of, check_version, entry, local_lock, redis_connection


def set_versioned(
    key: str,
    value: Any,
    version: int,
    timeout: float | None = DEFAULT_TIMEOUT,
    cache_alias: str | None = None,
) -> bool:
    """Store ``value`` under ``key`` only if ``version`` is newer than what the cache holds.

    Returns True if written. Returns False, and counts
    ``jobguard_cache_stale_writes_rejected_total``, if the cache holds a value of the same
    or a newer version, or the tombstone of ``invalidate(key, version=v)`` with ``v`` above
    ``version``. ``timeout``: seconds the value lives (the cache's default timeout when not
    given, None for no expiry; 0 is refused). Versions are integers from 0 to 2**53 - 1.

    Atomic across processes on django-redis; on other back ends, atomic within one process
    only (see the module docstring). Read the key back with :func:`get_versioned`, not
    ``cache.get()``: the stored form carries the version. Cache errors propagate, as they do
    from ``cache.set()``.
    """
    version = check_version(version)
    alias = alias_of(cache_alias)
    cache = caches[alias]
    seconds = cache.default_timeout if timeout is DEFAULT_TIMEOUT else timeout
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
    ):
        # cache.set() takes 0 to mean "expire at once": a versioned write would only erase the floor.
        raise ValueError(
            f"a versioned write needs a timeout of more than 0 seconds, or None; not {seconds!r}"
        )
    client = redis_connection(cache, alias)
    if client is not None:
        ttl_ms = 0 if seconds is None else milliseconds(seconds)
        encoded = cache.client.encode(value)  # type: ignore[attr-defined]
        written = bool(run_script(client, SET, [str(cache.make_key(key))], [version, encoded, ttl_ms]))
    else:
        with local_lock(alias):
            held = entry(cache.get(key))
            written = held is None or version > held[0]
            if written:
                cache.set(key, (MARKER, version, True, value), timeout=timeout)
    if not written:
        events.emit(events.StaleWriteRejected(alias))
    return written


def get_versioned(key: str, cache_alias: str | None = None) -> Versioned | None:
    """The value and version :func:`set_versioned` stored under ``key``, or None.

    None too when the key holds only a tombstone, or something else than a versioned entry.
    """
    alias = alias_of(cache_alias)
    cache = caches[alias]
    client = redis_connection(cache, alias)
    if client is not None:
        from redis.exceptions import ResponseError

        try:
            floor, data = client.hmget(str(cache.make_key(key)), ["f", "d"])
        except ResponseError:  # WRONGTYPE: a plain value, not ours
            return None
        if floor is None or data is None:
            return None
        return Versioned(cache.client.decode(data), int(floor))  # type: ignore[attr-defined]
    held = entry(cache.get(key))
    if held is None or not held[1]:
        return None
    return Versioned(held[2], held[0])
