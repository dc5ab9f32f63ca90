"""Cache invalidation that follows the write path, and versioned cache writes.

Three tools, for values cached from rows of the database:

- :func:`invalidate` deletes cache keys **after the transaction commits**
  (``transaction.on_commit``): a write that rolls back deletes nothing, and a reader cannot
  refill the key from the old row before the new one is visible. Deleting instead of
  writing the new value means a late invalidation can never put an old value back.
- :func:`invalidates` declares it once per model: saving or deleting an instance (and
  changing its many-to-many fields) invalidates the keys formatted from it.
- :func:`set_versioned` / :func:`get_versioned` store a value with an integer version and
  refuse a write whose version is not newer than the one the cache holds. Together with
  ``invalidate(key, version=v)``, which leaves a short-lived *tombstone* carrying the
  version, this closes the classic race of a reader that loaded the old row before a
  writer committed and fills the cache after the writer invalidated it.

On django-redis the compare-and-set and the tombstone are Lua scripts, atomic on the
server across every process. Other back ends get a process-local lock around a read and a
write: exact within one process (local memory, the embedded default, is per process
anyway), but two *processes* sharing a file, database or memcached cache can interleave
between the read and the write. The limits are spelled out in
``docs/how-to/cache-invalidation.md``.

A cache that fails during an invalidation (Redis down) is logged with the keys and counted
as ``jobguard_cache_invalidations_total{status="error"}``; it is never raised into the
request or job, whose write has already committed.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.db import models, transaction
from django.db.models.signals import m2m_changed, post_delete, post_save

from . import metrics
from ._redis import is_django_redis, milliseconds, run_script
from .conf import get_settings

__all__ = [
    "Invalidation",
    "Versioned",
    "get_versioned",
    "invalidate",
    "invalidates",
    "set_versioned",
]

logger = logging.getLogger(__name__)

#: Largest version accepted: Redis's Lua compares numbers as doubles, exact below 2**53.
MAX_VERSION = 2**53 - 1

#: Marks a versioned entry stored through the plain cache API (back ends other than Redis).
_MARKER = "jobguard:versioned:1"

KeySource = str | Callable[[Any], Iterable[str]]
VersionSource = str | Callable[[Any], int] | None


class Versioned(NamedTuple):
    """A value read with :func:`get_versioned`, and the version it was written with."""

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
_SET = """
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
_TOMBSTONE = """
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


def _redis_connection(cache: BaseCache, alias: str) -> Any | None:
    """The raw redis-py client behind a django-redis cache, or None for other back ends."""
    if not is_django_redis(cache):
        return None
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


# -- other back ends: a read and a write under a process-local lock ------------------------

_local_locks: dict[str, threading.Lock] = {}
_local_locks_guard = threading.Lock()


def _local_lock(alias: str) -> threading.Lock:
    with _local_locks_guard:
        return _local_locks.setdefault(alias, threading.Lock())


def _entry(stored: Any) -> tuple[int, bool, Any] | None:
    """(floor, has value, value) of a stored versioned entry; None for anything else."""
    if isinstance(stored, tuple) and len(stored) == 4 and stored[0] == _MARKER:
        return stored[1], stored[2], stored[3]
    return None


# -- the public API -----------------------------------------------------------------------


def _alias(cache_alias: str | None) -> str:
    return cache_alias or get_settings().cache.alias


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise ValueError(f"a cache version is an integer from 0 to 2**53 - 1, not {version!r}")
    return version


def _check_keys(keys: tuple[Any, ...]) -> list[str]:
    bad = [key for key in keys if not isinstance(key, str) or not key]
    if bad:
        raise ValueError(f"cache keys are non-empty strings, not {bad[0]!r}")
    return list(dict.fromkeys(keys))


def invalidate(
    *keys: str, version: int | None = None, using: str | None = None, cache_alias: str | None = None
) -> None:
    """Delete cache ``keys`` once the current transaction on database ``using`` commits.

    - Inside ``transaction.atomic(using=using)``: nothing happens until the outermost block
      commits, and nothing at all if it (or the savepoint the call was made in) rolls back.
      In autocommit the keys are deleted at once. This is ``transaction.on_commit``.
    - ``version``: the version the write committed (a row's revision counter, an event
      sequence). Instead of a plain delete each key is replaced by a tombstone that lives
      ``JOBGUARD["CACHE"]["TOMBSTONE_TTL"]`` seconds and makes :func:`set_versioned` refuse
      values older than ``version``, so a reader that loaded the old row cannot put it back.
    - ``using``: the database alias of the transaction (Django's default when None). In a
      job handler, that is the alias the worker's transaction runs on.
    - ``cache_alias``: default ``JOBGUARD["CACHE"]["ALIAS"]``.

    A failing cache is logged with the keys and counted, never raised: the write it follows
    has already committed. Bad arguments (a key that is not a string, an unknown cache alias)
    raise at once, before anything is scheduled.
    """
    names = _check_keys(keys)
    if version is not None:
        version = _check_version(version)
    alias = _alias(cache_alias)
    caches[alias]  # an unknown alias raises InvalidCacheBackendError here, in the caller
    if not names:
        return
    transaction.on_commit(lambda: _invalidate_now(names, version, alias), using=using)


def _invalidate_now(keys: list[str], version: int | None, alias: str) -> None:
    # A plain delete is one round trip for all keys; tombstones are written key by key, so
    # a failure is counted for the keys it left behind only.
    batches = [keys] if version is None else [[key] for key in keys]
    for batch in batches:
        try:
            cache = caches[alias]
            if version is None:
                cache.delete_many(batch)
            else:
                _tombstone(cache, alias, batch[0], version)
        except Exception:
            # The write committed; the worst left behind is a value that is stale until its TTL.
            logger.exception("cache_invalidation_failed cache=%s keys=%s version=%s", alias, batch, version)
            metrics.cache_invalidated(alias, "error", len(batch))
        else:
            metrics.cache_invalidated(alias, "ok", len(batch))


def _tombstone(cache: BaseCache, alias: str, key: str, version: int) -> None:
    ttl = get_settings().cache.tombstone_ttl
    client = _redis_connection(cache, alias)
    if client is not None:
        run_script(client, _TOMBSTONE, [str(cache.make_key(key))], [version, milliseconds(ttl)])
        return
    with _local_lock(alias):
        floor = version - 1
        held = _entry(cache.get(key))
        if held is not None:
            floor = max(floor, held[0] - 1 if held[1] else held[0])
        cache.set(key, (_MARKER, floor, False, None), timeout=ttl)


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
    version = _check_version(version)
    alias = _alias(cache_alias)
    cache = caches[alias]
    seconds = cache.default_timeout if timeout is DEFAULT_TIMEOUT else timeout
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0
    ):
        # cache.set() takes 0 to mean "expire at once": a versioned write would only erase the floor.
        raise ValueError(
            f"a versioned write needs a timeout of more than 0 seconds, or None; not {seconds!r}"
        )
    client = _redis_connection(cache, alias)
    if client is not None:
        ttl_ms = 0 if seconds is None else milliseconds(seconds)
        encoded = cache.client.encode(value)  # type: ignore[attr-defined]
        written = bool(run_script(client, _SET, [str(cache.make_key(key))], [version, encoded, ttl_ms]))
    else:
        with _local_lock(alias):
            held = _entry(cache.get(key))
            written = held is None or version > held[0]
            if written:
                cache.set(key, (_MARKER, version, True, value), timeout=timeout)
    if not written:
        metrics.stale_write_rejected(alias)
    return written


def get_versioned(key: str, cache_alias: str | None = None) -> Versioned | None:
    """The value and version :func:`set_versioned` stored under ``key``, or None.

    None too when the key holds only a tombstone, or something else than a versioned entry.
    """
    alias = _alias(cache_alias)
    cache = caches[alias]
    client = _redis_connection(cache, alias)
    if client is not None:
        from redis.exceptions import ResponseError

        try:
            floor, data = client.hmget(str(cache.make_key(key)), ["f", "d"])
        except ResponseError:  # WRONGTYPE: a plain value, not ours
            return None
        if floor is None or data is None:
            return None
        return Versioned(cache.client.decode(data), int(floor))  # type: ignore[attr-defined]
    held = _entry(cache.get(key))
    if held is None or not held[1]:
        return None
    return Versioned(held[2], held[0])


# -- declared invalidation: model signals -------------------------------------------------


class _InstanceFields(Mapping[str, Any]):
    """``{pk}``, ``{account_id}``...: a key template's fields, read from the instance."""

    def __init__(self, instance: models.Model) -> None:
        self.instance = instance

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self.instance, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_uids = itertools.count(1)
_declarations: list[Invalidation] = []
_declarations_lock = threading.Lock()


@dataclasses.dataclass(eq=False)
class Invalidation:
    """A declaration made by :func:`invalidates`; :meth:`disconnect` undoes it."""

    model: type[models.Model]
    keys: tuple[KeySource, ...]
    version: VersionSource
    cache_alias: str | None
    uid: str
    _connected: list[tuple[Any, Any]] = dataclasses.field(default_factory=list)

    def keys_for(self, instance: models.Model) -> list[str]:
        """The cache keys ``instance`` invalidates."""
        found: list[str] = []
        for source in self.keys:
            if isinstance(source, str):
                try:
                    found.append(source.format_map(_InstanceFields(instance)))
                except KeyError as exc:
                    raise ValueError(
                        f"cache key template {source!r}: {type(instance).__name__} has no attribute {exc}"
                    ) from None
            else:
                found.extend(source(instance))
        return found

    def version_for(self, instance: models.Model) -> int | None:
        """The version passed to :func:`invalidate` for ``instance`` (None: a plain delete)."""
        if self.version is None:
            return None
        if isinstance(self.version, str):
            return int(getattr(instance, self.version))
        return self.version(instance)

    def _invalidate(self, instances: Iterable[models.Model], using: str | None) -> None:
        for instance in instances:
            keys = self.keys_for(instance)
            if keys:
                invalidate(
                    *keys, version=self.version_for(instance), using=using, cache_alias=self.cache_alias
                )

    def _saved_or_deleted(self, sender: Any, instance: models.Model, using: str, **kwargs: Any) -> None:
        if kwargs.get("raw"):  # loaddata: fixtures are not writes of the application
            return
        self._invalidate([instance], using)

    def _m2m_changed(
        self,
        sender: Any,
        instance: models.Model,
        action: str,
        reverse: bool,
        model: type[models.Model],
        pk_set: set[Any] | None,
        using: str,
        **kwargs: Any,
    ) -> None:
        if action not in ("post_add", "post_remove", "post_clear"):
            return
        if not reverse:
            self._invalidate([instance], using)
        elif pk_set:
            # Changed from the other side: the instances of our model are the pk_set.
            self._invalidate(self.model._default_manager.using(using).filter(pk__in=pk_set), using)

    def connect(self) -> None:
        """Connect the receivers (done by :func:`invalidates`)."""
        pairs: list[tuple[Any, Any]] = [(post_save, self.model), (post_delete, self.model)]
        for field in self.model._meta.local_many_to_many:
            pairs.append((m2m_changed, field.remote_field.through))
        for signal, sender in pairs:
            receiver = self._m2m_changed if signal is m2m_changed else self._saved_or_deleted
            signal.connect(receiver, sender=sender, weak=False, dispatch_uid=self.uid)
            self._connected.append((signal, sender))
        with _declarations_lock:
            _declarations.append(self)

    def disconnect(self) -> None:
        """Disconnect the receivers: saving the model no longer invalidates these keys."""
        for signal, sender in self._connected:
            signal.disconnect(sender=sender, dispatch_uid=self.uid)
        self._connected.clear()
        with _declarations_lock:
            if self in _declarations:
                _declarations.remove(self)


def invalidates(
    model: type[models.Model],
    *keys: KeySource,
    version: VersionSource = None,
    cache_alias: str | None = None,
) -> Invalidation:
    """Declare that saving or deleting a ``model`` instance invalidates cache ``keys``.

    Each key is a template formatted with the instance's attributes
    (``"account:{pk}:balance"``, ``"customer:{customer_id}:orders"``) or a callable that
    takes the instance and returns keys. ``post_save``, ``post_delete`` and ``m2m_changed``
    (of the model's many-to-many fields) call :func:`invalidate` on the database alias of
    the write, so the keys go after that transaction commits, and not at all if it rolls
    back. Fixtures loaded with ``loaddata`` invalidate nothing.

    ``version``: an attribute name (``"revision"``) or a callable giving the instance's
    version; the invalidation then leaves a tombstone (see :func:`invalidate`). Writes that
    bypass signals (``QuerySet.update()``, raw SQL) need an explicit :func:`invalidate`.

    Call it once, at import time (a ``models.py`` or ``AppConfig.ready()``); it returns the
    :class:`Invalidation`, whose ``disconnect()`` undoes it.
    """
    if not (isinstance(model, type) and issubclass(model, models.Model)):
        raise TypeError(f"invalidates() takes a model class, not {model!r}")
    if not keys:
        raise ValueError("invalidates() needs at least one key template or callable")
    for source in keys:
        if not (isinstance(source, str) and source) and not callable(source):
            raise ValueError(f"a key is a template string or a callable, not {source!r}")
    declaration = Invalidation(
        model=model,
        keys=tuple(keys),
        version=version,
        cache_alias=cache_alias,
        uid=f"jobguard_cache_invalidates_{model._meta.label_lower}_{next(_uids)}",
    )
    declaration.connect()
    return declaration


def declarations() -> list[Invalidation]:
    """The declarations made with :func:`invalidates` and still connected."""
    with _declarations_lock:
        return list(_declarations)
