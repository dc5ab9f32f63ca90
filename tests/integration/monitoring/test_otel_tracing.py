"""Traces across the queue, in one process: the SDK's in-memory exporter sees every span.

The worker runs here (a burst); tests/processes/test_otel_processes.py runs it in another
process and reads its spans over OTLP/HTTP.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_jobguard import Batch, chain, events
from django_jobguard.dlq import replay
from django_jobguard.models import DeadLetter, Job, JobStatus
from django_jobguard.worker.held import LOGGER_NAME
from tests.conftest import ROOT
from tests.support.dlq import run_burst
from tests.support.factories import make_user
from tests.testapp import tasks_otel

pytest.importorskip("opentelemetry.sdk", reason="needs opentelemetry-sdk (the [otel] extra plus the SDK)")

from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.otel import by_name, memory_exporter

pytestmark = pytest.mark.django_db(transaction=True)

TRACED = {**settings.JOBGUARD, "OPENTELEMETRY": True}


@pytest.fixture
def spans() -> Iterator[Any]:
    exporter = memory_exporter()
    exporter.clear()
    with override_settings(JOBGUARD=TRACED):
        yield exporter
    exporter.clear()


def _view_span(name: str = "GET /checkout") -> Any:
    return trace.get_tracer("tests.view").start_as_current_span(name, kind=SpanKind.SERVER)


def _finished(exporter: Any) -> list[ReadableSpan]:
    return list(exporter.get_finished_spans())


def _of_job(spans: list[ReadableSpan], job_id: int, name: str) -> list[ReadableSpan]:
    found = [
        s for s in by_name(spans, name) if s.attributes and s.attributes.get("jobguard.job.id") == job_id
    ]
    return sorted(found, key=lambda s: s.attributes["jobguard.attempt"] if s.attributes else 0)


def test_the_run_links_to_the_enqueue_span_and_carries_the_messaging_attributes(spans):
    with _view_span() as request_span:
        job = tasks_otel.checkout.using(idempotency_key="checkout:7").enqueue(order_id=7, card="4242-SECRET")
    stored = Job.objects.get(pk=job.pk).trace_context
    assert set(stored) == {"traceparent"}
    assert run_burst() == 0
    finished = _finished(spans)
    (send,) = by_name(finished, "send otel")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request_span.get_span_context().span_id
    # The row stores the producer span's context, not the request's.
    assert stored["traceparent"].split("-")[2] == trace.format_span_id(send.context.span_id)
    (process,) = _of_job(finished, job.pk, "process otel")
    assert process.kind is SpanKind.CONSUMER
    # A link by default: the run starts a trace of its own.
    assert process.parent is None
    assert process.context.trace_id != send.context.trace_id
    assert [(link.context.span_id, dict(link.attributes or {})) for link in process.links] == [
        (send.context.span_id, {"jobguard.link": "enqueue"})
    ]
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "jobguard"
    assert attributes["messaging.destination.name"] == "otel"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.message.id"] == str(job.pk)
    assert attributes["jobguard.task"] == tasks_otel.checkout.name
    assert attributes["jobguard.attempt"] == 1
    assert attributes["jobguard.idempotency_key"] == "checkout:7"
    assert attributes["jobguard.lock_key"] == "order:7"
    assert attributes["jobguard.outcome"] == "succeeded"
    assert attributes["jobguard.queue_wait_seconds"] >= 0
    assert attributes["jobguard.since_enqueue_seconds"] >= 0
    # Never the payload: no attribute of any span holds the card.
    for span in finished:
        assert "SECRET" not in json.dumps(dict(span.attributes or {}), default=str), span.name
    # The handler's own span, and the settle span, are children of the run's span.
    (charge,) = by_name(finished, "charge card")
    (settle,) = [
        s
        for s in by_name(finished, "settle otel")
        if s.parent and s.parent.span_id == process.context.span_id
    ]
    assert charge.parent is not None and charge.parent.span_id == process.context.span_id
    assert dict(settle.attributes or {})["messaging.operation.name"] == "ack"
    assert {
        dict(send.attributes or {})[key] for key in ("messaging.operation.type", "messaging.message.id")
    } == {
        "send",
        str(job.pk),
    }


def test_as_a_child_the_run_continues_the_enqueuers_trace(spans):
    with override_settings(JOBGUARD={**TRACED, "OPENTELEMETRY_PARENT": True}):
        with _view_span():
            job = tasks_otel.checkout.enqueue(order_id=8, card="x")
        assert set(Job.objects.get(pk=job.pk).trace_context) == {"traceparent"}
        assert run_burst() == 0
    finished = _finished(spans)
    (send,) = by_name(finished, "send otel")
    (process,) = _of_job(finished, job.pk, "process otel")
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert process.context.trace_id == send.context.trace_id
    assert process.links == ()


def _enqueue_with_baggage(task: Any, **entries: str) -> Any:
    """Enqueue ``task`` in a request span whose baggage (as a caller's header gives it) holds ``entries``."""
    context = otel_context.get_current()
    for name, value in entries.items():
        context = baggage.set_baggage(name, value, context=context)
    token = otel_context.attach(context)
    try:
        with _view_span():
            return task.enqueue(order_id=9)
    finally:
        otel_context.detach(token)


def test_by_default_no_baggage_crosses_the_queue(spans):
    # A caller's baggage header is data from outside: without a list, none of it is stored.
    job = _enqueue_with_baggage(tasks_otel.reads_baggage, tenant="acme", session="s3cr3t")
    assert set(Job.objects.get(pk=job.pk).trace_context) == {"traceparent"}
    assert run_burst() == 0
    assert Job.objects.get(pk=job.pk).result == {}


@pytest.mark.parametrize("parent", [False, True], ids=["linked", "child"])
@pytest.mark.parametrize("slots", [0, 2], ids=["thread", "async-slots"])
def test_the_listed_baggage_entries_are_the_handlers_baggage_and_no_others(spans, parent, slots):
    listed = {**TRACED, "OPENTELEMETRY_BAGGAGE": ["tenant", "region"], "OPENTELEMETRY_PARENT": parent}
    task = tasks_otel.reads_baggage_async if slots else tasks_otel.reads_baggage
    with override_settings(JOBGUARD=listed):
        job = _enqueue_with_baggage(task, tenant="acme", session="s3cr3t", region="eu west")
        stored = Job.objects.get(pk=job.pk).trace_context
        assert set(stored) == {"traceparent", "baggage"}
        assert "session" not in stored["baggage"] and "s3cr3t" not in stored["baggage"]
        assert run_burst(async_slots=slots or None) == 0
    assert Job.objects.get(pk=job.pk).result == {"tenant": "acme", "region": "eu west"}


def test_a_stored_baggage_header_gives_the_handler_only_the_entries_listed_when_it_runs(spans):
    # A row written under a longer list (or edited): the run filters again, with today's list.
    with override_settings(JOBGUARD={**TRACED, "OPENTELEMETRY_BAGGAGE": ["tenant", "session"]}):
        job = _enqueue_with_baggage(tasks_otel.reads_baggage, tenant="acme", session="s3cr3t")
    stored = Job.objects.get(pk=job.pk).trace_context
    edited = {**stored, "baggage": stored["baggage"] + ",bad entry;;=,"}
    Job.objects.filter(pk=job.pk).update(trace_context=edited)
    with override_settings(JOBGUARD={**TRACED, "OPENTELEMETRY_BAGGAGE": ["tenant"]}):
        assert run_burst() == 0
    assert Job.objects.get(pk=job.pk).result == {"tenant": "acme"}


def test_each_retry_links_to_the_enqueue_and_to_every_earlier_attempt(spans):
    with _view_span():
        job = tasks_otel.checkout.enqueue(order_id=9, card="x", failures=2)
    while Job.objects.get(pk=job.pk).status != "succeeded":
        assert run_burst() == 0
    finished = _finished(spans)
    (send,) = by_name(finished, "send otel")
    first, second, third = _of_job(finished, job.pk, "process otel")
    assert [dict(s.attributes or {})["jobguard.outcome"] for s in (first, second, third)] == [
        "retry",
        "retry",
        "succeeded",
    ]
    assert first.status.status_code is StatusCode.ERROR
    assert dict(first.attributes or {})["error.type"] == "django_jobguard.exceptions.TransientError"
    assert [event.name for event in first.events][:1] == ["exception"]
    assert [link.context.span_id for link in third.links] == [
        send.context.span_id,
        first.context.span_id,
        second.context.span_id,
    ]
    assert [dict(link.attributes or {})["jobguard.link"] for link in third.links] == [
        "enqueue",
        "earlier_attempt",
        "earlier_attempt",
    ]


def test_a_replayed_dead_letter_links_to_the_original_enqueue_and_attempts(spans):
    with _view_span():
        job = tasks_otel.refund.enqueue(order_id=10)
    while Job.objects.get(pk=job.pk).status != "dead":
        assert run_burst() == 0
    letter = DeadLetter.objects.get(job=job)
    assert letter.trace_context == Job.objects.get(pk=job.pk).trace_context
    finished = _finished(spans)
    (send,) = by_name(finished, "send otel")
    original = _of_job(finished, job.pk, "process otel")
    assert [dict(s.attributes or {})["jobguard.outcome"] for s in original] == ["retry", "dead"]
    assert dict(original[-1].attributes or {})["jobguard.dead_letter_reason"] == "retries_exhausted"
    requester, approver = make_user("asker", "request_replay"), make_user("boss", "approve_replay")
    replay.request_replay(letter, requester, reason="provider is back")
    replay.approve_replay(letter.pk, approver, reason="checked")
    spans.clear()
    run_burst()
    replayed = DeadLetter.objects.get(pk=letter.pk).replay_job
    assert replayed is not None
    rerun = _of_job(_finished(spans), replayed.pk, "process otel")[0]
    assert [link.context.span_id for link in rerun.links] == [
        send.context.span_id,
        *(attempt.context.span_id for attempt in original),
    ]


def test_a_malformed_or_missing_trace_context_is_logged_at_debug_and_the_job_runs(spans, caplog):
    good = tasks_otel.checkout.enqueue(order_id=11, card="x")
    missing = tasks_otel.checkout.enqueue(order_id=12, card="x")
    not_an_object = tasks_otel.checkout.enqueue(order_id=13, card="x")
    Job.objects.filter(pk=good.pk).update(
        trace_context={"traceparent": "00-zz-not-a-context", "attempts": [7]}
    )
    Job.objects.filter(pk=missing.pk).update(trace_context=None)  # as written before tracing was on
    Job.objects.filter(pk=not_an_object.pk).update(trace_context=["00-bad"])
    with caplog.at_level(logging.DEBUG, logger="django_jobguard.tracing"):
        assert run_burst() == 0
    assert set(
        Job.objects.filter(pk__in=[good.pk, missing.pk, not_an_object.pk]).values_list("status", flat=True)
    ) == {"succeeded"}
    messages = [r.getMessage() for r in caplog.records if r.name == "django_jobguard.tracing"]
    assert f"trace_context_invalid job_id={good.pk} traceparent='00-zz-not-a-context'; ignored" in messages
    assert f"trace_context_invalid job_id={good.pk} attempt_link=1; ignored" in messages
    assert any(m.startswith(f"trace_context_missing job_id={missing.pk};") for m in messages)
    assert f"trace_context_invalid job_id={not_an_object.pk}; not a JSON object, ignored" in messages
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "django_jobguard.tracing")
    for job in (good, missing, not_an_object):
        (process,) = _of_job(_finished(spans), job.pk, "process otel")
        assert process.links == ()


