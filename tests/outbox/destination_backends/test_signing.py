"""Webhook signatures: django_jobguard.outbox.signing against the Standard Webhooks reference library."""

from __future__ import annotations

import base64
import datetime
import json
import time

import pytest
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.test import RequestFactory
from standardwebhooks import Webhook, WebhookVerificationError

from django_jobguard.outbox import signing

OLD = signing.generate_secret()
NEW = signing.generate_secret()
BODY = json.dumps({"order": 42, "note": "café"}, ensure_ascii=False).encode()


def test_a_signature_verifies_with_the_reference_library_and_with_verify() -> None:
    headers = signing.signature_headers([OLD], "msg_1", BODY)
    assert Webhook(OLD).verify(BODY, headers) == {"order": 42, "note": "café"}
    assert signing.verify([OLD], headers, BODY) == "msg_1"


def test_the_reference_librarys_signature_verifies_with_verify() -> None:
    now = int(time.time())
    signature = Webhook(NEW).sign("msg_2", datetime.datetime.fromtimestamp(now, tz=datetime.UTC), BODY)
    headers = {"Webhook-Id": "msg_2", "Webhook-Timestamp": str(now), "Webhook-Signature": signature}
    assert signing.verify(NEW, headers, BODY) == "msg_2"


def test_two_secrets_sign_twice_and_a_receiver_knowing_either_accepts() -> None:
    headers = signing.signature_headers([OLD, NEW], "msg_3", BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for known in (OLD, NEW):
        Webhook(known).verify(BODY, headers)
        assert signing.verify([known], headers, BODY) == "msg_3"
    other = signing.generate_secret()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(BODY, headers)
    with pytest.raises(signing.SignatureError, match="no v1 signature matches"):
        signing.verify([other], headers, BODY)


def test_a_receiver_accepting_both_secrets_takes_a_request_signed_with_one() -> None:
    headers = signing.signature_headers([NEW], "msg_4", BODY)
    assert signing.verify([OLD, NEW], headers, BODY) == "msg_4"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h, b: (h, b + b" "), "no v1 signature matches"),
        (lambda h, b: ({**h, "webhook-id": "msg_other"}, b), "no v1 signature matches"),
        (lambda h, b: ({**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) + 1)}, b), "no v1"),
        (lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b), "missing header"),
        (lambda h, b: ({**h, "webhook-timestamp": "12.5"}, b), "not Unix seconds"),
        (lambda h, b: ({**h, "webhook-signature": "v1a,AAAA"}, b), "no v1 signature matches"),
    ],
    ids=["body", "id", "timestamp", "no-signature", "float-timestamp", "other-version"],
)
def test_an_altered_request_is_refused_by_both(change, reason) -> None:
    headers, body = change(signing.signature_headers([OLD], "msg_5", BODY), BODY)
    with pytest.raises(signing.SignatureError, match=reason):
        signing.verify([OLD], headers, body)
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(body, headers)


def test_timestamps_outside_the_tolerance_are_refused() -> None:
    now = time.time()
    old = signing.signature_headers([OLD], "msg_6", BODY, timestamp=int(now) - 400)
    with pytest.raises(signing.SignatureError, match=r"s old \(tolerance 300 s\)"):
        signing.verify([OLD], old, BODY, now=now)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(OLD).verify(BODY, old)
    assert signing.verify([OLD], old, BODY, now=now, tolerance=600) == "msg_6"
    future = signing.signature_headers([OLD], "msg_7", BODY, timestamp=int(now) + 400)
    with pytest.raises(signing.SignatureError, match="in the future"):
        signing.verify([OLD], future, BODY, now=now)


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("c2VjcmV0", "must be a string 'whsec_<base64>'"),
        ("whsec_not base64!", "standard base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "at least 24 bytes, this one holds 5"),
    ],
)
def test_bad_secrets_are_refused_saying_why(secret: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        signing.sign([secret], "msg", 1, b"{}")


def test_no_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one webhook secret"):
        signing.sign([], "msg", 1, b"{}")


def receive_order(request: HttpRequest) -> HttpResponse:
    """The view the reference page shows."""
    try:
        message_id = signing.verify([OLD], request.headers, request.body)
    except signing.SignatureError as exc:
        return HttpResponseBadRequest(str(exc))
    return HttpResponse(message_id)


def test_a_django_view_verifies_request_headers_and_body() -> None:
    factory = RequestFactory()
    signed = signing.signature_headers([NEW, OLD], "msg_8", BODY)
    meta = {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in signed.items()}
    request = factory.post("/hooks/orders", data=BODY, content_type="application/json", **meta)
    response = receive_order(request)
    assert (response.status_code, response.content) == (200, b"msg_8")
    tampered = factory.post("/hooks/orders", data=BODY + b" ", content_type="application/json", **meta)
    response = receive_order(tampered)
    assert response.status_code == 400
    assert b"no v1 signature matches" in response.content
