"""Traces across processes: a Django view enqueues, a real worker process runs, spans over OTLP/HTTP.

The test process runs the view (its spans go to the SDK's in-memory exporter); the worker
is a ``jobguard_worker`` subprocess whose tracer provider exports to a receiver this test
starts on loopback, which decodes the protobuf requests (tests/support/otel.py).
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path

from django_jobguard.models import DeadLetter, Job
from tests.conftest import wait_for
from tests.testapp import tasks_otel

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (the [otel] extra plus the SDK)")
pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http", reason="needs opentelemetry-exporter-otlp-proto-http"
)

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from tests.support.otel import ReceivedSpan, by_name, dump_spans, memory_exporter, otlp_receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.slow]

TRACED = {**settings.JOBGUARD, "OPENTELEMETRY": True}
#: Spans the worker's batch processor holds before it exports on its own: longer than any test.
HOLD_MS = 600_000


def checkout_view(request: HttpRequest, order_id: int) -> JsonResponse:
    """The request a trace starts in (the span opentelemetry-instrumentation-django would make)."""
    with trace.get_tracer("tests.view").start_as_current_span(
        f"POST /checkout/{order_id}", kind=SpanKind.SERVER
    ):
        charge = tasks_otel.checkout.enqueue(order_id=order_id, card="4242", failures=1)
        refund = tasks_otel.refund.enqueue(order_id=order_id)
    return JsonResponse({"charge": charge.pk, "refund": refund.pk})


urlpatterns = [path("checkout/<int:order_id>/", checkout_view)]


def _worker_spans(received: list[ReceivedSpan], job_id: int) -> list[ReceivedSpan]:
    found = [
        s for s in received if s.name == "process otel" and s.attributes.get("jobguard.job.id") == job_id
    ]
    return sorted(found, key=lambda s: s.attributes["jobguard.attempt"])


def _drain(workers: Any, endpoint: str, jobs: list[int], finals: set[str], **env: str) -> None:
    """Burst workers until every job is final (retries come due within a second here)."""

    def settled() -> bool:
        done = workers.burst("--queue", "otel", env={"JOBGUARD_TEST_OTLP_ENDPOINT": endpoint, **env})
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        return set(Job.objects.filter(pk__in=jobs).values_list("status", flat=True)) <= finals

    wait_for(settled, timeout=180, interval=0.2, message="the jobs to succeed or be dead-lettered")


@override_settings(ROOT_URLCONF=__name__, JOBGUARD=TRACED)
def test_a_trace_started_in_a_view_is_linked_from_the_worker_process_with_its_retry_and_dead_letter(workers):
    exporter = memory_exporter()
    exporter.clear()
    with otlp_receiver() as receiver:
        response = Client().post("/checkout/21/")
        assert response.status_code == 200
        charge, refund = response.json()["charge"], response.json()["refund"]
        _drain(workers, receiver.endpoint, [charge, refund], {"succeeded", "dead"})
        received = receiver.snapshot()
    (view,) = [s for s in exporter.get_finished_spans() if s.name == "POST /checkout/21"]
    sends = {s.attributes["jobguard.job.id"]: s for s in by_name(exporter.get_finished_spans(), "send otel")}
    if os.environ.get("JOBGUARD_TEST_TRACE_DUMP"):  # the docs' picture: docs/_ext/trace_waterfall.py
        dump_spans(os.environ["JOBGUARD_TEST_TRACE_DUMP"], [view, *sends.values()], received)
    assert {s.service for s in received} == {"jobguard-worker"}
    first, second = _worker_spans(received, charge)
    assert (first.attributes["jobguard.outcome"], second.attributes["jobguard.outcome"]) == (
        "retry",
        "succeeded",
    )
    view_trace = trace.format_trace_id(view.context.trace_id)
    charge_send = trace.format_span_id(sends[charge].context.span_id)
    # Linked, not parented: each attempt's trace is its own; its first link is the view's enqueue.
    assert second.parent_id is None and second.trace_id != view_trace
    assert [(t, s, a["jobguard.link"]) for t, s, a in second.links] == [
        (view_trace, charge_send, "enqueue"),
        (first.trace_id, first.span_id, "earlier_attempt"),
    ]
    # The worker's span tree: the handler's span and the settle span under the attempt.
    children = {s.name for s in received if s.trace_id == second.trace_id and s.parent_id == second.span_id}
    assert children == {"charge card", "settle otel"}
    assert second.kind == 5  # SPAN_KIND_CONSUMER in OTLP's numbering
    # The dead letter: two attempts, the last one dead, and the letter keeps the context.
    attempts = _worker_spans(received, refund)
    assert [s.attributes["jobguard.outcome"] for s in attempts] == ["retry", "dead"]
    assert attempts[-1].status_code == 2  # STATUS_CODE_ERROR
    assert attempts[-1].links[0][:2] == (view_trace, trace.format_span_id(sends[refund].context.span_id))
    letter = DeadLetter.objects.get(job_id=refund)
    stored = [tuple(traceparent.split("-")[1:3]) for traceparent in letter.trace_context["attempts"]]
    assert stored == [(s.trace_id, s.span_id) for s in attempts]


@override_settings(ROOT_URLCONF=__name__, JOBGUARD=TRACED)
def test_as_a_child_the_worker_spans_continue_the_views_trace(workers):
    exporter = memory_exporter()
    exporter.clear()
    with otlp_receiver() as receiver:
        response = Client().post("/checkout/22/")
        charge, refund = response.json()["charge"], response.json()["refund"]
        _drain(
            workers, receiver.endpoint, [charge, refund], {"succeeded", "dead"}, JOBGUARD_TEST_OTEL_PARENT="1"
        )
        received = receiver.snapshot()
    (view,) = [s for s in exporter.get_finished_spans() if s.name == "POST /checkout/22"]
    sends = {s.attributes["jobguard.job.id"]: s for s in by_name(exporter.get_finished_spans(), "send otel")}
    view_trace = trace.format_trace_id(view.context.trace_id)
    for job_id in (charge, refund):
        for attempt in _worker_spans(received, job_id):
            assert attempt.trace_id == view_trace
            assert attempt.parent_id == trace.format_span_id(sends[job_id].context.span_id)
    # One tree: every worker span of these jobs is in the view's trace.
    assert {s.trace_id for s in received} == {view_trace}


def _succeeded_spans(received: list[ReceivedSpan]) -> Counter[int]:
    return Counter(
        s.attributes["jobguard.job.id"]
        for s in received
        if s.name == "process otel-bulk" and s.attributes.get("jobguard.outcome") == "succeeded"
    )


@override_settings(JOBGUARD=TRACED)
def test_no_span_is_lost_when_a_worker_is_stopped_with_sigterm(workers):
    jobs = [job.pk for job in tasks_otel.noop.bulk_enqueue([((n,), {}) for n in range(1000)])]
    env = {"JOBGUARD_TEST_OTLP_DELAY_MS": str(HOLD_MS)}
    with otlp_receiver() as receiver:
        env["JOBGUARD_TEST_OTLP_ENDPOINT"] = receiver.endpoint
        proc = workers.start("--queue", "otel-bulk", "--concurrency", "4", env=env)
        wait_for(
            lambda: Job.objects.filter(pk__in=jobs, status="succeeded").count() >= 100,
            timeout=120,
            message="the worker to finish a first hundred jobs",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, workers.log(proc)
        stopped_with = set(Job.objects.filter(pk__in=jobs, status="succeeded").values_list("pk", flat=True))
        assert 100 <= len(stopped_with) < 1000, "stop the worker before it drained the queue"
        received = receiver.snapshot()
        # The rest, by a burst worker (its exit flushes too).
        done = workers.burst("--queue", "otel-bulk", env=env)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        everything = receiver.snapshot()
    assert Job.objects.filter(pk__in=jobs, status="succeeded").count() == 1000
    # Every job the stopped worker acked has its span, once: 0 lost.
    assert _succeeded_spans(received) == Counter(stopped_with)
    assert _succeeded_spans(everything) == Counter(jobs)


@override_settings(JOBGUARD=TRACED)
def test_a_recycled_worker_flushes_its_spans_before_it_exits(workers):
    jobs = [job.pk for job in tasks_otel.noop.bulk_enqueue([((n,), {}) for n in range(300)])]
    env = {"JOBGUARD_TEST_OTLP_DELAY_MS": str(HOLD_MS)}
    with otlp_receiver() as receiver:
        env["JOBGUARD_TEST_OTLP_ENDPOINT"] = receiver.endpoint
        proc = workers.start("--queue", "otel-bulk", "--max-jobs", "120", env=env)
        assert proc.wait(timeout=120) == 0, workers.log(proc)
        received = receiver.snapshot()
    acked = set(Job.objects.filter(pk__in=jobs, status="succeeded").values_list("pk", flat=True))
    # At most 120 (see --max-jobs); the worker exits with its spans still held by the SDK.
    assert 0 < len(acked) <= 120, workers.log(proc)[-3000:]
    assert _succeeded_spans(received) == Counter(acked)
