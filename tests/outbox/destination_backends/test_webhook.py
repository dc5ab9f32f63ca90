"""The webhook destination against a real HTTP server on loopback, its signatures checked twice."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse

import pytest
from standardwebhooks import Webhook

from django_jobguard.outbox import signing
from django_jobguard.outbox.destinations.base import PermanentDeliveryError, TransientDeliveryError
from django_jobguard.outbox.destinations.webhook import WebhookDestination
from tests.outbox.destination_backends.conftest import Receiver, closed_port, envelope

pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[outbox]'")

OLD = signing.generate_secret()
NEW = signing.generate_secret()


def webhook(url: str, **options: object) -> WebhookDestination:
    return WebhookDestination.from_options("orders-hook", {"URL": url, "SECRETS": [OLD], **options})


@pytest.fixture
def closing() -> list[WebhookDestination]:
    made: list[WebhookDestination] = []
    yield made
    for destination in made:
        destination.close()


def test_a_message_is_posted_signed_with_its_headers(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url, HEADERS={"Authorization": "Bearer abc"})
    closing.append(destination)
    message = envelope(key="tenant/7 café", seq=3, headers={"traceparent": "00-abc-def-01"}, attempt=2)
    before = int(time.time())
    destination.send(message)

    [request] = receiver.requests
    assert request.path == "/hooks/orders"
    assert json.loads(request.body) == message.payload
    headers = request.headers
    assert headers["content-type"] == "application/json"
    assert headers["webhook-id"] == message.id
    assert before <= int(headers["webhook-timestamp"]) <= time.time()
    assert headers["authorization"] == "Bearer abc"
    assert headers["traceparent"] == "00-abc-def-01"
    assert urllib.parse.unquote(headers["jobguard-key"]) == "tenant/7 café"
    assert headers["jobguard-key"].startswith("tenant/7%20caf")
    assert (headers["jobguard-seq"], headers["jobguard-attempt"]) == ("3", "2")
    assert headers["jobguard-destination"] == "events"
    # The receiver's two checks: ours and the specification's reference library.
    assert signing.verify([OLD], headers, request.body) == message.id
    assert Webhook(OLD).verify(request.body, headers) == message.payload


def test_a_redelivery_keeps_the_id_and_signs_again(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    message = envelope()
    destination.send(message)
    destination.send(message)
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == message.id
    for request in (first, second):
        Webhook(OLD).verify(request.body, request.headers)


def test_rotation_signs_with_both_and_either_receiver_accepts(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url, SECRETS=[OLD, NEW])
    closing.append(destination)
    message = envelope()
    destination.send(message)
    [request] = receiver.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for known in (OLD, NEW):
        assert signing.verify([known], request.headers, request.body) == message.id
        assert Webhook(known).verify(request.body, request.headers) == message.payload
    with pytest.raises(signing.SignatureError):
        signing.verify([signing.generate_secret()], request.headers, request.body)


def test_secrets_can_come_from_the_environment(receiver: Receiver, closing, monkeypatch) -> None:
    monkeypatch.setenv("ORDERS_WEBHOOK_SECRETS", f"{NEW}, {OLD}")
    destination = WebhookDestination.from_options(
        "orders-hook", {"URL": receiver.url, "SECRETS_ENV": "ORDERS_WEBHOOK_SECRETS"}
    )
    closing.append(destination)
    assert destination.secrets == (NEW, OLD)
    destination.send(envelope())
    Webhook(NEW).verify(receiver.requests[0].body, receiver.requests[0].headers)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410, 413, 422])
def test_a_4xx_is_permanent_naming_the_status_and_the_body(receiver: Receiver, closing, status: int) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    receiver.answer(status, b"order   42\nunknown " + b"x" * 500)
    with pytest.raises(PermanentDeliveryError) as caught:
        destination.send(envelope())
    text = str(caught.value)
    assert f"answered {status}: order 42 unknown xxx" in text
    assert text.endswith("x" * 20)
    assert len(text.partition(f"answered {status}: ")[2]) == 200


def test_a_redirect_is_permanent_and_not_followed(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    receiver.answer(308)
    with pytest.raises(PermanentDeliveryError, match=r"answered 308 \(a redirect to 'https://elsewhere"):
        destination.send(envelope())
    assert len(receiver.requests) == 1


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_408_429_and_5xx_are_transient(receiver: Receiver, closing, status: int) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    receiver.answer(status, b"try later")
    with pytest.raises(TransientDeliveryError, match=f"answered {status}: try later"):
        destination.send(envelope())
    # The next answer is a 2xx: the same destination delivers.
    destination.send(envelope())
    assert len(receiver.requests) == 2


def test_429_reports_retry_after(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    receiver.answer(429)
    with pytest.raises(TransientDeliveryError, match=r"answered 429 \(Retry-After: 30\)") as caught:
        destination.send(envelope())
    assert caught.value.retry_after == 30.0  # the relay's wait instead of its own backoff


def test_a_timeout_is_transient(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url, TIMEOUT=0.5)
    closing.append(destination)
    receiver.answer(200, b"", delay=30)
    started = time.monotonic()
    with pytest.raises(
        TransientDeliveryError, match=r"no answer from http://127.0.0.1:\d+/hooks/orders within 0.5 s"
    ):
        destination.send(envelope())
    assert time.monotonic() - started < 20  # not the receiver's 30 s: the timeout cut it short


def test_a_refused_connection_is_transient(closing) -> None:
    destination = webhook(f"http://127.0.0.1:{closed_port()}/hook", TIMEOUT=2)
    closing.append(destination)
    with pytest.raises(TransientDeliveryError, match=r"cannot reach http://127\.0\.0\.1:\d+/hook: Connect"):
        destination.send(envelope())


def test_connections_are_reused_and_close_releases_them(receiver: Receiver) -> None:
    destination = webhook(receiver.url)
    for seq in range(1, 4):
        destination.send(envelope(seq=seq))
    ports = {request.client_port for request in receiver.requests}
    assert len(receiver.requests) == 3
    assert len(ports) == 1, f"three requests over {len(ports)} connections"
    destination.close()
    destination.send(envelope(seq=4))  # a new client, a new connection
    assert receiver.requests[-1].client_port not in ports
    destination.close()


def test_sends_from_several_threads_share_the_destination(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    errors: list[BaseException] = []

    def deliver(thread: int) -> None:
        try:
            for seq in range(10):
                destination.send(envelope(key=f"k{thread}", seq=seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(receiver.requests) == 40
    for request in receiver.requests:
        signing.verify([OLD], request.headers, request.body)


def test_a_publisher_header_that_http_cannot_carry_is_permanent(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    with pytest.raises(PermanentDeliveryError, match="header 'x-note' has a value that is not printable"):
        destination.send(envelope(headers={"x-note": "line\nbreak"}))
    assert receiver.requests == []


def test_a_publisher_header_replaces_a_static_one_of_any_case(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url, HEADERS={"X-Tenant": "static", "Authorization": "Bearer abc"})
    closing.append(destination)
    destination.send(envelope(headers={"x-tenant": "acme"}))
    [request] = receiver.requests
    assert request.headers["x-tenant"] == "acme"
    assert request.headers["authorization"] == "Bearer abc"
    assert request.raw_headers.count("x-tenant") == 1


def test_a_publisher_header_cannot_replace_the_signature(receiver: Receiver, closing) -> None:
    destination = webhook(receiver.url)
    closing.append(destination)
    message = envelope(headers={"webhook-signature": "v1,forged", "webhook-id": "other"})
    destination.send(message)
    [request] = receiver.requests
    assert request.headers["webhook-id"] == message.id
    assert signing.verify([OLD], request.headers, request.body) == message.id


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"URL": "ftp://example.com/x"}, r"\['URL'\] must be an http:// or https:// URL with a host"),
        ({"URL": "https:///path"}, r"\['URL'\] must be an http:// or https:// URL with a host"),
        ({"URL": "http://example.com:99999/"}, r"\['URL'\] has an invalid port"),
        ({"SECRETS": None}, r"\['SECRETS'\] is required \(or .*\['SECRETS_ENV'\]"),
        ({"SECRETS": []}, r"\['SECRETS'\] must not be empty"),
        ({"SECRETS": "whsec_x"}, r"\['SECRETS'\] must be a list of strings, not str"),
        ({"SECRETS": ["secret"]}, r"\['SECRETS'\]: secret 0: a webhook secret must be a string 'whsec_"),
        ({"SECRETS": [OLD, "whsec_AAAA"]}, r"\['SECRETS'\]: secret 1: .*at least 24 bytes"),
        ({"SECRETS": None, "SECRETS_ENV": "JOBGUARD_TEST_UNSET_VARIABLE"}, r"which is unset or empty"),
        ({"TIMEOUT": 0}, r"\['TIMEOUT'\] must be a number of seconds above zero, not 0"),
        ({"TIMEOUT": "10"}, r"\['TIMEOUT'\] must be a number of seconds, not str"),
        ({"HEADERS": {"Bad Name": "x"}}, r"\['HEADERS'\] header name 'Bad Name' is not an HTTP token"),
        ({"HEADERS": {"webhook-id": "x"}}, r"\['HEADERS'\] may not set 'webhook-id'"),
        ({"SECRET": [OLD]}, r"\]: unknown option 'SECRET' \(this backend takes HEADERS, SECRETS"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, object], message: str) -> None:
    full = {"URL": "https://hooks.example.com/orders", "SECRETS": [OLD], **options}
    prefix = r"^JOBGUARD\['OUTBOX'\]\['DESTINATIONS'\]\['orders-hook'\]"
    with pytest.raises(ValueError, match=prefix) as caught:
        WebhookDestination.from_options("orders-hook", {k: v for k, v in full.items() if v is not None})
    assert caught.match(message)


def test_errors_never_show_the_urls_query_or_password(closing) -> None:
    destination = webhook(f"http://user:pw@127.0.0.1:{closed_port()}/hook?token=s3cret", TIMEOUT=2)
    closing.append(destination)
    with pytest.raises(TransientDeliveryError) as caught:
        destination.send(envelope())
    assert "s3cret" not in str(caught.value)
    assert "pw" not in str(caught.value)
    assert "s3cret" not in repr(destination)


def test_retry_after_is_read_as_seconds_or_an_http_date_and_capped() -> None:
    import datetime
    import email.utils

    from django_jobguard.outbox.destinations import webhook as module

    assert module._retry_after_seconds("120") == 120.0
    assert module._retry_after_seconds("999999") == module.MAX_RETRY_AFTER_SECONDS
    soon = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=90)
    assert 80 <= module._retry_after_seconds(email.utils.format_datetime(soon, usegmt=True)) <= 90
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    assert module._retry_after_seconds(email.utils.format_datetime(past, usegmt=True)) == 0.0
    assert module._retry_after_seconds("soon") is None
    assert module._retry_after_seconds(None) is None
