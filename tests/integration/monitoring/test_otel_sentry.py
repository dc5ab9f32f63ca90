"""Sentry: a dead letter is reported once, with the job's tags; a retried failure is not reported.

sentry-sdk runs for real, with a transport that keeps the envelopes in this process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_jobguard.models import DeadLetter, Job
from tests.support.dlq import run_burst
from tests.testapp import tasks_otel

sentry_sdk = pytest.importorskip("sentry_sdk", reason="needs sentry-sdk (the [sentry] extra)")

from sentry_sdk.transport import Transport  # noqa: E402

from django_jobguard.monitoring.sentry import JobguardIntegration  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


class CapturingTransport(Transport):
    """Keeps every event Sentry would send."""

    events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        for item in envelope.items:
            if item.type == "event":
                CapturingTransport.events.append(json.loads(item.payload.get_bytes()))


def _init(**options: Any) -> list[dict[str, Any]]:
    CapturingTransport.events = []
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=CapturingTransport,
        default_integrations=False,
        integrations=[JobguardIntegration(**options)],
    )
    return CapturingTransport.events


@pytest.fixture
def sentry_events() -> Iterator[list[dict[str, Any]]]:
    yield _init()
    sentry_sdk.init()  # no DSN: a client that sends nothing and has no integration


def _events_of(events: list[dict[str, Any]], job_id: int) -> list[dict[str, Any]]:
    return [event for event in events if event["tags"].get("jobguard.job_id") == str(job_id)]


def test_transient_failures_are_not_reported_and_the_dead_letter_is_reported_once(sentry_events):
    refund = tasks_otel.refund.enqueue(order_id=31)  # fails twice: a retry, then dead
    checkout = tasks_otel.checkout.enqueue(order_id=32, card="x", failures=1)  # a retry, then succeeds
    assert run_burst() == 0
    assert Job.objects.get(pk=refund.pk).status == "queued"  # one transient failure so far
    assert sentry_events == []
    while {Job.objects.get(pk=refund.pk).status, Job.objects.get(pk=checkout.pk).status} != {
        "dead",
        "succeeded",
    }:
        assert run_burst() == 0
    run_burst()  # nothing more is due: no second report of the same letter
    (event,) = sentry_events
    assert _events_of(sentry_events, checkout.pk) == []
    letter = DeadLetter.objects.get(job=refund)
    assert event["level"] == "error"
    assert event["tags"] == {
        "jobguard.task": tasks_otel.refund.name,
        "jobguard.queue": "otel",
        "jobguard.attempt": "2",
        "jobguard.job_id": str(refund.pk),
        "jobguard.dead_letter_reason": "retries_exhausted",
    }
    (exception,) = event["exception"]["values"]
    assert (exception["module"], exception["type"]) == ("django_jobguard.exceptions", "TransientError")
    assert exception["value"] == "order 31: refund provider down (attempt 2)"
    context = event["contexts"]["jobguard"]
    assert context["dead_letter_id"] == letter.pk
    assert "raise TransientError" in context["traceback"]
    assert "payload" not in context


def test_a_permanent_failure_is_reported_on_its_first_attempt(sentry_events):
    job = tasks_otel.declined.enqueue(order_id=33)
    assert run_burst() == 0
    (event,) = _events_of(sentry_events, job.pk)
    assert event["tags"]["jobguard.attempt"] == "1"
    assert event["tags"]["jobguard.dead_letter_reason"] == "permanent_error"
    assert event["exception"]["values"][0]["value"] == "order 33: card declined"


def test_the_payload_is_sent_only_when_allowed_and_redacted_even_then():
    try:
        events = _init(send_payload=True)
        with override_settings(JOBGUARD={**settings.JOBGUARD, "REDACT": ["card"]}):
            job = tasks_otel.checkout.enqueue(order_id=34, card="4242-4242", failures=5)
            while Job.objects.get(pk=job.pk).status != "dead":
                assert run_burst() == 0
        (event,) = _events_of(events, job.pk)
        payload = json.loads(event["contexts"]["jobguard"]["payload"])
        assert payload == {"args": [], "kwargs": {"order_id": 34, "card": "[redacted]", "failures": 5}}
        assert "4242-4242" not in json.dumps(event)
    finally:
        sentry_sdk.init()


def test_without_the_integration_nothing_is_reported(sentry_events):
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1", transport=CapturingTransport, default_integrations=False
    )
    CapturingTransport.events = []
    job = tasks_otel.declined.enqueue(order_id=35)
    assert run_burst() == 0
    assert DeadLetter.objects.filter(job=job).exists()
    assert CapturingTransport.events == []
