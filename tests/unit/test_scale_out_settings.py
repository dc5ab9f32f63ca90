"""Settings for many hosts: pooled aliases, the LISTEN alias, worker ids, and their checks."""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.test import override_settings

from django_jobguard import checks, conf
from django_jobguard.worker import Worker, default_worker_id

#: Django's documented settings for transaction pooling.
POOLED = {"DISABLE_SERVER_SIDE_CURSORS": True, "OPTIONS": {"prepare_threshold": None}}


@pytest.fixture
def add_databases(monkeypatch):
    """Add PostgreSQL aliases (never connected to) to the connection handler for one test.

    Django does not support overriding DATABASES in tests: its connections are cached.
    """

    def add(**aliases: dict[str, Any]) -> None:
        base = {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "HOST": "db", "PORT": "5432"}
        for alias, overrides in aliases.items():
            monkeypatch.setitem(connections.settings, alias, {**base, **overrides})

    return add


def ids_of(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def run_pool_checks(jobguard: dict[str, Any]) -> list[Any]:
    with override_settings(JOBGUARD=jobguard):
        return checks.database.check_pooled_databases()


def test_pooled_and_listen_aliases_parse_and_resolve(add_databases):
    add_databases(pooled={}, direct={})
    parsed = conf.parse({"POOLED_DATABASES": ["pooled"], "LISTEN_DATABASE": "direct"})
    assert parsed.pooled_databases == frozenset({"pooled"})
    assert parsed.listen_alias("pooled") == "direct"
    # No LISTEN alias: a pooled alias polls, a direct one listens on itself.
    polling = conf.parse({"POOLED_DATABASES": ["pooled"]})
    assert polling.listen_alias("pooled") is None
    assert polling.listen_alias("default") == "default"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"POOLED_DATABASES": "pooled"}, "JOBGUARD['POOLED_DATABASES'] must be a list of database aliases"),
        ({"POOLED_DATABASES": ["nowhere"]}, "JOBGUARD['POOLED_DATABASES'] names 'nowhere', which is not in"),
        ({"LISTEN_DATABASE": "nowhere"}, "JOBGUARD['LISTEN_DATABASE'] names 'nowhere', which is not in"),
        ({"LISTEN_DATABASE": 5}, "JOBGUARD['LISTEN_DATABASE'] must be a database alias, not 5"),
        (
            {"POOLED_DATABASES": ["pooled"], "LISTEN_DATABASE": "pooled"},
            "LISTEN needs a connection that bypasses the pooler",
        ),
        ({"WORKER_ID": "x" * 129}, "JOBGUARD['WORKER_ID'] must be a string of at most 128 characters"),
        ({"MAINTENANCE_LEADER": "yes"}, "JOBGUARD['MAINTENANCE_LEADER'] must be True or False, not 'yes'"),
        ({"LIVENESS_FILE": 1}, "JOBGUARD['LIVENESS_FILE'] must be a file path (a string), not 1"),
    ],
)
def test_bad_scale_out_settings_name_the_key(add_databases, raw, message):
    add_databases(pooled={})
    with pytest.raises(ImproperlyConfigured) as caught:
        conf.parse(raw)
    assert message in str(caught.value)


def test_a_pooled_alias_with_prepared_statements_or_server_side_cursors_warns(add_databases):
    add_databases(pooled={}, direct={})
    messages = run_pool_checks({"POOLED_DATABASES": ["pooled"], "LISTEN_DATABASE": "direct"})
    assert ids_of(messages) == ["jobguard.W060"]
    assert "DISABLE_SERVER_SIDE_CURSORS is not True" in messages[0].msg
    assert "OPTIONS['prepare_threshold'] is not None" in messages[0].msg


def test_a_pooled_alias_with_djangos_transaction_pooling_settings_is_clean(add_databases):
    add_databases(pooled={"PORT": "6432", **POOLED}, direct={})
    messages = run_pool_checks(
        {"DATABASE_ALIAS": "pooled", "POOLED_DATABASES": ["pooled"], "LISTEN_DATABASE": "direct"}
    )
    assert messages == []


