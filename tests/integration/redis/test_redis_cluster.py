"""Locks and versioned cache writes on a real Redis Cluster (three masters, started by the test)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.test import override_settings

pytest.importorskip("django_redis")

from django_jobguard import cache as jobguard_cache
from django_jobguard import lock
from django_jobguard.locks.redis import RedisLock
from tests.support import redis_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def cluster() -> Iterator[redis_cluster.RedisCluster]:
    if not redis_cluster.available():
        pytest.skip("needs redis-server and redis-cli on PATH (apt-get install redis-server)")
    server = redis_cluster.RedisCluster()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster_cache(cluster) -> Iterator[str]:
    """A django-redis cache alias "cluster" on the cluster; the lock back end uses it."""
    caches = {
        **settings.CACHES,
        "cluster": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": cluster.url,
            "OPTIONS": {
                "CONNECTION_FACTORY": "tests.support.redis_cluster.ClusterConnectionFactory",
                "SOCKET_CONNECT_TIMEOUT": 2,
                "SOCKET_TIMEOUT": 5,
            },
        },
    }
    jobguard = {**settings.JOBGUARD, "LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "cluster"}}
    with override_settings(CACHES=caches, JOBGUARD=jobguard):
        yield "cluster"


def node_of(client, name: str) -> str:
    return client.get_node_from_key(name).name


def test_locks_on_a_cluster_acquire_fence_extend_and_release_on_the_node_of_their_key(cluster_cache):
    from django_redis import get_redis_connection

    client = get_redis_connection(cluster_cache)
    resources = [f"order:{n}" for n in range(30)]
    held = [lock(resource, 30) for resource in resources]
    for one in held:
        assert isinstance(one, RedisLock)
        assert one.acquire(blocking=False)
        # Taken: a second owner is refused while the first holds it.
        assert lock(one.key, 30).acquire(blocking=False) is False
        assert one.extend(60)
        assert 30_000 < client.pttl(one.redis_key) <= 60_000
        assert client.get(one.redis_key) == one.token.encode()
    # The locks really are spread over the cluster's three masters.
    assert len({node_of(client, one.redis_key) for one in held}) == redis_cluster.NODES
    for one in held:
        one.release()
        assert not one.locked()
    # Fencing tokens keep increasing per resource across owners.
    again = lock("order:0", 30)
    assert again.acquire(blocking=False)
    assert again.fencing_token > held[0].fencing_token
    again.release()


def test_the_old_key_names_would_not_run_on_a_cluster(cluster_cache):
    """Why the key names carry a hash tag: without it the acquire script spans two slots."""
    from django_redis import get_redis_connection
    from redis.exceptions import RedisClusterException, ResponseError

    from django_jobguard._redis import run_script
    from django_jobguard.locks.redis import _ACQUIRE

    client = get_redis_connection(cluster_cache)
    name = "jobguard:lock:order:0"  # before: the lock key without braces
    with pytest.raises((RedisClusterException, ResponseError), match=r"(?i)slot"):
        run_script(client, _ACQUIRE, [name, f"{name}:fencing"], ["token", 1000, 1000])


def test_versioned_cache_writes_work_on_a_cluster(cluster_cache):
    assert jobguard_cache.set_versioned("account:1:balance", 10, version=2, cache_alias=cluster_cache)
    # An older fill is refused; a newer one wins.
    assert not jobguard_cache.set_versioned("account:1:balance", 9, version=1, cache_alias=cluster_cache)
    assert jobguard_cache.set_versioned("account:1:balance", 11, version=3, cache_alias=cluster_cache)
    stored = jobguard_cache.get_versioned("account:1:balance", cache_alias=cluster_cache)
    assert stored is not None and (stored.value, stored.version) == (11, 3)