def test_settle_events_from_the_event_stream_land_on_the_settle_span(spans):
    job = tasks_otel.declined.enqueue(order_id=14)
    assert run_burst() == 0
    finished = _finished(spans)
    (process,) = _of_job(finished, job.pk, "process otel")
    assert dict(process.attributes or {})["jobguard.outcome"] == "dead"
    (settle,) = [
        s
        for s in by_name(finished, "settle otel")
        if s.parent and s.parent.span_id == process.context.span_id
    ]
    assert "jobguard.JobFailed" in [event.name for event in settle.events]
    assert dict(settle.attributes or {})["messaging.operation.name"] == "nack"


def test_job_log_lines_carry_the_trace_and_span_ids(spans, caplog):
    job = tasks_otel.logs_a_line.enqueue(order_id=15)
    with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        assert run_burst() == 0
    (process,) = _of_job(_finished(spans), job.pk, "process otel")
    (line,) = [r for r in caplog.records if r.getMessage() == "otel_line order_id=15"]
    assert line.trace_id == trace.format_trace_id(process.context.trace_id)
    assert line.span_id == trace.format_span_id(process.context.span_id)
    # Its success is logged by the ack thread (a batched ack), in the attempt's trace still.
    (succeeded,) = [r for r in caplog.records if r.getMessage().startswith(f"job_succeeded job_id={job.pk} ")]
    assert succeeded.threadName != line.threadName
    assert succeeded.trace_id == trace.format_trace_id(process.context.trace_id)
    # The worker's own lines too: a retry is logged while its settle span is current.
    retried = tasks_otel.checkout.enqueue(order_id=15, card="x", failures=1)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        assert run_burst() == 0
    first = _of_job(_finished(spans), retried.pk, "process otel")[0]
    (retry_line,) = [
        r for r in caplog.records if r.getMessage().startswith(f"job_retry job_id={retried.pk} ")
    ]
    assert retry_line.trace_id == trace.format_trace_id(first.context.trace_id)


