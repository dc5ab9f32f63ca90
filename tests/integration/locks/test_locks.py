"""The lock API on each back end: exclusion, TTL, owner tokens, fencing tokens, key names."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import override_settings

from django_jobguard import LockNotAcquired, LockUnavailable, lock
from django_jobguard.checks.caches import check_lock_backend
from django_jobguard.locks import BaseLock
from django_jobguard.models import Lock
from tests.conftest import wait_for
from tests.support import locking
from tests.testapp.models import FencedCounter
from tests.testapp.tasks_locks import fenced_write

pytestmark = pytest.mark.django_db(transaction=True)

backend = locking.backend
make_lock = locking.make_lock


#: Slack when comparing a TTL the store computed with the TTL asked for: SQLite's julianday
#: arithmetic is a float of days, off by some microseconds either way (12.000015 for a
#: 12 s TTL read back at once), so an exact bound fails at random.
STORE_CLOCK_TOLERANCE_SECONDS = 0.001


def stored_ttl(backend: str, held: BaseLock) -> float:
    """Seconds the stored lock has left, read from the store itself (see STORE_CLOCK_TOLERANCE_SECONDS)."""
    name = held.name
    if backend == "redis":
        from django_redis import get_redis_connection

        # The Redis key carries the lock key as a hash tag (Redis Cluster).
        return get_redis_connection("redis").pttl(held.redis_key) / 1000
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM expires_at - statement_timestamp()) FROM jobguard_lock "
                "WHERE key = %s",
                [name],
            )
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) / 1e6 FROM jobguard_lock "
                "WHERE `key` = %s",
                [name],
            )
        else:
            cursor.execute(
                "SELECT (julianday(expires_at) - julianday('now')) * 86400 FROM jobguard_lock WHERE key = %s",
                [name],
            )
        return float(cursor.fetchone()[0])


def test_only_one_owner_holds_a_key_until_it_releases(backend):
    first, second = make_lock(backend, "order:1", ttl=30), make_lock(backend, "order:1", ttl=30)
    assert first.acquire(blocking=False)
    assert not second.acquire(blocking=False)
    assert first.locked() and second.locked()
    assert (first.held, second.held) == (True, False)
    first.release()
    assert not second.locked()
    assert second.acquire(blocking=False)
    second.release()


def test_different_keys_do_not_contend(backend):
    with make_lock(backend, "order:1"), make_lock(backend, "order:2") as other:
        assert other.held


def test_context_manager_holds_the_lock_inside_and_frees_it_after(backend):
    with make_lock(backend, "invoice:9", ttl=30) as held:
        assert isinstance(held.fencing_token, int)
        assert not make_lock(backend, "invoice:9").acquire(blocking=False)
    assert not held.locked()
    assert not held.held


def test_context_manager_releases_when_the_block_raises(backend):
    with pytest.raises(ZeroDivisionError), make_lock(backend, "invoice:9", ttl=30) as held:
        1 / 0  # noqa: B018
    assert not held.locked()


def test_context_manager_on_a_held_lock_raises_lock_not_acquired(backend):
    with make_lock(backend, "invoice:9", ttl=30):
        with pytest.raises(LockNotAcquired, match=r"'jobguard:lock:invoice:9' is held by another owner"):
            with make_lock(backend, "invoice:9", blocking=False):
                pass
        with pytest.raises(LockNotAcquired, match=r"could not acquire 'jobguard:lock:invoice:9' within 0.2s"):
            with make_lock(backend, "invoice:9", timeout=0.2):
                pass


def test_blocking_acquire_waits_until_the_holder_releases(backend):
    holder = make_lock(backend, "report:acme", ttl=30)
    holder.acquire()
    started = threading.Event()

    def release_soon() -> None:
        started.wait(10)
        time.sleep(0.2)
        holder.release()
        connection.close()

    thread = threading.Thread(target=release_soon)
    thread.start()
    waiter = make_lock(backend, "report:acme", ttl=30)
    started.set()
    try:
        assert waiter.acquire(timeout=30)
    finally:
        thread.join()
    assert waiter.fencing_token > holder.fencing_token
    waiter.release()


def test_blocking_acquire_gives_up_after_its_timeout(backend):
    with make_lock(backend, "report:acme", ttl=30):
        assert make_lock(backend, "report:acme").acquire(timeout=0.2) is False


def test_keys_are_stored_under_the_prefix(backend):
    with make_lock(backend, "order:123", ttl=30) as held:
        assert held.name == "jobguard:lock:order:123"
        if backend == "redis":
            from django_redis import get_redis_connection

            assert get_redis_connection("redis").get("jobguard:lock:{order:123}") == held.token.encode()
        else:
            assert Lock.objects.get(key="jobguard:lock:order:123").token == held.token


def test_the_prefix_is_configurable(backend):
    with override_settings(JOBGUARD={"LOCKS": {"PREFIX": "shop:locks:"}}):
        held = make_lock(backend, "order:123", ttl=30)
        try:
            assert held.acquire(blocking=False)
            assert held.name == "shop:locks:order:123"
            if backend == "redis":
                from django_redis import get_redis_connection

                assert get_redis_connection("redis").exists("shop:locks:{order:123}")
            else:
                assert Lock.objects.filter(key="shop:locks:order:123").exists()
        finally:
            held.release()
            if backend == "redis":
                get_redis_connection("redis").delete("shop:locks:{order:123}:fencing")


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, True, "30"])
def test_a_lock_without_a_finite_positive_ttl_cannot_be_created(backend, ttl):
    with pytest.raises(ValueError, match="every lock needs a finite TTL in seconds"):
        make_lock(backend, "order:1", ttl=ttl)


def test_a_lock_created_without_ttl_gets_the_configured_one_and_the_store_expires_it(backend):
    with override_settings(JOBGUARD={"LOCKS": {"TTL": 12}}):
        with make_lock(backend, "order:1") as held:
            assert held.ttl == 12
            assert 0 < stored_ttl(backend, held) <= 12 + STORE_CLOCK_TOLERANCE_SECONDS


def test_extend_resets_the_ttl(backend):
    with make_lock(backend, "order:1", ttl=1) as held:
        assert held.extend(ttl=60)
        assert stored_ttl(backend, held) > 30
        assert held.extend()  # back to the lock's own TTL
        assert stored_ttl(backend, held) <= 1 + STORE_CLOCK_TOLERANCE_SECONDS


def take_over_after_expiry(backend):
    """An owner whose lock expired, and the owner that took the key over after it."""
    old = make_lock(backend, "order:1", ttl=0.3)
    assert old.acquire()
    wait_for(lambda: not old.locked(), timeout=30, message="the lock to expire")
    new = make_lock(backend, "order:1", ttl=30)
    assert new.acquire(blocking=False)
    return old, new


def test_an_expired_lock_can_be_taken_over_with_a_newer_fencing_token(backend):
    old, new = take_over_after_expiry(backend)
    assert new.fencing_token > old.fencing_token
    new.release()


def test_an_owner_cannot_release_a_lock_that_expired_and_was_taken_over(backend):
    old, new = take_over_after_expiry(backend)
    with pytest.raises(
        LockNotAcquired,
        match=r"lock 'jobguard:lock:order:1' expired before it was released; another owner may have held it",
    ):
        old.release()
    assert new.locked()
    assert new.extend()
    new.release()


def test_an_owner_cannot_extend_a_lock_that_expired_and_was_taken_over(backend):
    old, new = take_over_after_expiry(backend)
    assert old.extend() is False
    assert not old.held
    with pytest.raises(LockNotAcquired, match="is not held by this owner"):
        old.release()
    assert new.locked()
    new.release()
    assert not new.locked()


def test_an_expired_lock_no_one_took_cannot_be_released_either(backend):
    old = make_lock(backend, "order:1", ttl=0.3)
    assert old.acquire()
    wait_for(lambda: not old.locked(), timeout=30, message="the lock to expire")
    with pytest.raises(LockNotAcquired, match="expired before it was released"):
        old.release()


def test_fencing_tokens_strictly_increase_across_holders(backend):
    tokens = []
    for _ in range(5):
        holder = make_lock(backend, "order:1", ttl=30)
        assert holder.acquire(blocking=False)
        tokens.append(holder.fencing_token)
        holder.release()
    old, new = take_over_after_expiry(backend)
    tokens += [old.fencing_token, new.fencing_token]
    assert all(isinstance(token, int) for token in tokens), tokens
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    new.release()


def test_a_failed_acquire_does_not_spend_a_fencing_token(backend):
    holder = make_lock(backend, "account:7", ttl=30)
    holder.acquire()
    loser = make_lock(backend, "account:7")
    assert not loser.acquire(blocking=False)
    assert loser.fencing_token is None
    holder.release()
    after = make_lock(backend, "account:7", ttl=30)
    after.acquire()
    if backend == "database":
        assert after.fencing_token == holder.fencing_token + 1
    else:
        assert after.fencing_token > holder.fencing_token
    after.release()


def test_a_downstream_write_refuses_a_holder_older_than_the_last_writer(backend):
    old, new = take_over_after_expiry(backend)
    assert fenced_write("account:7", new.fencing_token)
    # The old holder wakes up and writes late: its token is older, so the write is refused.
    assert not fenced_write("account:7", old.fencing_token)
    counter = FencedCounter.objects.get(resource="account:7")
    assert (counter.value, counter.last_fencing_token, counter.rejected_writes) == (1, new.fencing_token, 1)
    new.release()


def test_an_owner_cannot_acquire_twice(backend):
    with make_lock(backend, "order:1", ttl=30) as held:
        with pytest.raises(RuntimeError, match="already held by this owner"):
            held.acquire(blocking=False)


def test_release_without_acquire_raises(backend):
    with pytest.raises(LockNotAcquired, match="lock 'jobguard:lock:order:1' is not held by this owner"):
        make_lock(backend, "order:1").release()


def test_each_acquire_gets_a_fresh_owner_token(backend):
    held = make_lock(backend, "order:1", ttl=30)
    held.acquire()
    first = held.token
    held.release()
    held.acquire()
    assert held.token != first
    held.release()


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "a lock key names a resource"),
        ("order:1:fencing", "ends with ':fencing', which is reserved"),
        ("x" * 250, "prefix and key together may have at most 255"),
    ],
)
def test_bad_keys_are_refused(backend, key, message):
    with pytest.raises(ValueError, match=message):
        make_lock(backend, key)


def test_database_locks_are_refused_inside_a_transaction():
    held = lock("order:1", ttl=30, backend="database")
    with transaction.atomic(), pytest.raises(RuntimeError, match=r"outside transaction.atomic\(\)"):
        held.acquire()


def test_a_database_lock_can_be_checked_and_extended_inside_a_transaction():
    with lock("order:1", ttl=30, backend="database") as held:
        with transaction.atomic():
            assert held.locked()
            assert held.extend()


def test_backend_options_are_checked():
    with pytest.raises(ValueError, match="the redis lock back end takes cache_alias="):
        lock("order:1", backend="redis", using="default")
    with pytest.raises(ValueError, match="the database lock back end takes using="):
        lock("order:1", backend="database", cache_alias="redis")
    with pytest.raises(ValueError, match="unknown lock back end 'memcached'"):
        lock("order:1", backend="memcached")


@pytest.mark.redis
def test_redis_fencing_tokens_keep_increasing_when_redis_loses_the_counter():
    from django_redis import get_redis_connection

    locking.clear_redis_locks()
    first = make_lock("redis", "account:7", ttl=30)
    first.acquire()
    first.release()
    client = get_redis_connection("redis")
    assert 0 < client.pttl("jobguard:lock:{account:7}:fencing")  # idle counters expire
    client.delete("jobguard:lock:{account:7}:fencing")  # as after a restart without persistence
    second = make_lock("redis", "account:7", ttl=30)
    second.acquire()
    assert second.fencing_token > first.fencing_token
    second.release()
    locking.clear_redis_locks()


DOWN_CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # Nothing listens on port 1: every connection is refused.
    "down": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
}


@override_settings(CACHES=DOWN_CACHES)
def test_an_unreachable_redis_raises_lock_unavailable():
    held = lock("order:1", ttl=30, backend="redis", cache_alias="down")
    with pytest.raises(
        LockUnavailable, match=r"lock 'jobguard:lock:order:1': Redis did not answer \(.*refused"
    ):
        held.acquire()
    assert not held.held
    with pytest.raises(LockUnavailable, match="Redis did not answer"):
        held.locked()


def test_a_cache_that_is_not_django_redis_is_a_configuration_error():
    with pytest.raises(ImproperlyConfigured, match="'default', which is not a django-redis cache"):
        lock("order:1", backend="redis", cache_alias="default").acquire()


def test_system_check_reports_a_redis_lock_backend_without_django_redis():
    with override_settings(JOBGUARD={"LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "default"}}):
        [error] = check_lock_backend()
    assert error.id == "jobguard.E004"
    assert error.msg == (
        "JOBGUARD['LOCKS']['CACHE_ALIAS'] is 'default', which has BACKEND "
        "'django.core.cache.backends.locmem.LocMemCache'; the Redis lock back end needs django-redis "
        "(or a subclass of its cache)."
    )
    with override_settings(JOBGUARD={"LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "nope"}}):
        [error] = check_lock_backend()
    assert error.msg == "JOBGUARD['LOCKS']['CACHE_ALIAS'] is 'nope', which is not in CACHES."
    with override_settings(
        JOBGUARD={"LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "down"}}, CACHES=DOWN_CACHES
    ):
        assert check_lock_backend() == []
    metered = {"BACKEND": "django_prometheus.cache.backends.redis.RedisCache", "LOCATION": "redis://x:1/0"}
    with override_settings(
        JOBGUARD={"LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "metered"}}, CACHES={"metered": metered}
    ):
        assert check_lock_backend() == []  # a subclass of django-redis's cache is django-redis
    missing = {"BACKEND": "nowhere.RedisCache"}
    with override_settings(
        JOBGUARD={"LOCKS": {"BACKEND": "redis", "CACHE_ALIAS": "missing"}}, CACHES={"missing": missing}
    ):
        [error] = check_lock_backend()
    assert "has BACKEND 'nowhere.RedisCache'" in error.msg
    assert check_lock_backend() == []  # the database back end needs no cache
