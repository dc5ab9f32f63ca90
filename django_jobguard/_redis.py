"""Lua scripts on Redis, shared by the lock back end and the versioned cache writes."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

__all__ = ["milliseconds", "run_script"]


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