def test_bulk_enqueue_stores_one_producer_span_for_the_batch(spans):
    with _view_span():
        jobs = tasks_otel.noop.bulk_enqueue([((n,), {}) for n in range(3)])
    (send,) = by_name(_finished(spans), "send otel-bulk")
    assert dict(send.attributes or {})["messaging.batch.message_count"] == 3
    contexts = {
        json.dumps(c)
        for c in Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("trace_context", flat=True)
    }
    assert len(contexts) == 1
    assert json.loads(contexts.pop())["traceparent"].split("-")[2] == trace.format_span_id(
        send.context.span_id
    )


def test_without_the_setting_nothing_is_stored_and_no_span_is_made():
    exporter = memory_exporter()
    exporter.clear()
    with _view_span():
        job = tasks_otel.noop.enqueue(16)
    assert Job.objects.get(pk=job.pk).trace_context is None
    assert run_burst() == 0
    assert [s.name for s in exporter.get_finished_spans()] == ["GET /checkout"]
    tracing_module = "django_jobguard.monitoring.tracing"
    assert not any(getattr(sink, "__module__", "") == tracing_module for sink in events._sinks)


def test_without_the_setting_opentelemetry_is_never_imported(tmp_path):
    # A fresh interpreter on a SQLite file of its own (whatever this run's database): enqueue
    # and run a job with tracing off, then look at sys.modules.
    script = (
        "import django, sys; django.setup();"
        "from django.core.management import call_command; call_command('migrate', verbosity=0);"
        "from tests.testapp import tasks_otel;"
        "tasks_otel.noop.enqueue(1);"
        "from django_jobguard.worker import Worker;"
        "Worker(burst=True, install_signal_handlers=False, poll_interval=0.05).run();"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "JOBGUARD_TEST_DB_NAME": str(tmp_path / "untraced.sqlite3"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip().splitlines()[-1] == "[]"


def test_the_duration_histogram_carries_the_attempts_trace_as_an_exemplar(spans):
    prometheus = pytest.importorskip("prometheus_client.openmetrics.exposition")
    from prometheus_client import REGISTRY

    job = tasks_otel.checkout.enqueue(order_id=17, card="x", failures=1)
    while Job.objects.get(pk=job.pk).status != "succeeded":
        assert run_burst() == 0  # the success's ack is batched: written on the ack thread
    first, second = _of_job(_finished(spans), job.pk, "process otel")
    text = prometheus.generate_latest(REGISTRY).decode()
    lines = [line for line in text.splitlines() if line.startswith("jobguard_job_duration_seconds_bucket")]
    for attempt, status in ((first, "failed"), (second, "succeeded")):
        trace_id = trace.format_trace_id(attempt.context.trace_id)
        assert any(f'status="{status}"' in line and f'trace_id="{trace_id}"' in line for line in lines), (
            status
        )


def _drain() -> None:
    """Bursts until no job is left to run: a workflow's next jobs are queued by the last settle."""
    for _ in range(10):
        assert run_burst() == 0
        if not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.WAITING]).exists():
            return
    raise AssertionError("jobs still queued after 10 bursts")


