"""Redis wake-ups: an enqueue publishes its queues once per committed transaction, and a
worker's listener hears them. Read by a real Redis subscriber, as a worker's listener reads them."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction
from django_redis import get_redis_connection

from django_jobguard import store
from django_jobguard.store.wakeup import channel
from tests.testapp import tasks

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def subscribed():
    """A subscriber on the wake-up channel, once the server confirmed the subscription."""
    pubsub = get_redis_connection("redis").pubsub()
    pubsub.subscribe(channel(connection.alias))
    confirmed = pubsub.get_message(timeout=10)
    assert confirmed is not None and confirmed["type"] == "subscribe"
    return pubsub


@pytest.fixture
def wakeups(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "WAKEUP_CACHE": "redis"}
    pubsub = subscribed()
    yield pubsub
    pubsub.close()


def received(pubsub, settle: float = 0.5) -> list[str]:
    """The messages delivered until none has come for ``settle`` seconds."""
    messages: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=settle)
        if message is None:
            break
        messages.append(message["data"].decode())
    return messages


def test_a_bulk_enqueue_of_many_rows_publishes_once(wakeups):
    assert len(tasks.noop.bulk_enqueue(((), {}) for _ in range(200))) == 200
    assert received(wakeups) == ["default"]


def test_one_transaction_publishes_once_with_each_queue_named_after_it_commits(wakeups):
    with transaction.atomic():
        for i in range(20):
            tasks.add.enqueue(i)
        tasks.slow_record.enqueue(marker="m", seconds=0)
        assert received(wakeups, settle=0.2) == [], "nothing before the commit"
    assert received(wakeups) == ["default\nslow"]


def test_a_rolled_back_enqueue_publishes_nothing(wakeups):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1)
        raise RuntimeError("roll back")
    assert received(wakeups) == []


def test_each_autocommitted_enqueue_publishes_its_own(wakeups):
    for i in range(3):
        tasks.add.enqueue(i)
    assert received(wakeups) == ["default"] * 3


def test_an_enqueue_keyed_by_an_idempotency_key_publishes_only_when_it_inserts(wakeups):
    tasks.add.using(idempotency_key="wake-once").enqueue(1)
    tasks.add.using(idempotency_key="wake-once").enqueue(1)  # a duplicate: nothing new to run
    assert received(wakeups) == ["default"]


def test_a_redis_that_refuses_the_publish_costs_the_wake_up_not_the_job(settings, caplog):
    settings.CACHES = {
        **settings.CACHES,
        "down": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
    }
    settings.JOBGUARD = {**settings.JOBGUARD, "WAKEUP_CACHE": "down"}
    job = tasks.add.enqueue(2, 3)
    job.refresh_from_db()
    assert job.status == "queued"
    assert "wakeup_publish_failed cache=down" in caplog.text


def test_a_listener_wakes_for_its_own_queues_only(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "WAKEUP_CACHE": "redis"}
    source = store.wakeup_source(connection.alias)
    assert source == ("redis", channel(connection.alias))
    listener = store.Listener(None, ["mine"], wakeup=source)
    try:
        assert listener.start(), "subscribed"
        tasks.add.using(queue_name="theirs").enqueue(1)
        assert listener.wait(1.0) is False
        tasks.add.using(queue_name="mine").enqueue(1)
        assert listener.wait(10.0) is True
        listener.wake()  # the worker's own wake-up still returns at once, as "nothing heard"
        assert listener.wait(10.0) is False
    finally:
        listener.close()


def test_without_the_setting_nothing_is_published_and_no_source_is_given(settings):
    pubsub = subscribed()
    try:
        assert store.wakeup_source(connection.alias) is None
        tasks.add.enqueue(1)
        assert received(pubsub) == []
    finally:
        pubsub.close()
