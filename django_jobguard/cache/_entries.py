"""What the cache's tools share: versioned entries, their Redis scripts, deletes and tombstones.

A versioned entry on django-redis is a hash (see the scripts below); on other back ends it
is a tuple marked with :data:`MARKER`, read and written under a process-local lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

from django.core.cache import caches
from django.core.cache.backends.base import BaseCache

from .. import events
from .._redis import is_django_redis, milliseconds, run_script
from ..conf import get_settings

logger = logging.getLogger("django_jobguard.cache")

#: Largest version accepted: Redis's Lua compares numbers as doubles, exact below 2**53.
MAX_VERSION = 2**53 - 1

#: Marks a versioned entry stored through the plain cache API (back ends other than Redis).
MARKER = "jobguard:versioned:1"


class Versioned(NamedTuple):
    """A value read with :func:`~django_jobguard.cache.get_versioned`, and the version it was written with."""

    value: Any
    version: int


# -- Redis: the compare-and-set and the tombstone as Lua scripts --------------------------
#
# A versioned key is a Redis hash: field "f" is the floor (a write needs a version above
# it), field "d" the encoded value. A value written at version v has f = v; a tombstone
# left by invalidate(key, version=v) has no "d" and f = v - 1, so the writer's own version
# v (the committed state) may fill the key again but no older one can. A key of another
# type (a plain cache.set() on the same name) counts as absent and is replaced.

# KEYS[1] key; ARGV[1] version, ARGV[2] encoded value, ARGV[3] TTL in ms (0: no expiry).
SET = """
local floor = nil
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    floor = tonumber(redis.call('HGET', KEYS[1], 'f'))
end
if floor ~= nil and tonumber(ARGV[1]) <= floor then
    return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'f', ARGV[1], 'd', ARGV[2])
if tonumber(ARGV[3]) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""
# KEYS[1] key; ARGV[1] version, ARGV[2] tombstone TTL in ms.
TOMBSTONE = """
local floor = tonumber(ARGV[1]) - 1
if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    local held = tonumber(redis.call('HGET', KEYS[1], 'f'))
    if held ~= nil then
        if redis.call('HEXISTS', KEYS[1], 'd') == 1 then
            held = held - 1
        end
        floor = math.max(floor, held)
    end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'f', string.format('%.0f', floor))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


def redis_connection(cache: BaseCache, alias: str) -> Any | None:
    """The raw redis-py client behind a django-redis cache, or None for other back ends."""
    if not is_django_redis(cache):
        return None
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


# -- other back ends: a read and a write under a process-local lock ------------------------

_local_locks: dict[str, threading.Lock] = {}
_local_locks_guard = threading.Lock()


def local_lock(alias: str) -> threading.Lock:
    with _local_locks_guard:
        return _local_locks.setdefault(alias, threading.Lock())


def entry(stored: Any) -> tuple[int, bool, Any] | None:
    """(floor, has value, value) of a stored versioned entry; None for anything else."""
    if isinstance(stored, tuple) and len(stored) == 4 and stored[0] == MARKER:
        return stored[1], stored[2], stored[3]
    return None


# -- arguments ---------------------------------------------------------------------------


def alias_of(cache_alias: str | None) -> str:
    return cache_alias or get_settings().cache.alias


def check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise ValueError(f"a cache version is an integer from 0 to 2**53 - 1, not {version!r}")
    return version


def check_keys(keys: tuple[Any, ...]) -> list[str]:
    bad = [key for key in keys if not isinstance(key, str) or not key]
    if bad:
        raise ValueError(f"cache keys are non-empty strings, not {bad[0]!r}")
    return list(dict.fromkeys(keys))


def delete_entries(alias: str, entries: Mapping[str, int | None], *, raise_errors: bool = False) -> bool:
    """Delete plain keys (one ``delete_many``) and tombstone versioned ones; whether all went.

    A plain delete is one round trip for all keys; tombstones are written key by key, so a
    failure is counted for the keys it left behind only. ``raise_errors``: raise the first
    failure after trying every batch (the worker's task), instead of only logging it.
    """
    plain = [key for key, version in entries.items() if version is None]
    batches: list[tuple[list[str], int | None]] = [(plain, None)] if plain else []
    batches += [([key], version) for key, version in entries.items() if version is not None]
    failure: Exception | None = None
    for batch, version in batches:
        try:
            cache = caches[alias]
            if version is None:
                cache.delete_many(batch)
            else:
                tombstone(cache, alias, batch[0], version)
        except Exception as exc:
            # The write committed; the worst left behind is a value that is stale until its TTL.
            logger.exception("cache_invalidation_failed cache=%s keys=%s version=%s", alias, batch, version)
            events.emit(events.CacheInvalidated(alias, "error", len(batch)))
            failure = failure or exc
        else:
            events.emit(events.CacheInvalidated(alias, "ok", len(batch)))
    if failure is not None and raise_errors:
        raise failure
    return failure is None


def tombstone(cache: BaseCache, alias: str, key: str, version: int) -> None:
    ttl = get_settings().cache.tombstone_ttl
    client = redis_connection(cache, alias)
    if client is not None:
        run_script(client, TOMBSTONE, [str(cache.make_key(key))], [version, milliseconds(ttl)])
        return
    with local_lock(alias):
        floor = version - 1
        held = entry(cache.get(key))
        if held is not None:
            floor = max(floor, held[0] - 1 if held[1] else held[0])
        cache.set(key, (MARKER, floor, False, None), timeout=ttl)