def _links(span: ReadableSpan) -> list[tuple[int, str]]:
    return [(link.context.span_id, dict(link.attributes or {})["jobguard.link"]) for link in span.links]


def test_batch_members_and_its_callback_link_to_the_one_workflow_span(spans):
    with _view_span() as request_span:
        batch = Batch(on_success=tasks_otel.noop.s(99)).enqueue([tasks_otel.noop.s(n) for n in (1, 2, 3)])
    _drain()
    finished = _finished(spans)
    # open, add and close in one producer span, a child of the request.
    (send,) = by_name(finished, "send workflow")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request_span.get_span_context().span_id
    attributes = dict(send.attributes or {})
    assert attributes["jobguard.workflow.id"] == batch.id
    assert attributes["jobguard.workflow.kind"] == "batch"
    assert attributes["messaging.batch.message_count"] == 3
    runs = by_name(finished, "process otel-bulk")
    members = Job.objects.filter(workflow_id=batch.id).values_list("pk", flat=True)
    callback = Job.objects.filter(task_name=tasks_otel.noop.name, args=[99]).get()
    assert len(runs) == 4  # three members and the callback
    for job_id in [*members, callback.pk]:
        (run,) = _of_job(finished, job_id, "process otel-bulk")
        assert _links(run) == [(send.context.span_id, "enqueue")], job_id
    for job_id in members:
        (run,) = _of_job(finished, job_id, "process otel-bulk")
        assert dict(run.attributes or {})["jobguard.workflow.id"] == batch.id


