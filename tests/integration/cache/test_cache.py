"""Cache invalidation after commit, model-declared invalidation, and versioned cache writes.

Every test runs on the local-memory cache of the default settings; those taking ``alias``
run again on the django-redis alias "redis" when ``JOBGUARD_TEST_REDIS_URL`` is set.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import uuid
from collections import Counter

import pytest
from django.conf import settings
from django.core.cache import InvalidCacheBackendError, caches
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from prometheus_client import REGISTRY

from django_jobguard import cache as jobguard_cache
from django_jobguard import conf
from django_jobguard.cache import Versioned, get_versioned, invalidate, invalidates, set_versioned
from django_jobguard.cache._entries import redis_connection
from tests.testapp.models import Account, Tag

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(
    params=[
        "default",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis_metered", marks=pytest.mark.redis),
    ]
)
def alias(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def key() -> str:
    """A key no other test (or earlier run against the same Redis) has used."""
    return f"test:{uuid.uuid4().hex}"


def invalidations(alias: str, status: str = "ok") -> float:
    return (
        REGISTRY.get_sample_value("jobguard_cache_invalidations_total", {"cache": alias, "status": status})
        or 0
    )


def rejections(alias: str) -> float:
    return REGISTRY.get_sample_value("jobguard_cache_stale_writes_rejected_total", {"cache": alias}) or 0


# -- invalidate(): after the commit, never on rollback ------------------------------------


def test_keys_are_deleted_when_the_transaction_commits_not_before(alias, key):
    cache = caches[alias]
    cache.set_many({key: "old", key + ":other": "old", key + ":kept": "old"})
    before = invalidations(alias)
    with transaction.atomic():
        Account.objects.create(owner="a")
        invalidate(key, key + ":other", cache_alias=alias)
        assert cache.get(key) == "old"  # still there while the transaction is open
    assert cache.get(key) is None
    assert cache.get(key + ":other") is None
    assert cache.get(key + ":kept") == "old"
    assert invalidations(alias) - before == 2


def test_a_transaction_that_rolls_back_deletes_nothing(alias, key):
    cache = caches[alias]
    cache.set(key, "current")
    before = invalidations(alias)
    with pytest.raises(RuntimeError, match="write failed"), transaction.atomic():
        Account.objects.create(owner="a")
        invalidate(key, cache_alias=alias)
        raise RuntimeError("write failed")
    assert not Account.objects.exists()
    assert cache.get(key) == "current"
    assert invalidations(alias) == before


def test_in_autocommit_the_keys_are_deleted_at_once(alias, key):
    caches[alias].set(key, "old")
    invalidate(key, cache_alias=alias)
    assert caches[alias].get(key) is None


def test_a_rolled_back_savepoint_drops_its_invalidations_and_keeps_the_outer_ones(alias, key):
    cache = caches[alias]
    cache.set_many({key + ":outer": 1, key + ":inner": 1, key + ":kept-savepoint": 1})
    with transaction.atomic():
        invalidate(key + ":outer", cache_alias=alias)
        with pytest.raises(RuntimeError), transaction.atomic():
            invalidate(key + ":inner", cache_alias=alias)
            raise RuntimeError("inner block fails")
        with transaction.atomic():  # a savepoint that is released joins the outer transaction
            invalidate(key + ":kept-savepoint", cache_alias=alias)
        assert cache.get(key + ":kept-savepoint") == 1
    assert cache.get(key + ":outer") is None
    assert cache.get(key + ":inner") == 1
    assert cache.get(key + ":kept-savepoint") is None


def test_the_default_cache_alias_comes_from_the_setting(key):
    caches["files"].set(key, "old")
    caches["default"].set(key, "old")
    with override_settings(JOBGUARD={**settings.JOBGUARD, "CACHE": {"ALIAS": "files"}}):
        invalidate(key)
    assert caches["files"].get(key) is None
    assert caches["default"].get(key) == "old"


@pytest.fixture
def dead_redis_alias():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": f"redis://127.0.0.1:{port}/0",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    }
    with override_settings(CACHES={**settings.CACHES, "dead": dead}):
        yield "dead"


@pytest.mark.parametrize("version", [None, 3], ids=["delete", "tombstone"])
def test_an_unreachable_cache_is_logged_with_the_keys_and_counted_never_raised(
    dead_redis_alias, caplog, version
):
    before = invalidations(dead_redis_alias, "error")
    with transaction.atomic():
        Account.objects.create(owner="committed")
        invalidate("account:1:balance", "account:1:summary", version=version, cache_alias=dead_redis_alias)
    assert Account.objects.filter(owner="committed").exists()  # the write stands
    assert invalidations(dead_redis_alias, "error") - before == 2
    assert invalidations(dead_redis_alias, "ok") == 0
    failures = [r for r in caplog.records if r.getMessage().startswith("cache_invalidation_failed")]
    # A plain delete is one call for both keys; tombstones are written (and fail) one by one.
    expected = (
        ["cache_invalidation_failed cache=dead keys=['account:1:balance', 'account:1:summary'] version=None"]
        if version is None
        else [
            "cache_invalidation_failed cache=dead keys=['account:1:balance'] version=3",
            "cache_invalidation_failed cache=dead keys=['account:1:summary'] version=3",
        ]
    )
    assert [r.getMessage() for r in failures] == expected
    assert all(r.exc_info is not None for r in failures)


def test_bad_arguments_raise_at_the_call_site_before_anything_is_scheduled():
    with pytest.raises(InvalidCacheBackendError, match="nope"):
        invalidate("k", cache_alias="nope")
    with pytest.raises(ValueError, match="cache keys are non-empty strings, not 7"):
        invalidate(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"a cache version is an integer from 0 to 2\*\*53 - 1, not -1"):
        invalidate("k", version=-1)
    with pytest.raises(ValueError, match="not True"):
        set_versioned("k", 1, True)


# -- invalidates(): declared once per model ----------------------------------------------


@pytest.fixture
def declared(request: pytest.FixtureRequest):
    made: list[jobguard_cache.Invalidation] = []

    def declare(*args, **kwargs):
        made.append(invalidates(*args, **kwargs))
        return made[-1]

    yield declare
    for declaration in made:
        declaration.disconnect()


def test_saving_a_declared_model_invalidates_its_keys_after_commit(alias, declared):
    prefix = uuid.uuid4().hex
    declared(
        Account,
        prefix + ":account:{pk}:balance",
        lambda account: [f"{prefix}:owner:{account.owner}"],
        cache_alias=alias,
    )
    cache = caches[alias]
    account = Account.objects.create(owner="ann")
    keys = [f"{prefix}:account:{account.pk}:balance", f"{prefix}:owner:ann"]
    cache.set_many(dict.fromkeys(keys, "old"))
    with transaction.atomic():
        account.balance = 10
        account.save()
        assert cache.get_many(keys) == dict.fromkeys(keys, "old")
    assert cache.get_many(keys) == {}

    cache.set_many(dict.fromkeys(keys, "old"))
    with pytest.raises(RuntimeError), transaction.atomic():
        account.save()
        raise RuntimeError("rolled back")
    assert cache.get_many(keys) == dict.fromkeys(keys, "old")

    account.delete()  # autocommit: at once
    assert cache.get_many(keys) == {}


def test_declared_many_to_many_changes_invalidate_from_either_side(declared):
    declared(Account, "m2m:account:{pk}:tags")
    cache = caches["default"]
    account = Account.objects.create(owner="bo")
    tag = Tag.objects.create(name="vip")
    key = f"m2m:account:{account.pk}:tags"

    cache.set(key, "old")
    account.tags.add(tag)
    assert cache.get(key) is None

    cache.set(key, "old")
    tag.accounts.remove(account)  # the reverse side: the account comes from pk_set
    assert cache.get(key) is None

    account.tags.add(tag)
    cache.set(key, "old")
    account.tags.clear()
    assert cache.get(key) is None


def test_a_declaration_with_a_version_leaves_a_tombstone(declared, alias):
    prefix = uuid.uuid4().hex
    declared(Account, prefix + ":{pk}", version="revision", cache_alias=alias)
    account = Account.objects.create(owner="cy", revision=1)
    key = f"{prefix}:{account.pk}"
    # The create left a tombstone for revision 1: older fills are refused, revision 1 may fill.
    assert set_versioned(key, "r0", 0, cache_alias=alias) is False
    assert set_versioned(key, "r1", 1, cache_alias=alias) is True
    account.revision = 2
    account.save()
    assert get_versioned(key, cache_alias=alias) is None
    assert set_versioned(key, "r1", 1, cache_alias=alias) is False
    assert set_versioned(key, "r2", 2, cache_alias=alias) is True


def test_a_template_naming_a_missing_attribute_says_which(declared):
    declared(Account, "account:{acount_id}")
    with pytest.raises(
        ValueError, match=r"cache key template 'account:\{acount_id\}': Account has no attribute 'acount_id'"
    ):
        Account.objects.create(owner="dee")


def test_invalidates_refuses_what_it_cannot_use():
    with pytest.raises(TypeError, match="takes a model class"):
        invalidates("testapp.Account", "k")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one key"):
        invalidates(Account)


def test_disconnect_stops_the_invalidation(declared):
    declaration = declared(Account, "disc:{pk}")
    account = Account.objects.create(owner="ed")
    declaration.disconnect()
    caches["default"].set(f"disc:{account.pk}", "old")
    account.save()
    assert caches["default"].get(f"disc:{account.pk}") == "old"
    assert declaration not in jobguard_cache.declarations()


# -- versioned writes ---------------------------------------------------------------------


def test_a_newer_version_is_written_an_older_or_equal_one_is_refused_and_counted(alias, key):
    before = rejections(alias)
    assert get_versioned(key, cache_alias=alias) is None
    assert set_versioned(key, {"balance": 5}, 5, cache_alias=alias) is True
    assert get_versioned(key, cache_alias=alias) == Versioned({"balance": 5}, 5)
    assert set_versioned(key, {"balance": 4}, 4, cache_alias=alias) is False
    assert set_versioned(key, {"balance": "same"}, 5, cache_alias=alias) is False
    assert get_versioned(key, cache_alias=alias) == Versioned({"balance": 5}, 5)
    assert set_versioned(key, 6, 6, cache_alias=alias) is True
    assert get_versioned(key, cache_alias=alias) == Versioned(6, 6)
    assert rejections(alias) - before == 2


def test_a_plain_value_under_the_key_is_replaced_and_never_read_as_versioned(alias, key):
    caches[alias].set(key, "plain")
    assert get_versioned(key, cache_alias=alias) is None
    assert set_versioned(key, "v", 0, cache_alias=alias) is True
    assert get_versioned(key, cache_alias=alias) == Versioned("v", 0)


def test_a_versioned_value_lives_for_its_timeout(alias, key):
    with pytest.raises(ValueError, match="needs a timeout of more than 0 seconds, or None; not 0"):
        set_versioned(key, "never", 1, timeout=0, cache_alias=alias)
    assert set_versioned(key, "short", 1, timeout=0.001, cache_alias=alias) is True
    time.sleep(0.05)
    assert get_versioned(key, cache_alias=alias) is None
    assert set_versioned(key, "kept", 1, timeout=None, cache_alias=alias) is True
    assert get_versioned(key, cache_alias=alias) == Versioned("kept", 1)


def test_invalidating_a_versioned_key_without_a_version_deletes_it(alias, key):
    set_versioned(key, "v7", 7, cache_alias=alias)
    invalidate(key, cache_alias=alias)
    assert get_versioned(key, cache_alias=alias) is None
    # A plain delete keeps no floor: any version may fill the key again.
    assert set_versioned(key, "v1", 1, cache_alias=alias) is True


def test_the_stale_reader_race_is_closed_by_a_versioned_invalidation(alias, key):
    account = Account.objects.create(owner="race", balance=10, revision=1)
    assert set_versioned(key, 10, 1, cache_alias=alias)
    invalidate(key, version=1, cache_alias=alias)  # e.g. an earlier write; the cache is empty now

    # 1. A reader misses the cache and loads the row: revision 1, balance 10.
    stale = Account.objects.get(pk=account.pk)
    # 2. A writer commits revision 2 and invalidates with its version.
    with transaction.atomic():
        Account.objects.filter(pk=account.pk).update(balance=25, revision=2)
        invalidate(key, version=2, cache_alias=alias)
    # 3. The reader, late, fills the cache from what it loaded: refused.
    before = rejections(alias)
    assert set_versioned(key, stale.balance, stale.revision, cache_alias=alias) is False
    assert get_versioned(key, cache_alias=alias) is None
    assert rejections(alias) - before == 1
    # 4. The next reader loads revision 2 and fills the cache.
    fresh = Account.objects.get(pk=account.pk)
    assert set_versioned(key, fresh.balance, fresh.revision, cache_alias=alias) is True
    assert get_versioned(key, cache_alias=alias) == Versioned(25, 2)


def test_without_a_version_the_same_race_leaves_the_stale_value(alias, key):
    # The control for the test above: a plain delete cannot refuse the late fill.
    account = Account.objects.create(owner="race", balance=10, revision=1)
    stale = Account.objects.get(pk=account.pk)
    with transaction.atomic():
        Account.objects.filter(pk=account.pk).update(balance=25, revision=2)
        invalidate(key, cache_alias=alias)
    assert set_versioned(key, stale.balance, stale.revision, cache_alias=alias) is True
    assert get_versioned(key, cache_alias=alias) == Versioned(10, 1)


def test_a_late_tombstone_keeps_the_newer_value_fillable_and_older_ones_out(alias, key):
    assert set_versioned(key, "v7", 7, cache_alias=alias)
    invalidate(key, version=5, cache_alias=alias)  # a slow transaction's invalidation arrives late
    assert get_versioned(key, cache_alias=alias) is None  # delete, do not trust: the value is gone
    assert set_versioned(key, "v6", 6, cache_alias=alias) is False
    assert set_versioned(key, "v7", 7, cache_alias=alias) is True
    invalidate(key, version=9, cache_alias=alias)
    invalidate(key, version=8, cache_alias=alias)  # out of order: the higher floor stays
    assert set_versioned(key, "v8", 8, cache_alias=alias) is False
    assert set_versioned(key, "v9", 9, cache_alias=alias) is True


def test_a_tombstone_lives_for_the_configured_ttl(key):
    with override_settings(JOBGUARD={**settings.JOBGUARD, "CACHE": {"TOMBSTONE_TTL": 0.001}}):
        invalidate(key, version=5)
    time.sleep(0.05)
    assert set_versioned(key, "v1", 1) is True  # the tombstone expired: its floor is gone


def test_threads_writing_shuffled_versions_accept_each_version_once_at_most():
    key, versions, threads = f"threads:{uuid.uuid4().hex}", range(1, 301), 8
    accepted: list[list[int]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def write(slot: int) -> None:
        order = list(versions)
        random.Random(slot).shuffle(order)
        start.wait()
        for version in order:
            if set_versioned(key, version, version):
                accepted[slot].append(version)

    workers = [threading.Thread(target=write, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    counts = Counter(version for slot in accepted for version in slot)
    assert max(counts.values()) == 1
    assert all(slot == sorted(slot) for slot in accepted)
    assert get_versioned(key) == Versioned(300, 300)


# -- settings and the system check -------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"CACHE": {"ALIAS": ""}}, "JOBGUARD['CACHE']['ALIAS'] must be a non-empty string"),
        ({"CACHE": {"TOMBSTONE_TTL": 0}}, "JOBGUARD['CACHE']['TOMBSTONE_TTL'] must be more than 0"),
        ({"CACHE": {"TTL": 5}}, "JOBGUARD['CACHE']['TTL'] is not a known setting"),
        ({"CACHE": "redis"}, "JOBGUARD['CACHE'] must be a dict"),
    ],
)
def test_invalid_cache_settings_name_the_key(raw, named):
    with pytest.raises(ImproperlyConfigured, match=named.replace("[", r"\[").replace("]", r"\]")):
        conf.parse(raw)


def test_cache_settings_defaults():
    assert conf.parse(None).cache == conf.CacheSettings(alias="default", tombstone_ttl=60.0)


def e005() -> list[str]:
    return [m.msg for m in run_checks() if m.id == "jobguard.E005"]


def test_the_check_is_silent_for_projects_that_do_not_use_the_feature():
    with override_settings(CACHES={"other": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}):
        assert e005() == []


def test_the_check_reports_a_configured_alias_that_is_not_in_caches():
    with override_settings(JOBGUARD={**settings.JOBGUARD, "CACHE": {"ALIAS": "shared"}}):
        assert e005() == ["JOBGUARD['CACHE']['ALIAS'] is 'shared', which is not in CACHES."]


def test_the_check_reports_the_alias_a_declaration_uses(declared):
    declared(Account, "k:{pk}", cache_alias="missing")
    assert e005() == ["invalidates(testapp.Account)'s cache_alias is 'missing', which is not in CACHES."]
    declared(Tag, "t:{pk}")
    with override_settings(CACHES={"missing": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}):
        assert e005() == ["JOBGUARD['CACHE']['ALIAS'] is 'default', which is not in CACHES."]


@pytest.mark.redis
def test_django_prometheus_redis_cache_takes_the_atomic_redis_path(key):
    # Its versioned writes must be the Lua compare-and-set, not the per-process fallback.
    metered = caches["redis_metered"]
    assert redis_connection(metered, "redis_metered") is not None
    assert set_versioned(key, "v2", version=2, cache_alias="redis_metered")
    assert not set_versioned(key, "v1", version=1, cache_alias="redis_metered")
    assert get_versioned(key, cache_alias="redis_metered") == Versioned("v2", 2)
    before = REGISTRY.get_sample_value("django_cache_get_misses_total", {"backend": "redis"}) or 0
    metered.get(key + ":absent")
    assert REGISTRY.get_sample_value("django_cache_get_misses_total", {"backend": "redis"}) == before + 1
