"""Redis lock back end through django-redis: ``SET NX PX`` with an owner token.

Acquire, release and extend are Lua scripts, so "is it still mine?" and the change
happen atomically on the server; the fencing counter (``<key>:fencing``) is incremented
in the same script as a successful acquire.
"""

from __future__ import annotations

from typing import Any

from ..exceptions import LockUnavailable
from .base import BaseLock

__all__ = ["RedisLock"]

_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return redis.call('INCR', KEYS[2])
end
return false
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

_scripts: dict[int, tuple[Any, Any, Any]] = {}


def _client_scripts(client: Any) -> tuple[Any, Any, Any]:
    # Script objects cache the SHA and fall back to EVAL after a Redis restart.
    scripts = _scripts.get(id(client))
    if scripts is None:
        scripts = (
            client.register_script(_ACQUIRE),
            client.register_script(_RELEASE),
            client.register_script(_EXTEND),
        )
        _scripts[id(client)] = scripts
    return scripts


class RedisLock(BaseLock):
    """A lock in Redis, reached through the django-redis cache alias ``cache_alias``."""

    def __init__(self, key: str, *, ttl: float, prefix: str, cache_alias: str = "default") -> None:
        super().__init__(key, ttl=ttl, prefix=prefix)
        self.cache_alias = cache_alias
        self.fencing_key = f"{self.name}:fencing"

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    def _client(self) -> Any:
        try:
            from django_redis import get_redis_connection
        except ImportError as exc:  # pragma: no cover - only without the redis extra
            raise LockUnavailable(
                "the redis lock back end needs django-redis (pip install django-jobguard[redis])"
            ) from exc
        return get_redis_connection(self.cache_alias)

    def _call(self, index: int, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import RedisError

        try:
            client = self._client()
            return _client_scripts(client)[index](keys=keys, args=args, client=client)
        except RedisError as exc:
            raise LockUnavailable(f"lock {self.name!r}: Redis did not answer ({exc})") from exc

    def _try_acquire(self) -> int | None:
        result = self._call(0, [self.name, self.fencing_key], [self.token, self._ttl_ms])
        return int(result) if result else None

    def _release(self) -> bool:
        return bool(self._call(1, [self.name], [self.token]))

    def _extend(self) -> bool:
        return bool(self._call(2, [self.name], [self.token, self._ttl_ms]))

    def locked(self) -> bool:
        from redis.exceptions import RedisError

        try:
            return bool(self._client().exists(self.name))
        except RedisError as exc:
            raise LockUnavailable(f"lock {self.name!r}: Redis did not answer ({exc})") from exc
