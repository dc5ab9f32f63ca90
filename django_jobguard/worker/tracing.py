"""The worker's half of tracing: each attempt's ``process`` span and its ``settle`` child.

Imported by the executors only with ``JOBGUARD["OPENTELEMETRY"]`` on (see
:mod:`django_jobguard.monitoring.tracing`, the producer half, whose tracer, propagators and
job attributes it uses).

- Each attempt is a ``process <queue>`` span (kind CONSUMER) that *links* to the enqueue
  span and to the job's earlier attempts (the convention of Sidekiq and River), or, with
  ``OPENTELEMETRY_PARENT``, is its child. Attributes say how long the job waited; settling
  the outcome (the ack, the retry or the dead letter) is a ``settle <queue>`` child span, and
  events of the event stream land on it.
- The attempt restores the allowed baggage (``OPENTELEMETRY_BAGGAGE``) as the current
  baggage of its handler, in both modes.
- A context that cannot be read (malformed, or none: a row from before tracing was on) is
  logged at DEBUG and left out; the job runs.
- The worker flushes the tracer provider when it exits (SIGTERM, ``--max-jobs``, ``--burst``).
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from .._redact import payload_secrets, redact
from ..conf import get_settings
from ..monitoring.tracing import (
    BAGGAGE,
    SYSTEM,
    TRACE_CONTEXT,
    TRACER,
    W3C_KEYS,
    allowed_baggage,
    job_attributes,
)
from ..outcome import Dead, Duplicate, Outcome, PutBack, Retry, Stale, Succeeded
from ..store.traces import stored_trace

if TYPE_CHECKING:
    from ..store import ClaimedJob
    from .completer import Completer
    from .held import Held
    from .pipeline import Runtime

__all__ = ["MAX_LINKED_ATTEMPTS", "flush", "run", "run_async"]

# The tracing area's logger, shared with the producer half (see the loggers reference).
logger = logging.getLogger("django_jobguard.tracing")

#: Earlier attempts a run links to (the latest ones): a job retried forever stays bounded.
MAX_LINKED_ATTEMPTS = 32
#: Seconds the worker waits for the tracer provider to export what it holds when it exits.
FLUSH_TIMEOUT_SECONDS = 10.0

RunPipeline = Callable[["Held", "Runtime"], Outcome]


# -- run ---------------------------------------------------------------------------------------


def run(held: Held, runtime: Runtime, completer: Completer, run_pipeline: RunPipeline) -> None:
    """Run one claimed job through ``run_pipeline`` in its consumer span, then settle it."""
    parent, links, attributes, stored = _begin(held, runtime)
    with _process_span(held.job, parent, links, attributes) as span:
        outcome = run_pipeline(held, runtime)
        _record_outcome(span, held.job, outcome)
        if type(outcome) is Retry or type(outcome) is Dead:
            # Before the settle: the next attempt, or the dead letter (and its replay), links to it.
            _remember_attempt(runtime.alias, held.job, stored, span)
        with _settle_span(held, outcome):
            completer.settle_run(held, outcome)


async def run_async(
    held: Held,
    runtime: Runtime,
    run_pipeline: Callable[[Held], Awaitable[Outcome]],
    settle: Callable[[Held, Outcome], Awaitable[None]],
    in_thread: Callable[..., Awaitable[Any]],
) -> None:
    """:func:`run` for a coroutine job (``--async-slots``): its reads and writes on a DB thread.

    The spans are current in the job's asyncio task; ``in_thread`` carries that context to
    the DB thread, so the settle's log lines join the trace there too.
    """
    parent, links, attributes, stored = await in_thread(_begin, held, runtime)
    with _process_span(held.job, parent, links, attributes) as span:
        outcome = await run_pipeline(held)
        _record_outcome(span, held.job, outcome)
        if type(outcome) is Retry or type(outcome) is Dead:
            await in_thread(_remember_attempt, runtime.alias, held.job, stored, span)
        with _settle_span(held, outcome):
            await settle(held, outcome)


def _begin(held: Held, runtime: Runtime) -> tuple[otel_context.Context, list[Link], dict[str, Any], Any]:
    """What an attempt's span starts with: its context, links and attributes; the stored context."""
    job = held.job
    stored, waited = _stored(runtime.alias, job.id)
    parent, links = _continuation(job, stored)
    attributes = job_attributes(job)
    attributes.update(waited)
    attributes["messaging.operation.type"] = "process"
    attributes["messaging.operation.name"] = "run"
    attributes["jobguard.worker_id"] = runtime.worker_id
    return parent, links, attributes, stored


