"""Fencing tokens must keep increasing when Redis loses its data (found by T5).

A counter kept only in Redis (``INCR``) would start again at 1 after Redis restarts
without persistence, and a new holder could then get a token an earlier holder still
uses. The Redis back end therefore takes ``max(last + 1, Redis clock in microseconds)``.
"""

import shutil

import pytest
from django.test import override_settings

from django_jobguard.locks import lock
from tests.support.redis_server import RedisServer

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary"),
]

PORT = 6399


def test_fencing_tokens_keep_increasing_after_redis_restarts_without_persistence(tmp_path):
    redis = RedisServer(tmp_path, PORT)
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "fencing": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://127.0.0.1:{PORT}/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        },
    }
    redis.start()
    try:
        with override_settings(CACHES=caches):
            tokens = []
            for _ in range(3):
                held = lock("fencing-demo", ttl=5, backend="redis", cache_alias="fencing")
                assert held.acquire(blocking=False)
                tokens.append(held.fencing_token)
                held.release()
            redis.crash()
            redis.start()
            after = lock("fencing-demo", ttl=5, backend="redis", cache_alias="fencing")
            assert after.acquire(blocking=False)
    finally:
        redis.crash()
    assert tokens == sorted(set(tokens)), tokens  # strictly increasing
    assert after.fencing_token > tokens[-1], f"token {after.fencing_token} after {tokens} and a Redis restart"
