"""get_or_set(): one loader call for many concurrent misses, within one process.

Local memory by default, django-redis ("redis") too when ``JOBGUARD_TEST_REDIS_URL`` is set.
The same across processes: tests/processes/test_cache_processes.py.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.conf import settings
from django.core.cache import caches
from django.test import override_settings
from prometheus_client import REGISTRY

from django_jobguard.cache import Versioned, get_or_set, get_versioned, invalidate, set_versioned

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 12
#: Generous bounds, so a loaded machine cannot make a waiter give up and load a second time.
PATIENT = {**settings.JOBGUARD, "CACHE": {"REFILL_WAIT": 60.0, "REFILL_LEASE_TTL": 60.0}}


@pytest.fixture(params=["default", pytest.param("redis", marks=pytest.mark.redis)])
def alias(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def key() -> str:
    return f"test:refill:{uuid.uuid4().hex}"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0


def test_a_hit_does_not_call_the_loader_and_a_miss_stores_the_loaded_value(alias, key):
    caches[alias].set(key, "cached")
    assert get_or_set(key, lambda: pytest.fail("loader called on a hit"), 60, cache_alias=alias) == "cached"
    assert get_or_set(key + ":none", lambda: None, 60, cache_alias=alias) is None
    # None is a value like any other: the second call is a hit.
    assert (
        get_or_set(key + ":none", lambda: pytest.fail("None was not cached"), 60, cache_alias=alias) is None
    )


def test_concurrent_misses_of_one_key_call_the_loader_once(alias, key):
    calls: list[int] = []
    start = threading.Barrier(THREADS)
    results: list[object] = []

    def loader() -> str:
        calls.append(1)
        time.sleep(0.3)  # a slow query: the other threads miss meanwhile (not an assertion)
        return "loaded"

    def read() -> None:
        start.wait()
        results.append(get_or_set(key, loader, 60, cache_alias=alias))

    leases = sample("jobguard_cache_refill_leases_total", cache=alias)
    with override_settings(JOBGUARD=PATIENT):
        threads = [threading.Thread(target=read) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert calls == [1]
    assert results == ["loaded"] * THREADS
    assert sample("jobguard_cache_refill_leases_total", cache=alias) - leases >= 1
    assert caches[alias].get(key) == "loaded"


def test_a_loader_that_raises_releases_the_lease_for_the_next_caller(alias, key):
    errors = sample("jobguard_cache_refill_loads_total", cache=alias, status="error")

    def failing() -> str:
        raise ConnectionError("database is down")

    with pytest.raises(ConnectionError, match="database is down"):
        get_or_set(key, failing, 60, cache_alias=alias)
    assert sample("jobguard_cache_refill_loads_total", cache=alias, status="error") - errors == 1
    # No lease left behind: the next caller loads at once (a left lease would make it wait 60 s).
    with override_settings(JOBGUARD=PATIENT):
        assert get_or_set(key, lambda: "second", 60, cache_alias=alias) == "second"


def test_a_waiter_loads_itself_when_the_holder_fails_while_it_waits(alias, key):
    holding, fail_now = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def failing() -> str:
        holding.set()
        fail_now.wait(30)
        raise RuntimeError("loader failed")

    def first() -> None:
        try:
            get_or_set(key, failing, 60, cache_alias=alias)
        except RuntimeError as exc:
            outcome["first"] = str(exc)

    with override_settings(JOBGUARD=PATIENT):
        holder = threading.Thread(target=first)
        holder.start()
        assert holding.wait(30)
        second_calls: list[int] = []

        def second_loader() -> str:
            second_calls.append(1)
            return "from the second caller"

        waiter = threading.Thread(
            target=lambda: outcome.setdefault("second", get_or_set(key, second_loader, 60, cache_alias=alias))
        )
        waiter.start()
        fail_now.set()
        holder.join(30)
        waiter.join(30)
    assert outcome == {"first": "loader failed", "second": "from the second caller"}
    assert second_calls == [1]


def test_a_waiter_past_the_bound_loads_itself(alias, key):
    cache = caches[alias]
    timeouts = sample("jobguard_cache_refill_waits_total", cache=alias, status="timeout")
    # Someone holds the lease and never fills the key (a process that hung).
    assert cache.add("jobguard:refill:" + key, "someone else", 60)
    with override_settings(JOBGUARD={**settings.JOBGUARD, "CACHE": {"REFILL_WAIT": 0.1}}):
        assert get_or_set(key, lambda: "my own", 60, cache_alias=alias) == "my own"
    assert sample("jobguard_cache_refill_waits_total", cache=alias, status="timeout") - timeouts == 1


def test_a_versioned_refill_never_writes_below_a_tombstone_or_a_newer_version(alias, key):
    invalidate(key, version=5, cache_alias=alias)  # autocommit: the tombstone of revision 5
    # A loader that read revision 4 (before the write) is served but not stored.
    assert get_or_set(key, lambda: Versioned("r4", 4), 60, cache_alias=alias) == "r4"
    assert get_versioned(key, cache_alias=alias) is None
    assert get_or_set(key, lambda: Versioned("r5", 5), 60, cache_alias=alias) == "r5"
    assert get_versioned(key, cache_alias=alias) == Versioned("r5", 5)
    # A hit serves the versioned value without calling the loader.
    assert get_or_set(key, lambda: pytest.fail("loader called"), 60, cache_alias=alias) == "r5"
    assert set_versioned(key + ":newer", "r9", 9, cache_alias=alias)
    invalidate(key + ":newer", version=9, cache_alias=alias)
    assert get_or_set(key + ":newer", lambda: Versioned("r8", 8), 60, cache_alias=alias) == "r8"
    assert get_versioned(key + ":newer", cache_alias=alias) is None


def test_a_plain_refill_never_replaces_a_tombstone(alias, key):
    invalidate(key, version=3, cache_alias=alias)
    assert get_or_set(key, lambda: "plain", 60, cache_alias=alias) == "plain"
    # The floor is still there: an old version is refused, the committed one accepted.
    assert set_versioned(key, "r2", 2, cache_alias=alias) is False
    assert set_versioned(key, "r3", 3, cache_alias=alias) is True


def test_bad_arguments_raise_before_anything_is_read():
    with pytest.raises(TypeError, match="get_or_set\\(\\) takes a loader callable, not 'value'"):
        get_or_set("k", "value")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache keys are non-empty strings, not ''"):
        get_or_set("", lambda: 1)