@contextmanager
def _process_span(
    job: ClaimedJob, parent: otel_context.Context, links: list[Link], attributes: dict[str, Any]
) -> Iterator[Span]:
    """The attempt's span, current in ``parent``: its baggage is the handler's current baggage.

    ``start_as_current_span(context=...)`` takes only the parent span from that context and
    makes the span current in the thread's own context: ``parent`` is attached first.
    """
    token = otel_context.attach(parent)
    try:
        with TRACER.start_as_current_span(
            f"process {job.queue_name}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span
    finally:
        otel_context.detach(token)


@contextmanager
def _settle_span(held: Held, outcome: Outcome) -> Iterator[Span]:
    """The span settling an outcome runs in (the ack, the retry or the dead letter)."""
    job = held.job
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": job.queue_name,
        "messaging.operation.type": "settle",
        "messaging.operation.name": "ack" if type(outcome) in (Succeeded, Duplicate) else "nack",
        "messaging.message.id": str(job.id),
    }
    with TRACER.start_as_current_span(
        f"settle {job.queue_name}", kind=SpanKind.INTERNAL, attributes=attributes
    ) as settle:
        # A batched ack is reported later, on the ack thread: in this span's context again.
        held.trace_scope = functools.partial(trace.use_span, settle, end_on_exit=False)
        yield settle


def _stored(alias: str, job_id: int) -> tuple[Any, dict[str, float]]:
    """The job's stored trace context, and how long it waited (as span attributes)."""
    row = stored_trace(alias, job_id)
    if row is None:
        return None, {}
    context, enqueued_at, run_after, started_at = row
    if isinstance(context, str | bytes):  # SQLite returns the JSON text; psycopg decodes jsonb
        try:
            context = json.loads(context)
        except ValueError:
            pass  # left as text: _continuation logs it and ignores it
    waited: dict[str, float] = {}
    started = _aware(started_at)
    if started is not None:
        enqueued, due = _aware(enqueued_at), _aware(run_after)
        if enqueued is not None:
            waited["jobguard.since_enqueue_seconds"] = (started - enqueued).total_seconds()
        if due is not None:
            # From when it was due (its run_after, or its retry's) until an executor took it.
            waited["jobguard.queue_wait_seconds"] = max(0.0, (started - due).total_seconds())
    return context, waited


def _aware(value: Any) -> datetime.datetime | None:
    """A timestamp as the driver returned it (SQLite: text), as an aware datetime."""
    parsed = value if isinstance(value, datetime.datetime) else None
    if isinstance(value, str):
        parsed = parse_datetime(value)
    if parsed is not None and timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, datetime.UTC)
    return parsed


