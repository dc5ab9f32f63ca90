"""Redis lock back end through django-redis: ``SET NX PX`` with an owner token.

Acquire, release and extend are Lua scripts, so "is it still mine?" and the change happen
atomically on the server. The fencing token is issued in the acquire script too, from a
counter stored next to the lock (``<name>:fencing``): the larger of the last token plus
one and the Redis clock in microseconds. The clock term keeps tokens increasing even if
Redis loses the counter (a restart without persistence, a failover to a lagging replica),
and lets the counter key expire once a resource has been idle for a day.

Redis Cluster: a script may only touch keys of one hash slot, so both keys carry the lock
key as a hash tag: ``jobguard:lock:{order:123}`` and ``jobguard:lock:{order:123}:fencing``.
The tag is the text between the first ``{`` and the next ``}``; the lock key's name always
ends with the ``}`` added here, so that tag lies inside it and both keys hash alike whatever
braces a prefix or key holds, unless the tag would be empty (``{}``), which
:class:`RedisLock` refuses.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .._redis import milliseconds, run_script
from ..exceptions import LockUnavailable
from .base import RESERVED_SUFFIX, BaseLock

__all__ = ["RedisLock", "client", "force_release", "hash_tag", "redis_key"]

#: Seconds an idle key's fencing counter is kept; later tokens come from the clock term.
FENCING_KEY_TTL_SECONDS = 24 * 3600

# Issues the next fencing token into `fencing`: KEYS[2] fencing counter, ARGV[3] its TTL in ms.
_BUMP_FENCING = """
local now = redis.call('TIME')
local micros = tonumber(now[1]) * 1000000 + tonumber(now[2])
local fencing = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, micros)
redis.call('SET', KEYS[2], string.format('%.0f', fencing), 'PX', ARGV[3])
"""
# KEYS[1] lock, KEYS[2] fencing counter; ARGV[1] token, ARGV[2] TTL in ms, ARGV[3] counter TTL in ms.
_ACQUIRE = f"""
if redis.replicate_commands then redis.replicate_commands() end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return false
end
{_BUMP_FENCING}
return fencing
"""
# A forced release: KEYS[1] lock, KEYS[2] fencing counter; ARGV[1] the owner token the
# operator saw ('' for whichever holds it), ARGV[3] counter TTL in ms (ARGV[2] unused). The
# lock goes and the counter moves past the old holder's token in one step. Returns
# {0, ''} when not held, {2, token} when another token holds it, else {1, new fencing
# token, the token it freed}.
_FORCE_RELEASE = f"""
if redis.replicate_commands then redis.replicate_commands() end
local held = redis.call('GET', KEYS[1])
if not held then
    return {{0, ''}}
end
if ARGV[1] ~= '' and held ~= ARGV[1] then
    return {{2, held}}
end
redis.call('DEL', KEYS[1])
{_BUMP_FENCING}
return {{1, string.format('%.0f', fencing), held}}
"""
# KEYS[1] lock; ARGV[1] token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS[1] lock; ARGV[1] token, ARGV[2] TTL in ms.
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def client(cache_alias: str) -> Any:
    """The Redis client of django-redis cache ``cache_alias``."""
    try:
        from django_redis import get_redis_connection
    except ImportError as exc:  # pragma: no cover - only without the redis extra
        raise ImproperlyConfigured(
            "the redis lock back end needs django-redis (pip install django-jobguard[redis])"
        ) from exc
    try:
        return get_redis_connection(cache_alias)
    except NotImplementedError:
        raise ImproperlyConfigured(
            f"JOBGUARD['LOCKS']['CACHE_ALIAS'] is {cache_alias!r}, which is not a "
            "django-redis cache (BACKEND 'django_redis.cache.RedisCache')"
        ) from None


def force_release(cache_alias: str, prefix: str, key: str, token: str) -> tuple[int, str, str]:
    """Delete lock ``key`` and move its fencing counter on, atomically (see ``_FORCE_RELEASE``).

    ``token``: the owner token expected to hold it ("" for any). Returns ``(0, "", "")`` if it
    is not held, ``(2, "", holder's token)`` if another token holds it, else
    ``(1, new fencing token, the token it freed)``. Raises :class:`LockUnavailable` when Redis
    does not answer.
    """
    from redis.exceptions import RedisError

    name = redis_key(prefix, key)
    try:
        result = run_script(
            client(cache_alias),
            _FORCE_RELEASE,
            [name, f"{name}{RESERVED_SUFFIX}"],
            [token, 0, milliseconds(FENCING_KEY_TTL_SECONDS)],
        )
    except RedisError as exc:
        raise LockUnavailable(f"lock {prefix + key!r}: Redis did not answer ({exc})") from exc
    text = [value.decode() if isinstance(value, bytes) else str(value) for value in result[1:]]
    status = int(result[0])
    if status == 1:
        return status, text[0], text[1]
    return status, "", text[0]


def redis_key(prefix: str, key: str) -> str:
    """The Redis key of lock ``key``: ``<prefix>{<key>}``, the key being the hash tag."""
    return f"{prefix}{{{key}}}"


def hash_tag(name: str) -> str:
    """The part of ``name`` Redis Cluster hashes: between the first ``{`` and the next ``}``.

    "" when there is none or it is empty (then Redis hashes the whole name).
    """
    start = name.find("{")
    end = name.find("}", start + 1) if start >= 0 else -1
    return name[start + 1 : end] if end > start + 1 else ""


class RedisLock(BaseLock):
    """A lock in Redis, reached through the django-redis cache alias ``cache_alias``."""

    def __init__(
        self,
        key: str,
        *,
        ttl: float,
        prefix: str,
        blocking: bool = True,
        timeout: float | None = None,
        cache_alias: str = "default",
        owner: str = "",
    ) -> None:
        super().__init__(key, ttl=ttl, prefix=prefix, blocking=blocking, timeout=timeout, owner=owner)
        self.cache_alias = cache_alias
        #: The Redis key: the lock key as a hash tag, so the fencing counter is on its slot.
        self.redis_key = redis_key(prefix, key)
        if not hash_tag(self.redis_key):
            raise ValueError(
                f"lock name {self.name!r}: its Redis hash tag would be empty ('{{}}'), so Redis "
                "Cluster could put its fencing counter on another node; avoid '{}' in the prefix "
                "and a key starting with '}'"
            )
        # Keys cannot end with RESERVED_SUFFIX, so no lock's Redis key equals a fencing key.
        self.fencing_key = f"{self.redis_key}{RESERVED_SUFFIX}"

    def _client(self) -> Any:
        return client(self.cache_alias)

    def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import RedisError

        client = self._client()
        try:
            return run_script(client, script, keys, args)
        except RedisError as exc:
            raise LockUnavailable(f"lock {self.name!r}: Redis did not answer ({exc})") from exc

    def _try_acquire(self, token: str) -> int | None:
        result = self._run(
            _ACQUIRE,
            [self.redis_key, self.fencing_key],
            [token, milliseconds(self.ttl), milliseconds(max(self.ttl, FENCING_KEY_TTL_SECONDS))],
        )
        return int(result) if result else None

    def _release(self) -> bool:
        return bool(self._run(_RELEASE, [self.redis_key], [self.token]))

    def _extend(self, ttl: float) -> bool:
        return bool(self._run(_EXTEND, [self.redis_key], [self.token, milliseconds(ttl)]))

    def locked(self) -> bool:
        from redis.exceptions import RedisError

        try:
            return bool(self._client().exists(self.redis_key))
        except RedisError as exc:
            raise LockUnavailable(f"lock {self.name!r}: Redis did not answer ({exc})") from exc
