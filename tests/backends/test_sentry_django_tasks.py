"""Sentry's Django integration and jobguard's tracing, both on: one span of each per enqueue.

Sentry's ``DjangoIntegration`` wraps ``django.tasks``' ``Task.enqueue`` in a
``queue.submit.django`` span (Django 6.0+; it leaves the 5.2 backport alone). jobguard's
``JobguardIntegration`` sends error events only, and its producer span is OpenTelemetry's: an
enqueue through the Django Tasks backend must not become two Sentry spans.
"""

from __future__ import annotations

import json
from typing import Any

import django
import pytest
from django.conf import settings
from django.test import override_settings

if django.VERSION < (6,) or getattr(settings, "TASKS_ROOT", None) != "django.tasks":
    pytest.skip(
        "Sentry's Django integration wraps django.tasks only, which Django 6.0+ ships",
        allow_module_level=True,
    )
sentry_sdk = pytest.importorskip("sentry_sdk", reason="needs sentry-sdk (the [sentry] extra)")
pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk")

from sentry_sdk.integrations.django import DjangoIntegration  # noqa: E402
from sentry_sdk.transport import Transport  # noqa: E402

from django_jobguard.models import Job  # noqa: E402
from django_jobguard.monitoring.sentry import JobguardIntegration  # noqa: E402
from tests.support.otel import by_name, memory_exporter  # noqa: E402
from tests.testapp import tasks_django  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


class _Transactions(Transport):
    kept: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        for item in envelope.items:
            if item.type == "transaction":
                _Transactions.kept.append(json.loads(item.payload.get_bytes()))


def test_an_enqueue_is_one_sentry_span_and_one_opentelemetry_span():
    _Transactions.kept = []
    sentry_sdk.init(
        dsn="https://public@sentry.invalid/1",
        transport=_Transactions,
        default_integrations=False,
        integrations=[DjangoIntegration(), JobguardIntegration()],
        traces_sample_rate=1.0,
    )
    exporter = memory_exporter()
    exporter.clear()
    try:
        with override_settings(JOBGUARD={**settings.JOBGUARD, "OPENTELEMETRY": True}):
            with sentry_sdk.start_transaction(name="POST /checkout", op="http.server"):
                result = tasks_django.add.enqueue(1, 2)
        sentry_sdk.flush()
    finally:
        sentry_sdk.init()  # no DSN: a client that sends nothing and has no integration
    assert Job.objects.filter(pk=int(result.id)).exists()
    (transaction,) = _Transactions.kept
    ops = [span["op"] for span in transaction["spans"]]
    # One queue span (Sentry's own); the others are its database and signal spans.
    assert [op for op in ops if op.startswith("queue.")] == ["queue.submit.django"], ops
    sends = by_name(list(exporter.get_finished_spans()), "send default")
    assert [dict(s.attributes or {})["jobguard.job.id"] for s in sends] == [int(result.id)]
