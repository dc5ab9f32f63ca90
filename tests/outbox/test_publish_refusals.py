"""Bad input refused at publish(), before anything is written: what no destination could carry,
and what the message's own destination would refuse whatever its payload (a NATS subject the key
makes invalid, an AMQP routing key over 255 bytes, a header the destination writes itself)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_jobguard.exceptions import InvalidPublishError
from django_jobguard.models import OutboxKey, OutboxMessage
from django_jobguard.outbox import publish
from django_jobguard.outbox.signing import generate_secret

pytestmark = pytest.mark.django_db(transaction=True)

DESTINATIONS = {
    # None of these connects before its first send: publish() builds them only to ask.
    "subjects": {"BACKEND": "nats", "SERVERS": "nats://127.0.0.1:1", "SUBJECT": "orders.{key}"},
    "amqp": {"BACKEND": "rabbitmq", "URL": "amqp://guest:guest@127.0.0.1:1/%2F", "ROUTING_KEY": "o.{key}"},
    "hook": {"BACKEND": "webhook", "URL": "http://127.0.0.1:1/hook", "SECRETS": [generate_secret()]},
    "stream": {"BACKEND": "redis", "URL": "redis://127.0.0.1:1/0", "STREAM": "s:{key}"},
    "custom": {"BACKEND": "tests.outbox.destinations.FileDestination", "PATH": "/dev/null"},
}


@pytest.fixture
def destinations(settings: Any) -> Iterator[None]:
    with override_settings(JOBGUARD={**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": DESTINATIONS}}):
        yield


def _nothing_written() -> bool:
    return not OutboxMessage.objects.exists() and not OutboxKey.objects.exists()


@pytest.mark.parametrize(
    ("destination", "kwargs", "message"),
    [
        # NATS: whitespace, an empty token, a wildcard in the subject the key makes.
        (
            "subjects",
            {"key": "order 7"},
            r"makes the NATS subject 'orders.order 7', which contains whitespace",
        ),
        ("subjects", {"key": "order..7"}, r"which has an empty token"),
        ("subjects", {"key": "order."}, r"which has an empty token"),
        ("subjects", {"key": "order.*"}, r"which contains a wildcard"),
        ("subjects", {"key": "tenant.>"}, r"which contains a wildcard"),
        ("subjects", {"key": "k", "headers": {"Nats-Rollup": "all"}}, r"NATS reads Nats-\* headers"),
        ("subjects", {"key": "k", "headers": {"nats-expected-stream": "X"}}, r"NATS reads Nats-\* headers"),
        # AMQP: a routing key is a short string of at most 255 bytes; keys are counted in characters.
        ("amqp", {"key": "\u00e9" * 150}, r"routing key of 302 bytes as UTF-8, over AMQP's 255"),
        # Headers a destination writes after the publisher's would be lost.
        (
            "hook",
            {"headers": {"Webhook-Signature": "v1,forged"}},
            r"written by the webhook destination itself",
        ),
        ("hook", {"headers": {"content-type": "text/plain"}}, r"written by the webhook destination itself"),
        ("stream", {"headers": {"payload": "x"}}, r"header 'payload' is one of the fields the stream entry"),
        ("stream", {"headers": {"id": "x"}}, r"header 'id' is one of the fields"),
    ],
)
def test_what_the_destination_would_refuse_is_refused_at_publish(
    destinations: None, destination: str, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidPublishError) as caught:
        publish(destination, {"n": 1}, **kwargs)
    text = str(caught.value)
    assert text.startswith(f"destination {destination!r} would refuse this message: "), text
    assert re.search(message, text), text
    assert _nothing_written()


def test_what_each_destination_carries_is_published(destinations: None) -> None:
    published = [
        publish("subjects", {}, key="order:7"),  # ':' and '-' are fine in a subject token
        publish("subjects", {}, key="tenant.acme.order-7", headers={"tenant": "acme"}),
        publish("subjects", {}),  # no key: its own id, a valid token
        publish("amqp", {}, key="\u00e9" * 124),  # 250 bytes + "o."
        publish("hook", {}, key="k", headers={"X-Tenant": "acme", "webhook-tenant": "a"}),
        publish("stream", {}, key="k", headers={"ids": "1", "Payload": "x"}),
        publish("custom", {}, key="any key at all", headers={"Nats-Anything": "v"}),  # no check declared
    ]
    assert OutboxMessage.objects.count() == len(published)


def test_a_destination_that_cannot_be_built_here_is_left_to_the_system_check(settings: Any) -> None:
    broken = {"bad": {"BACKEND": "nats", "SERVERS": "http://nope", "SUBJECT": "o.{key}"}}
    with override_settings(JOBGUARD={**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": broken}}):
        publish("bad", {}, key="a b")  # jobguard.E060 reports the destination at startup
    assert OutboxMessage.objects.count() == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"payload": b"bytes"}, "payload"),
        ({"payload": {1: "non-string key"}}, "payload"),
        ({"payload": {"s": {1, 2}}}, "payload"),
        ({"payload": "lone \ud800 surrogate"}, "payload"),
        ({"payload": {}, "key": "zero\u200bwidth"}, "control character"),
        ({"payload": {}, "key": "lone \ud800"}, "control character"),
        ({"payload": {}, "key": 7}, "non-empty string"),
        ({"payload": {}, "headers": {"Jobguard-Key": "x"}}, "'Jobguard-Key' is written by jobguard"),
        ({"payload": {}, "headers": {"jobguard-seq": "1"}}, "'jobguard-seq' is written by jobguard"),
        (
            {"payload": {}, "headers": {"Tenant": "a", "tenant": "b"}},
            "'Tenant' and 'tenant' differ only in case",
        ),
        ({"payload": {}, "headers": {"h" * 129: "v"}}, "HTTP token of 1 to 128 characters"),
        ({"payload": {}, "headers": ["h", "v"]}, "headers must be a dict"),
    ],
)
def test_bad_payloads_keys_and_headers_are_refused_with_nothing_written(
    outbox: Path, kwargs: dict[str, Any], message: str
) -> None:
    payload = kwargs.pop("payload")
    with pytest.raises(InvalidPublishError, match=message):
        publish("events", payload, **kwargs)
    assert _nothing_written()
