"""Helpers for the lock tests: the back ends to run against and a lock factory for each."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from django_jobguard import lock
from django_jobguard.conf import get_settings
from django_jobguard.locks import BaseLock
from tests.testapp.models import Interval

#: Each lock test runs on the database back end (SQLite, or PostgreSQL with
#: JOBGUARD_TEST_DATABASE_URL) and on Redis (with JOBGUARD_TEST_REDIS_URL).
BACKENDS = [
    pytest.param("database", id="database"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]


def make_lock(backend: str, key: str, ttl: float | None = None, **options: Any) -> BaseLock:
    """A lock of ``backend``; the Redis one goes through the suite's "redis" cache alias."""
    if backend == "redis":
        options.setdefault("cache_alias", "redis")
    return lock(key, ttl, backend=backend, **options)


def clear_redis_locks() -> None:
    from django_redis import get_redis_connection

    client = get_redis_connection("redis")
    for name in client.scan_iter(match=f"{get_settings().locks.prefix}*"):
        client.delete(name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The lock back end under test; Redis keys of the lock prefix are cleared around each test."""
    if request.param == "redis":
        clear_redis_locks()
    yield request.param
    if request.param == "redis":
        clear_redis_locks()


def assert_runs_never_overlap() -> dict[str, list[Interval]]:
    """No two runs on one resource overlap, and their fencing tokens grow in start order."""
    by_resource: dict[str, list[Interval]] = defaultdict(list)
    for run in Interval.objects.order_by("started"):
        by_resource[run.resource].append(run)
    for resource, runs in by_resource.items():
        for before, after in itertools.pairwise(runs):
            assert after.started >= before.ended, f"{resource}: {before} overlaps {after}"
            assert after.fencing_token > before.fencing_token, f"{resource}: {before} then {after}"
    return by_resource