def test_a_chain_is_one_workflow_span_its_steps_link_to(spans):
    workflow = chain(tasks_otel.noop.s(1), tasks_otel.noop.s(2)).enqueue()
    _drain()
    finished = _finished(spans)
    (send,) = by_name(finished, "send workflow")
    assert dict(send.attributes or {})["jobguard.workflow.kind"] == "chain"
    assert dict(send.attributes or {})["messaging.batch.message_count"] == 2
    for job in workflow.jobs:
        (run,) = _of_job(finished, job.pk, "process otel-bulk")
        assert _links(run) == [(send.context.span_id, "enqueue")]


def test_a_job_with_after_links_to_its_own_enqueue_and_to_each_parents(spans):
    first, second = tasks_otel.noop.enqueue(1), tasks_otel.noop.enqueue(2)
    child = tasks_otel.noop.using(after=[first, second]).enqueue(3)
    _drain()
    finished = _finished(spans)
    sends = by_name(finished, "send otel-bulk")
    by_job = {dict(s.attributes or {})["jobguard.job.id"]: s for s in sends}
    (graph,) = by_name(finished, "send workflow")
    assert dict(graph.attributes or {})["jobguard.workflow.kind"] == "graph"
    (run,) = _of_job(finished, child.pk, "process otel-bulk")
    assert _links(run) == [
        (graph.context.span_id, "enqueue"),
        (by_job[first.pk].context.span_id, "parent"),
        (by_job[second.pk].context.span_id, "parent"),
    ]


def test_a_coroutine_job_on_async_slots_is_traced_like_a_threaded_one(spans, caplog):
    with _view_span():
        job = tasks_otel.fetch.enqueue(order_id=21, failures=1)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        while Job.objects.get(pk=job.pk).status != "succeeded":
            assert run_burst(async_slots=4) == 0
    finished = _finished(spans)
    (send,) = by_name(finished, "send otel")
    first, second = _of_job(finished, job.pk, "process otel")
    assert _links(first) == [(send.context.span_id, "enqueue")]
    assert _links(second) == [(send.context.span_id, "enqueue"), (first.context.span_id, "earlier_attempt")]
    assert [dict(s.attributes or {})["jobguard.outcome"] for s in (first, second)] == ["retry", "succeeded"]
    # The handler's span and each settle span are children of their attempt's span.
    for attempt in (first, second):
        children = [s.name for s in finished if s.parent and s.parent.span_id == attempt.context.span_id]
        assert sorted(children) == ["call partner", "settle otel"], children
    # The retry is written on a DB thread and the success on the ack thread: both in the trace.
    (retry_line,) = [r for r in caplog.records if r.getMessage().startswith(f"job_retry job_id={job.pk} ")]
    assert retry_line.trace_id == trace.format_trace_id(first.context.trace_id)
    (done_line,) = [r for r in caplog.records if r.getMessage().startswith(f"job_succeeded job_id={job.pk} ")]
    assert done_line.trace_id == trace.format_trace_id(second.context.trace_id)
