"""``get_or_set()``: of many concurrent misses of one key, one calls the loader, under a lease."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from .. import events
from .._redis import milliseconds, run_script
from ..conf import get_settings
from ._entries import Versioned, alias_of, check_keys, entry, local_lock, redis_connection
from .versioned import set_versioned

#: Seconds between two looks at the cache while another caller refills a key.
REFILL_POLL_SECONDS = 0.02
#: Prefix of a refill lease's cache key: ``jobguard:refill:<key>``.
REFILL_LEASE_PREFIX = "jobguard:refill:"

# KEYS[1] key. A plain value: {0, data}; a versioned one: {1, data}; a tombstone: {2}; none: {3}.
_READ = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'string' then
    return {0, redis.call('GET', KEYS[1])}
end
if kind == 'hash' then
    local data = redis.call('HGET', KEYS[1], 'd')
    if data then
        return {1, data}
    end
    return {2}
end
return {3}
"""
# KEYS[1] key; ARGV[1] encoded value, ARGV[2] TTL in ms (0: no expiry). A versioned entry or a
# tombstone is never replaced by a value without a version.
_SET_PLAIN = """
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    return 0
end
if tonumber(ARGV[2]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
    redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"""
# KEYS[1] lease key; ARGV[1] token: only the holder releases.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

_MISSING = object()


def _read(cache: BaseCache, client: Any, key: str) -> tuple[bool, Any]:
    """(found, value) of ``key``, plain or versioned; a tombstone is a miss."""
    if client is not None:
        found = run_script(client, _READ, [str(cache.make_key(key))], [])
        if int(found[0]) in (0, 1):
            return True, cache.client.decode(found[1])  # type: ignore[attr-defined]
        return False, None
    stored = cache.get(key, _MISSING)
    if stored is _MISSING:
        return False, None
    held = entry(stored)
    if held is not None:
        return held[1], held[2]
    return True, stored


def _take_lease(cache: BaseCache, client: Any, lease_key: str, token: str, ttl: float) -> bool:
    if client is not None:
        return bool(client.set(str(cache.make_key(lease_key)), token, nx=True, px=milliseconds(ttl)))
    # add() is atomic within the cache: across threads for local memory, across processes
    # for memcached and the database cache.
    return bool(cache.add(lease_key, token, timeout=ttl))


def _release_lease(cache: BaseCache, client: Any, lease_key: str, token: str) -> None:
    if client is not None:
        run_script(client, _RELEASE, [str(cache.make_key(lease_key))], [token])
    elif cache.get(lease_key) == token:
        cache.delete(lease_key)


def _store(cache: BaseCache, client: Any, alias: str, key: str, value: Any, timeout: Any) -> bool:
    """Store a loaded value: versioned through :func:`set_versioned`, plain never over a tombstone."""
    if isinstance(value, Versioned):
        return set_versioned(key, value.value, value.version, timeout=timeout, cache_alias=alias)
    seconds = cache.default_timeout if timeout is DEFAULT_TIMEOUT else timeout
    if seconds is not None and seconds <= 0:
        return False  # Django's meaning of 0: do not keep it
    if client is not None:
        ttl_ms = 0 if seconds is None else milliseconds(seconds)
        encoded = cache.client.encode(value)  # type: ignore[attr-defined]
        return bool(run_script(client, _SET_PLAIN, [str(cache.make_key(key))], [encoded, ttl_ms]))
    with local_lock(alias):
        if entry(cache.get(key)) is not None:
            return False
        cache.set(key, value, timeout=seconds)
    return True


def _load(
    cache: BaseCache, client: Any, alias: str, key: str, loader: Callable[[], Any], timeout: Any
) -> Any:
    try:
        loaded = loader()
    except BaseException:
        events.emit(events.RefillLoaded(alias, "error"))
        raise
    events.emit(events.RefillLoaded(alias, "ok"))
    _store(cache, client, alias, key, loaded, timeout)
    return loaded.value if isinstance(loaded, Versioned) else loaded


def get_or_set(
    key: str,
    loader: Callable[[], Any],
    timeout: float | None = DEFAULT_TIMEOUT,
    cache_alias: str | None = None,
) -> Any:
    """The cached value of ``key``; on a miss, ``loader()``'s, stored, with one loader call per miss.

    Of many callers that miss ``key`` at once (threads, processes, machines) one takes a short
    *refill lease* (``jobguard:refill:<key>``, ``JOBGUARD["CACHE"]["REFILL_LEASE_TTL"]``
    seconds; ``SET NX PX`` on django-redis, ``cache.add()`` elsewhere) and calls ``loader``;
    the others poll the cache for its value for up to ``JOBGUARD["CACHE"]["REFILL_WAIT"]``
    seconds, then load it themselves. A loader that raises releases the lease at once, so
    the next caller loads; the error propagates to its own caller only.

    ``loader`` returns the value, or a :class:`Versioned` to store it with
    :func:`set_versioned` (refused if the key holds that version, a newer one, or a newer
    tombstone). A plain value never replaces a versioned entry or a tombstone. Either way
    the caller gets the loaded value. ``timeout``: seconds the value lives, as for
    ``cache.set()``. Cache errors propagate, as from ``cache.get_or_set()``.
    """
    check_keys((key,))
    if not callable(loader):
        raise TypeError(f"get_or_set() takes a loader callable, not {loader!r}")
    alias = alias_of(cache_alias)
    cache = caches[alias]
    client = redis_connection(cache, alias)
    found, value = _read(cache, client, key)
    if found:
        return value
    conf = get_settings().cache
    lease_key = REFILL_LEASE_PREFIX + key
    token = secrets.token_hex(16)
    deadline = time.monotonic() + conf.refill_wait
    while True:
        if _take_lease(cache, client, lease_key, token, conf.refill_lease_ttl):
            events.emit(events.RefillLeaseTaken(alias))
            try:
                # The previous holder may have filled the key just before it let go.
                found, value = _read(cache, client, key)
                return value if found else _load(cache, client, alias, key, loader, timeout)
            finally:
                _release_lease(cache, client, lease_key, token)
        time.sleep(REFILL_POLL_SECONDS)
        found, value = _read(cache, client, key)
        if found:
            events.emit(events.RefillWaited(alias, "filled"))
            return value
        if time.monotonic() >= deadline:
            # The holder is slow or gone: serve this caller rather than keep it waiting.
            events.emit(events.RefillWaited(alias, "timeout"))
            return _load(cache, client, alias, key, loader, timeout)
