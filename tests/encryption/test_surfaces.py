"""The console and the REST API show encrypted payloads in clear to users with ``view_payload``,
and to nobody else: a user without it does not even make the server decrypt them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_jobguard import encryption, signals
from django_jobguard.encryption import TOKEN_PREFIX, is_encrypted
from django_jobguard.models import DeadLetter, Job
from django_jobguard.monitoring.sentry import NOT_SENT, dead_letter_event
from tests.api.support import BASE, as_user
from tests.encryption.support import NEW_KEY, drain, keys
from tests.support.factories import force_login
from tests.testapp import tasks_encrypted

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "PAN-4111-1111"


@pytest.fixture
def decryptions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The fields the server decrypts while the test runs (the real cipher, counted)."""
    opened: list[str] = []
    real = encryption._decrypt

    def counted(token: str, field: str) -> bytes:
        opened.append(field)
        return real(token, field)

    monkeypatch.setattr(encryption, "_decrypt", counted)
    yield opened


@pytest.fixture
def settled() -> tuple[Job, DeadLetter]:
    """A retried, succeeded job and a dead letter, both of an encrypting task, holding CARD."""
    done = tasks_encrypted.stash.enqueue(CARD, mode="retry_once")
    dead = tasks_encrypted.stash.enqueue(f"{CARD}-dead", mode="fail")
    drain()
    done.refresh_from_db()
    return done, DeadLetter.objects.get(job=dead)


def page(client: Client, view: str, pk: int) -> str:
    response = client.get(reverse(f"admin:jobguard_{view}_change", args=[pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_console_shows_payloads_in_clear_only_to_a_user_with_view_payload(settled, decryptions):
    job, letter = settled
    reader = Client()
    force_login(reader, "reader", "view_job", "view_deadletter", "view_payload")
    shown = page(reader, "job", job.pk)
    for text in (f"&quot;{CARD}&quot;", f"working on {CARD}", f"the first attempt of {CARD} failed"):
        assert text in shown
    assert "jg1:" not in shown
    letter_page = page(reader, "deadletter", letter.pk)
    assert f"cannot take {CARD}-dead" in letter_page and "jg1:" not in letter_page
    assert decryptions

    decryptions.clear()
    outsider = Client()
    force_login(outsider, "outsider", "view_job", "view_deadletter")
    for hidden in (page(outsider, "job", job.pk), page(outsider, "deadletter", letter.pk)):
        assert CARD not in hidden
    assert decryptions == []  # nothing was decrypted for them


def test_the_console_says_which_key_is_missing_instead_of_failing(settled):
    job, _ = settled
    reader = Client()
    force_login(reader, "reader", "view_job", "view_payload")
    with keys(NEW_KEY):
        shown = page(reader, "job", job.pk)
    assert "encrypted under key &#x27;test1&#x27;, which is not configured here" in shown
    assert CARD not in shown


def test_the_api_shows_payloads_in_clear_only_to_a_user_with_view_payload(settled, decryptions):
    job, letter = settled
    reader, _ = as_user("reader", "view_job", "view_deadletter", "view_payload")
    data: Any = reader.get(f"{BASE}jobs/{job.pk}/").json()
    assert (data["args"], data["kwargs"]) == ([CARD], {"mode": "retry_once"})
    assert data["result"] == {"reference": CARD, "note": None}
    assert data["progress"]["message"] == f"working on {CARD}"
    dead: Any = reader.get(f"{BASE}dead-letters/{letter.pk}/").json()
    assert dead["args"] == [f"{CARD}-dead"]
    assert dead["error_message"] == f"cannot take {CARD}-dead"
    assert f"cannot take {CARD}-dead" in dead["traceback"]

    decryptions.clear()
    outsider, _ = as_user("outsider", "view_job", "view_deadletter")
    hidden = outsider.get(f"{BASE}jobs/{job.pk}/").json()
    assert "args" not in hidden and "result" not in hidden and "message" not in hidden["progress"]
    assert CARD not in str(hidden)
    assert CARD not in str(outsider.get(f"{BASE}dead-letters/{letter.pk}/").json())
    assert decryptions == []


def test_sentry_is_sent_neither_the_clear_values_nor_the_ciphertexts_of_an_encrypted_dead_letter(settled):
    _, letter = settled
    event = dead_letter_event(letter, send_payload=True)  # even when the payload is asked for
    (error,) = event["exception"]["values"]
    context = event["contexts"]["jobguard"]
    assert (error["value"], context["traceback"], context["payload"]) == (NOT_SENT, NOT_SENT, NOT_SENT)
    assert error["type"] == "PermanentError" and event["tags"]["jobguard.task"] == tasks_encrypted.stash.name
    assert CARD not in json.dumps(event) and TOKEN_PREFIX not in json.dumps(event)

    plain = tasks_encrypted.stash_plain.enqueue(f"{CARD}-plain", mode="fail")
    drain()
    shown = dead_letter_event(DeadLetter.objects.get(job=plain), send_payload=True)
    assert shown["exception"]["values"][0]["value"] == f"cannot take {CARD}-plain"  # the control
    assert f"{CARD}-plain" in shown["contexts"]["jobguard"]["payload"]


def test_a_job_dead_lettered_receiver_gets_the_stored_letter_and_reads_it_in_clear_through_it():
    received: list[DeadLetter] = []

    def receiver(sender: Any, dead_letter: DeadLetter, **kwargs: Any) -> None:
        received.append(dead_letter)

    signals.job_dead_lettered.connect(receiver, dispatch_uid="test-encrypted-letter")
    try:
        tasks_encrypted.stash.enqueue(f"{CARD}-signal", mode="fail")
        drain()
    finally:
        signals.job_dead_lettered.disconnect(dispatch_uid="test-encrypted-letter")
    (letter,) = received
    # The fields are what is stored (a receiver that saves the letter writes no clear value) ...
    assert all(is_encrypted(value) for value in (letter.args, letter.kwargs, letter.error_message))
    assert CARD not in str([letter.args, letter.kwargs, letter.error_message, letter.traceback])
    # ... and the clear values are one property away, in a process that has the key.
    assert letter.payload == {"args": [f"{CARD}-signal"], "kwargs": {"mode": "fail"}}
    message, traceback = letter.clear_error
    assert message == f"cannot take {CARD}-signal" and message in traceback
    with keys(NEW_KEY), pytest.raises(encryption.DecryptionError, match="key 'test1'"):
        letter.payload  # noqa: B018 - a property that raises
