"""Redis through django-redis, shared by the lock back end and the versioned cache writes."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

__all__ = ["is_django_redis", "milliseconds", "run_script"]


def is_django_redis(backend: Any) -> bool:
    """Whether ``backend`` (a cache, a cache class, or its dotted path) is django-redis's cache.

    Subclasses count: django-prometheus's ``django_prometheus.cache.backends.redis.RedisCache``
    (hit and miss counters) is django-redis underneath.
    """
    try:
        from django_redis.cache import RedisCache
    except ImportError:  # pragma: no cover - only without the redis extra
        return False
    if isinstance(backend, str):
        from django.utils.module_loading import import_string

        try:
            backend = import_string(backend)
        except ImportError:
            return False
    cls = backend if isinstance(backend, type) else type(backend)
    return issubclass(cls, RedisCache)


@functools.cache
def _sha(script: str) -> str:
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()


def run_script(client: Any, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """Run ``script`` by its SHA, loading it with EVAL the first time a server sees it."""
    from redis.exceptions import NoScriptError

    try:
        return client.evalsha(_sha(script), len(keys), *keys, *args)
    except NoScriptError:
        # First use on this server, or it restarted: EVAL runs and caches the script.
        return client.eval(script, len(keys), *keys, *args)


def milliseconds(seconds: float) -> int:
    """A TTL for PX / PEXPIRE: never 0, which Redis refuses."""
    return max(1, round(seconds * 1000))
