"""Locks through django-redis's SentinelClient: a primary and a sentinel, started by the test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

pytest.importorskip("django_redis")

from django_jobguard import lock
from tests.conftest import wait_for
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.django_db

SERVICE = "jobguard-primary"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def sentinel() -> Iterator[int]:
    """A primary redis-server and one sentinel monitoring it; the sentinel's port."""
    if not shutil.which("redis-server"):
        pytest.skip("needs redis-server on PATH (apt-get install redis-server)")
    directory = Path(tempfile.mkdtemp(prefix="jobguard-sentinel-"))
    primary = RedisServer(directory)
    primary.start()
    port = free_port()
    config = directory / "sentinel.conf"  # the sentinel rewrites its config: a file of its own
    config.write_text(
        f"port {port}\nbind 127.0.0.1\nsentinel monitor {SERVICE} 127.0.0.1 {primary.port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 5000\n"
    )
    proc = subprocess.Popen(
        ["redis-server", str(config), "--sentinel"],
        cwd=directory,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def knows_primary() -> bool:
        result = subprocess.run(
            ["redis-cli", "-p", str(port), "SENTINEL", "get-master-addr-by-name", SERVICE],
            capture_output=True,
            timeout=10,
            check=False,
        )
        return str(primary.port) in result.stdout.decode()

    try:
        wait_for(knows_primary, timeout=30, message="the sentinel to report the primary")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        primary.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_locks_work_through_django_redis_sentinel_client(sentinel):
    from django_redis import get_redis_connection

    caches = {
        **settings.CACHES,
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{SERVICE}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", sentinel)],
                "SOCKET_CONNECT_TIMEOUT": 2,
                "SOCKET_TIMEOUT": 5,
            },
        },
    }
    jobguard = {**settings.JOBGUARD, "LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "sentinel"}}
    with override_settings(CACHES=caches, JOBGUARD=jobguard):
        first = lock("order:1", 30)
        assert first.acquire(blocking=False)
        assert lock("order:1", 30).acquire(blocking=False) is False
        # The lock lives on the primary the sentinel named.
        client = get_redis_connection("sentinel")
        assert client.get(first.redis_key) == first.token.encode()
        assert first.extend(60)
        first.release()
        second = lock("order:1", 30)
        assert second.acquire(blocking=False)
        assert second.fencing_token > first.fencing_token
        second.release()
