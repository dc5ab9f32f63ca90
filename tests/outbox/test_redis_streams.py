"""The Redis Streams destination against a real Redis: fields, classification of failures."""

from __future__ import annotations

import datetime
import os
import uuid
from collections.abc import Iterator

import pytest

from django_jobguard.outbox.destinations.base import Envelope, PermanentDeliveryError, TransientDeliveryError
from django_jobguard.outbox.destinations.redis_streams import RedisStreamDestination


def _envelope(key: str = "order:7", seq: int = 3) -> Envelope:
    return Envelope(
        id=str(uuid.uuid4()),
        destination="orders",
        key=key,
        seq=seq,
        payload={"total": "9.50", "items": [1, 2]},
        headers={"tenant": "acme"},
        published_at=datetime.datetime(2026, 12, 7, 15, 0, tzinfo=datetime.UTC),
        attempt=2,
    )


@pytest.fixture
def stream() -> Iterator[str]:
    import redis

    name = f"jobguard-test-{uuid.uuid4().hex}"
    yield name
    client = redis.Redis.from_url(os.environ["JOBGUARD_TEST_REDIS_URL"])
    client.delete(name)
    client.close()


@pytest.mark.redis
def test_a_message_is_one_stream_entry_with_its_id_place_and_headers(stream: str) -> None:
    import redis

    destination = RedisStreamDestination.from_options(
        "orders", {"URL": os.environ["JOBGUARD_TEST_REDIS_URL"], "STREAM": stream}
    )
    envelope = _envelope()
    try:
        destination.send(envelope)
    finally:
        destination.close()
    client = redis.Redis.from_url(os.environ["JOBGUARD_TEST_REDIS_URL"], decode_responses=True)
    ((_entry, fields),) = client.xrange(stream)
    client.close()
    assert fields == {
        "id": envelope.id,
        "payload": '{"total":"9.50","items":[1,2]}',
        "published-at": "2026-12-07T15:00:00+00:00",
        "tenant": "acme",
        "jobguard-key": "order:7",
        "jobguard-seq": "3",
        "jobguard-attempt": "2",
        "jobguard-destination": "orders",
    }


@pytest.mark.redis
def test_the_stream_name_is_a_template_over_destination_and_key(stream: str) -> None:
    import redis

    destination = RedisStreamDestination.from_options(
        "orders", {"URL": os.environ["JOBGUARD_TEST_REDIS_URL"], "STREAM": stream + ":{destination}:{key}"}
    )
    destination.send(_envelope(key="k1"))
    destination.close()
    client = redis.Redis.from_url(os.environ["JOBGUARD_TEST_REDIS_URL"])
    try:
        assert client.xlen(f"{stream}:orders:k1") == 1
    finally:
        client.delete(f"{stream}:orders:k1")
        client.close()


@pytest.mark.redis
def test_a_key_of_another_type_is_a_permanent_failure(stream: str) -> None:
    import redis

    client = redis.Redis.from_url(os.environ["JOBGUARD_TEST_REDIS_URL"])
    client.set(stream, "not a stream")
    client.close()
    destination = RedisStreamDestination.from_options(
        "orders", {"URL": os.environ["JOBGUARD_TEST_REDIS_URL"], "STREAM": stream}
    )
    with pytest.raises(PermanentDeliveryError, match="WRONGTYPE"):
        destination.send(_envelope())
    destination.close()


def test_an_unreachable_redis_is_a_transient_failure_without_the_password() -> None:
    destination = RedisStreamDestination.from_options(
        "orders", {"URL": "redis://user:s3cret@127.0.0.1:1/0", "TIMEOUT": 1}
    )
    with pytest.raises(TransientDeliveryError) as caught:
        destination.send(_envelope())
    destination.close()
    assert "s3cret" not in str(caught.value)
    assert "127.0.0.1:1" in str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"\['URL'\] is required"),
        ({"URL": "http://x"}, r"\['URL'\] must be a redis://"),
        ({"URL": "redis://x", "MAXLEN": 0}, r"\['MAXLEN'\] must be an integer of at least 1"),
        ({"URL": "redis://x", "STREAM": "s:{tenant}"}, r"\['STREAM'\] .*tenant"),
        ({"URL": "redis://x", "TIMEOUT": -1}, r"\['TIMEOUT'\] must be a number of seconds above zero"),
        ({"URL_ENV": "JOBGUARD_TEST_NO_SUCH_VARIABLE"}, r"\['URL_ENV'\] names the environment variable"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisStreamDestination.from_options("orders", options)