def _continuation(job: ClaimedJob, stored: Any) -> tuple[otel_context.Context, list[Link]]:
    """The context the run's span starts in, and its links (enqueue, parents, earlier attempts)."""
    fresh = otel_context.Context()  # the executor thread's own context is not the job's
    if stored is None:
        logger.debug("trace_context_missing job_id=%s; the run starts a trace of its own", job.id)
        return fresh, []
    if not isinstance(stored, Mapping):
        logger.debug("trace_context_invalid job_id=%s; not a JSON object, ignored", job.id)
        return fresh, []
    w3c = {key: value for key, value in stored.items() if key in W3C_KEYS and isinstance(value, str)}
    enqueued = _span_context(w3c)
    # The allowed baggage crosses in both modes, whatever the span relation; the rest of a
    # stored header (an older row, a list that has shrunk since) is left behind.
    start = allowed_baggage(BAGGAGE.extract(w3c, context=fresh)) or fresh
    links: list[Link] = []
    if enqueued is None:
        logger.debug(
            "trace_context_invalid job_id=%s traceparent=%r; ignored",
            job.id,
            str(stored.get("traceparent"))[:100],
        )
    elif get_settings().opentelemetry_parent:
        start = trace.set_span_in_context(trace.NonRecordingSpan(enqueued), start)
    else:
        links.append(Link(enqueued, {"jobguard.link": "enqueue"}))
    for key, label, name in (("parents", "parent", "parent"), ("attempts", "earlier_attempt", "attempt")):
        listed = stored.get(key)
        for number, traceparent in enumerate(listed if isinstance(listed, list) else [], start=1):
            earlier = _span_context({"traceparent": traceparent}) if isinstance(traceparent, str) else None
            if earlier is not None:
                links.append(Link(earlier, {"jobguard.link": label}))
            else:
                logger.debug("trace_context_invalid job_id=%s %s_link=%d; ignored", job.id, name, number)
    return start, links


def _span_context(w3c: Mapping[str, str]) -> trace.SpanContext | None:
    if "traceparent" not in w3c:
        return None
    span_context = trace.get_current_span(TRACE_CONTEXT.extract(w3c)).get_span_context()
    return span_context if span_context.is_valid else None


def _remember_attempt(alias: str, job: ClaimedJob, stored: Any, span: Span) -> None:
    """Store this failed attempt's span with the job, so the next attempt (or replay) links to it.

    Only for failures (a trace reads best with the earlier ones at hand): one more write per
    failed attempt, matched by the lease token like every other write of the job's holder.
    """
    from ..models import Job  # the app registry is ready by the time a worker runs jobs

    values: dict[str, str] = {}
    TRACE_CONTEXT.inject(values, context=trace.set_span_in_context(span))
    if "traceparent" not in values:
        return  # a non-recording span (sampled out): nothing to link to
    context = dict(stored) if isinstance(stored, Mapping) else {}
    earlier = context.get("attempts")
    attempts = [*(earlier if isinstance(earlier, list) else []), values["traceparent"]]
    context["attempts"] = attempts[-MAX_LINKED_ATTEMPTS:]
    Job.objects.using(alias).filter(pk=job.id, lease_token=job.lease_token).update(trace_context=context)


def _record_outcome(span: Span, job: ClaimedJob, outcome: Outcome) -> None:
    if not span.is_recording():
        return
    kind = type(outcome)
    if kind is Succeeded or kind is Duplicate:
        span.set_attribute("jobguard.outcome", "succeeded" if kind is Succeeded else "duplicate")
        return
    if kind is Retry or kind is Dead:
        failure: Retry | Dead = outcome  # type: ignore[assignment]
        span.set_attribute("jobguard.outcome", "retry" if kind is Retry else "dead")
        span.set_attribute("jobguard.error_category", failure.category)
        span.set_attribute("error.type", failure.error_class)
        if kind is Dead:
            span.set_attribute("jobguard.dead_letter_reason", str(outcome.reason))  # type: ignore[union-attr]
        secrets = payload_secrets(job)
        message = redact(failure.message, secrets) if secrets else failure.message
        span.add_event("exception", {"exception.type": failure.error_class, "exception.message": message})
        span.set_status(Status(StatusCode.ERROR, f"{failure.error_class}: {message}"[:1000]))
        return
    if kind is PutBack:
        span.set_attribute("jobguard.outcome", "put_back")
        span.set_attribute("jobguard.put_back_cause", outcome.cause.value)  # type: ignore[union-attr]
    elif kind is Stale:
        span.set_attribute("jobguard.outcome", "stale")


# -- exit ---------------------------------------------------------------------------------------


def flush(timeout: float = FLUSH_TIMEOUT_SECONDS) -> bool:
    """Export the spans the tracer provider holds (an SDK provider; others have nothing to flush)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is None:
        return True
    try:
        return bool(force_flush(int(timeout * 1000)))
    except Exception:  # an exporter's failure must not stop the worker from exiting
        logger.warning("trace_flush_failed", exc_info=True)
        return False