def test_an_undeclared_alias_on_pgbouncers_port_warns(add_databases):
    add_databases(bouncer={"PORT": "6432"})
    messages = run_pool_checks({})
    assert ids_of(messages) == ["jobguard.W061"]
    assert "DATABASES['bouncer'] uses port 6432" in messages[0].msg


def test_a_pooled_jobs_alias_without_a_listen_alias_warns_that_workers_poll(add_databases):
    add_databases(pooled=POOLED)
    messages = run_pool_checks({"DATABASE_ALIAS": "pooled", "POOLED_DATABASES": ["pooled"]})
    assert ids_of(messages) == ["jobguard.W062"]
    assert "Workers poll every POLL_INTERVAL" in messages[0].msg
    assert "JOBGUARD['LISTEN_DATABASE'] is not set" in messages[0].msg


def test_a_listen_alias_on_another_database_warns(add_databases):
    add_databases(pooled=POOLED, direct={"NAME": "other"})
    messages = run_pool_checks(
        {"DATABASE_ALIAS": "pooled", "POOLED_DATABASES": ["pooled"], "LISTEN_DATABASE": "direct"}
    )
    assert ids_of(messages) == ["jobguard.W062"]
    assert "JOBGUARD['LISTEN_DATABASE'] 'direct' names another database than 'pooled'" in messages[0].msg


def test_default_worker_ids_name_the_host_and_pid_and_differ_per_worker():
    first, second = default_worker_id(), default_worker_id()
    host, pid, suffix = first.rsplit(":", 2)
    assert host == socket.gethostname()
    assert pid.isdigit()
    assert re.fullmatch(r"[0-9a-f]{6}", suffix)
    assert first != second  # same host and pid (a container restart reusing pid 1): still unique


def test_worker_id_setting_overrides_the_default_and_the_argument_overrides_both():
    with override_settings(JOBGUARD={**settings.JOBGUARD, "WORKER_ID": "pod-7"}):
        assert Worker(install_signal_handlers=False).worker_id == "pod-7"
        assert Worker(worker_id="cli", install_signal_handlers=False).worker_id == "cli"
    assert Worker(install_signal_handlers=False).worker_id.startswith(socket.gethostname() + ":")


def test_a_pooled_jobs_alias_woken_through_redis_does_not_warn_that_workers_poll(add_databases):
    add_databases(pooled=POOLED)
    with override_settings(
        CACHES={"wake": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://x"}}
    ):
        messages = run_pool_checks(
            {"DATABASE_ALIAS": "pooled", "POOLED_DATABASES": ["pooled"], "WAKEUP_CACHE": "wake"}
        )
    assert ids_of(messages) == []


@pytest.mark.parametrize(
    ("caches", "problem"),
    [
        ({}, "'wake', which is not in CACHES"),
        (
            {"wake": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
            "wake-ups go through Redis pub/sub, which needs django-redis",
        ),
    ],
    ids=["missing", "not-redis"],
)
def test_a_wakeup_cache_that_is_not_a_django_redis_cache_is_an_error(caches, problem):
    with override_settings(CACHES=caches, JOBGUARD={"WAKEUP_CACHE": "wake"}):
        messages = checks.caches.check_wakeup_cache()
    assert ids_of(messages) == ["jobguard.E006"]
    assert problem in messages[0].msg
    with override_settings(JOBGUARD={}):
        assert checks.caches.check_wakeup_cache() == [], "not set: nothing to check"


def test_a_wakeup_cache_that_is_not_a_string_is_refused_by_name():
    with pytest.raises(ImproperlyConfigured, match=r"WAKEUP_CACHE.*must be a cache alias"):
        conf.parse({"WAKEUP_CACHE": ["redis"]})
