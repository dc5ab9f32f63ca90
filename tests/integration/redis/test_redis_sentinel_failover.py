"""A Redis failover under Sentinel: locks and the cache's durable invalidation carry on.

The test starts its own Redis primary, a replica and a sentinel on loopback (ports from
26400 up), nothing of the suite's Redis. The primary is killed and the sentinel promotes
the replica; django-redis's ``SentinelClient`` follows it.

A lock acquired just before the failover is made to miss the replica (the replica is
stopped and its link closed by the primary while the lock is taken), so the failover loses
it, as asynchronous replication can: a second holder then gets the lock while the first
still believes it holds it. The fencing token still increases, and a database write fenced
by it refuses the first holder.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.cache import caches
from django.db import transaction
from django.db.models import F
from django.test import override_settings

pytest.importorskip("django_redis")

from django_jobguard import lock
from django_jobguard.cache import delete_keys, invalidate
from django_jobguard.context import JobContext
from django_jobguard.exceptions import TransientError
from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.testapp.models import FencedCounter

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PORTS = range(26400, 26500)


def _free_ports(count: int) -> list[int]:
    found = []
    for port in PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"no {count} free ports in {PORTS}")


def _cli(port: int, *args: str) -> str:
    done = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, timeout=10, check=False)
    return done.stdout.decode().strip()


class Sentinelled:
    """A primary, one replica and one sentinel (quorum 1) on loopback."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="jobguard-redis-failover-"))
        self.primary, self.replica, self.sentinel = _free_ports(3)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        # One name per set of servers: django-redis keeps a pool per LOCATION for the process.
        self.service = f"jobguard-failover-{self.sentinel}"

    def _server(self, port: int, *extra: str) -> None:
        self.procs[port] = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                *extra,
            ],
            cwd=self.directory,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _cli(port, "PING") == "PONG", timeout=30, message=f"redis-server on {port}")

    def start(self) -> None:
        self._server(self.primary)
        self._server(self.replica, "--replicaof", "127.0.0.1", str(self.primary))
        wait_for(
            lambda: "master_link_status:up" in _cli(self.replica, "INFO", "replication"),
            timeout=30,
            message="the replica to sync",
        )
        config = self.directory / "sentinel.conf"  # the sentinel rewrites it: a file of its own
        config.write_text(
            f"port {self.sentinel}\nbind 127.0.0.1\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
            f"sentinel failover-timeout {self.service} 10000\n"
        )
        self.procs[self.sentinel] = subprocess.Popen(
            ["redis-server", str(config), "--sentinel"],
            cwd=self.directory,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            lambda: str(self.replica) in _cli(self.sentinel, "SENTINEL", "replicas", self.service),
            timeout=30,
            message="the sentinel to find the replica",
        )

    def primary_port(self) -> str:
        return _cli(self.sentinel, "SENTINEL", "get-master-addr-by-name", self.service).split()[-1]

    def cut_replica(self) -> None:
        """Stop the replica and have the primary drop its link: writes from now on miss it."""
        self.procs[self.replica].send_signal(signal.SIGSTOP)
        _cli(self.primary, "CLIENT", "KILL", "TYPE", "replica")

    def resume_replica(self) -> None:
        self.procs[self.replica].send_signal(signal.SIGCONT)

    def kill_primary(self) -> None:
        self.procs[self.primary].kill()
        self.procs[self.primary].wait(timeout=30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def redis_ha() -> Iterator[Sentinelled]:
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.skip("needs redis-server and redis-cli on PATH (apt-get install redis-server)")
    servers = Sentinelled()
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


def _through_sentinel(servers: Sentinelled) -> override_settings:
    caches_setting = {
        **settings.CACHES,
        "sentinel": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{servers.service}/0",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_FACTORY": "django_redis.pool.SentinelConnectionFactory",
                "SENTINELS": [("127.0.0.1", servers.sentinel)],
                "SOCKET_CONNECT_TIMEOUT": 1,
                "SOCKET_TIMEOUT": 2,
            },
        },
    }
    jobguard = {**settings.JOBGUARD, "LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "sentinel"}}
    return override_settings(CACHES=caches_setting, JOBGUARD=jobguard)


def _wait_promoted(servers: Sentinelled) -> None:
    wait_for(
        lambda: servers.primary_port() == str(servers.replica),
        timeout=60,
        message="the sentinel to promote the replica",
    )


def _fenced_write(resource: str, token: int) -> bool:
    """Write as a lock holder: refused when a newer holder already wrote (the docs' pattern)."""
    updated = FencedCounter.objects.filter(resource=resource, last_fencing_token__lte=token).update(
        value=F("value") + 1, last_fencing_token=token
    )
    return updated == 1


def test_a_lock_lost_in_a_redis_failover_is_taken_again_and_the_stale_holders_write_refused(redis_ha):
    FencedCounter.objects.create(resource="account:7")
    with _through_sentinel(redis_ha):
        # The replica misses this acquire: cut off while it is taken, then the primary dies.
        redis_ha.cut_replica()
        stale = lock("account:7", 60)
        assert stale.acquire(blocking=False)
        redis_ha.kill_primary()
        redis_ha.resume_replica()
        _wait_promoted(redis_ha)
        # The failover lost the lock: a second holder gets it, with a larger fencing token.
        newer = lock("account:7", 60)

        def acquired() -> bool:
            try:
                return newer.acquire(blocking=False)
            except Exception:
                return False  # the client is still finding the new primary

        wait_for(acquired, timeout=30, message="the lock to be taken on the new primary")
        assert newer.fencing_token > stale.fencing_token
        assert _fenced_write("account:7", newer.fencing_token)
        # The first holder, unaware, writes late: the resource refuses it.
        assert not _fenced_write("account:7", stale.fencing_token)
        assert stale.extend(60) is False  # and its renewal says the lock is gone
        newer.release()
    counter = FencedCounter.objects.get(resource="account:7")
    assert (counter.value, counter.last_fencing_token) == (1, newer.fencing_token)


def test_a_durable_invalidation_during_a_redis_failover_deletes_the_key_on_the_new_primary(redis_ha):
    key = f"failover:{time.monotonic_ns()}"
    with _through_sentinel(redis_ha):
        cache = caches["sentinel"]
        cache.set(key, "stale value")
        assert _cli(redis_ha.primary, "WAIT", "1", "5000") == "1"  # on the replica too
        assert redis.Redis(port=redis_ha.replica).exists(cache.make_key(key)) == 1
        redis_ha.kill_primary()
        # The write commits while Redis has no primary: the delete after the commit fails,
        # and the durable job keeps the key.
        with transaction.atomic():
            FencedCounter.objects.create(resource=key)
            invalidate(key, cache_alias="sentinel", durable=True)
        jobs = list(Job.objects.filter(task_name="django_jobguard.cache.delete_keys"))
        assert len(jobs) == 1, "the failed delete left no durable job"
        _wait_promoted(redis_ha)
        # What the worker does with the job: delete the keys, an attempt after each failure
        # (the worker's back-off), until the client has found the new primary.
        attempts = []

        def deleted() -> bool:
            attempts.append(1)
            context = JobContext(
                task=delete_keys, job_id=jobs[0].pk, attempt=len(attempts), max_attempts=20, queue_name="q"
            )
            try:
                delete_keys.func(context, **jobs[0].kwargs)
            except TransientError:
                return False
            return True

        wait_for(deleted, timeout=60, interval=0.5, message="the durable job to delete the key")
        client = redis.Redis(port=redis_ha.replica)
        assert client.info("replication")["role"] == "master"
        assert client.exists(cache.make_key(key)) == 0
