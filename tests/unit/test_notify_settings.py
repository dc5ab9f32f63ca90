"""JOBGUARD["NOTIFY"] and NOTIFY_INTERVAL: parsing, what the worker listens on, and check W066."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.test import override_settings

from django_jobguard import checks, conf


@pytest.fixture
def postgres_alias(monkeypatch):
    """A PostgreSQL alias "pg" (never connected to) in the connection handler, for one test."""
    base = {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "HOST": "db", "PORT": "5432"}
    monkeypatch.setitem(connections.settings, "pg", base)
    return "pg"


def w066(jobguard: dict[str, Any]) -> list[str]:
    with override_settings(JOBGUARD=jobguard):
        return [m.msg for m in checks.database.check_pooled_databases() if m.id == "jobguard.W066"]


def test_coalesced_is_the_default_and_each_mode_parses():
    assert (conf.parse({}).notify, conf.parse({}).notify_interval) == ("coalesced", 0.05)
    for mode in ("row", "coalesced", "none"):
        assert conf.parse({"NOTIFY": mode}).notify == mode


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"NOTIFY": "bulk"}, "JOBGUARD['NOTIFY'] must be one of 'coalesced', 'row', 'none', not 'bulk'."),
        ({"NOTIFY": None}, "JOBGUARD['NOTIFY'] must be one of 'coalesced', 'row', 'none', not None."),
        ({"NOTIFY_INTERVAL": 0}, "JOBGUARD['NOTIFY_INTERVAL'] must be more than 0, not 0."),
        ({"NOTIFY_INTERVAL": 60}, "JOBGUARD['NOTIFY_INTERVAL'] must be at most 10 seconds, not 60."),
    ],
)
def test_a_bad_notify_setting_is_refused_by_name(raw, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        conf.parse(raw)
    assert str(caught.value) == message


def test_with_notify_none_a_worker_holds_no_connection_to_listen_on(postgres_alias):
    assert conf.parse({}).listen_alias(postgres_alias) == postgres_alias
    assert conf.parse({"NOTIFY": "none"}).listen_alias(postgres_alias) is None


def test_notify_none_without_redis_and_a_long_poll_warns_naming_the_delay(postgres_alias):
    jobguard = {"DATABASE_ALIAS": postgres_alias, "NOTIFY": "none", "POLL_INTERVAL": 5}
    assert w066(jobguard) == [
        "An idle worker finds a new job up to 5 s after its enqueue: JOBGUARD['NOTIFY'] is 'none', "
        "JOBGUARD['WAKEUP_CACHE'] is not set, and workers poll every POLL_INTERVAL (5 s)."
    ]
    assert w066({**jobguard, "POLL_INTERVAL": 1}) == [], "the default poll is prompt enough"
    assert w066({**jobguard, "WAKEUP_CACHE": "redis"}) == [], "Redis wakes the workers"
    assert w066({**jobguard, "NOTIFY": "coalesced"}) == []
