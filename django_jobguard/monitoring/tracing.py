"""OpenTelemetry traces across the queue, with ``JOBGUARD["OPENTELEMETRY"] = True``: the producer half.

Imported only with that setting on (``pip install django-jobguard[otel]``): without it nothing
imports OpenTelemetry and the claim-and-ack path runs no code of this module.

- **Enqueue** runs in a ``send <queue>`` span (kind PRODUCER); the job row stores that span's
  W3C context (``traceparent``, ``tracestate``, ``baggage``) in ``trace_context``.
- **Workflows**: storing a chain, a batch (or adding to one) or a job with ``after=`` runs in
  a ``send workflow`` span (kind PRODUCER) that names the workflow; its members and callbacks
  store *that* span as their enqueue, and a dependent job also keeps its parents' enqueue
  contexts (``parents``), so its run links to them as well.
- **Run**: each attempt is a ``process <queue>`` span (kind CONSUMER), made by the worker
  (:mod:`django_jobguard.worker.tracing`) from what this module stored and with its tracer,
  its propagators and its job attributes.
- **Baggage** crosses the queue only for the entries named in ``OPENTELEMETRY_BAGGAGE``
  (none by default): the enqueue stores those (:func:`carrier`), and the attempt restores
  those (:func:`allowed_baggage`, named then) as the current baggage of its handler.
  A caller's baggage header is data from outside: nothing else of it is stored or handed to
  a worker.
- The event stream's events land on the current span (:func:`sink`); log records and
  Prometheus exemplars carry its ids (:func:`trace_fields`, :func:`exemplar`).

Spans go to whatever tracer provider the project set up. Attributes follow OpenTelemetry's
messaging semantic conventions; they never hold the payload.
"""

from __future__ import annotations

import contextvars
import importlib.metadata
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import events
from ..conf import get_settings
from ..log import job_fields

__all__ = [
    "BAGGAGE",
    "SYSTEM",
    "TRACER",
    "TRACE_CONTEXT",
    "W3C_KEYS",
    "allowed_baggage",
    "carrier",
    "enqueue_span",
    "exemplar",
    "job_attributes",
    "record_enqueued",
    "record_workflow",
    "sink",
    "trace_fields",
    "with_parents",
    "workflow_span",
]

#: Parents a dependent job's run links to (``after=`` takes any number of jobs).
MAX_LINKED_PARENTS = 32
#: The value of ``messaging.system``.
SYSTEM = "jobguard"
#: Keys of a job's ``trace_context`` that come from the W3C propagators.
W3C_KEYS = ("traceparent", "tracestate", "baggage")
#: The keys of the trace context proper (the baggage is stored apart, filtered).
_TRACE_KEYS = ("traceparent", "tracestate")

#: The installed distribution's version (its metadata: no module of the package imports the
#: package root); a checkout on ``sys.path`` that was never installed has none.
try:
    VERSION = importlib.metadata.version("django-jobguard")
except importlib.metadata.PackageNotFoundError:
    VERSION = "0+unknown"

#: The tracer of every span jobguard makes, the producer's and the worker's.
TRACER = trace.get_tracer("django_jobguard", VERSION)
#: The W3C propagators a stored context is written and read with.
TRACE_CONTEXT = TraceContextTextMapPropagator()
BAGGAGE = W3CBaggagePropagator()

#: The workflow span being recorded in this context: ``Batch.enqueue`` opens, adds and closes
#: in one span, not three.
_workflow_span: contextvars.ContextVar[Span | None] = contextvars.ContextVar(
    "jobguard_workflow_span", default=None
)


# -- enqueue -----------------------------------------------------------------------------------


@contextmanager
def enqueue_span(task_name: str, queue_name: str) -> Iterator[Span]:
    """The producer span one enqueue runs in (the job's id is added once it is known)."""
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue_name,
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "jobguard.task": task_name,
    }
    with TRACER.start_as_current_span(
        f"send {queue_name}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        yield span


def record_enqueued(span: Span, job: Any, created: bool = True) -> None:
    """Name the job the producer span enqueued (or found, for a repeated idempotency key)."""
    if not span.is_recording():
        return
    span.set_attributes(job_attributes(job, attempt=False))
    if not created:
        span.set_attribute("jobguard.duplicate", True)


@contextmanager
def workflow_span(operation: str, kind: str) -> Iterator[Span]:
    """The producer span that stores a workflow's jobs (or adds to it); nested calls share it."""
    current = _workflow_span.get()
    if current is not None:
        yield current
        return
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": "workflow",
        "messaging.operation.type": "send",
        "messaging.operation.name": operation,
        "jobguard.workflow.kind": kind,
    }
    with TRACER.start_as_current_span("send workflow", kind=SpanKind.PRODUCER, attributes=attributes) as span:
        token = _workflow_span.set(span)
        try:
            yield span
        finally:
            _workflow_span.reset(token)


def record_workflow(span: Span, workflow_id: int | None, members: int) -> None:
    """Name the workflow the span stored, and how many jobs it stored in it."""
    if not span.is_recording():
        return
    if workflow_id is not None:
        span.set_attribute("jobguard.workflow.id", workflow_id)
    if members:
        span.set_attribute("messaging.batch.message_count", members)


def with_parents(stored: dict[str, Any] | None, parents: Sequence[Any]) -> dict[str, Any] | None:
    """A dependent job's trace context: its own, plus its parents' enqueue contexts."""
    traceparents = [
        context["traceparent"]
        for context in parents
        if isinstance(context, Mapping) and isinstance(context.get("traceparent"), str)
    ][:MAX_LINKED_PARENTS]
    if not traceparents:
        return stored
    return {**(stored or {}), "parents": traceparents}


def carrier() -> dict[str, str] | None:
    """The current W3C trace context to store with a job; None when no span is current.

    Of the current baggage, only the entries named in ``OPENTELEMETRY_BAGGAGE``.
    """
    values: dict[str, str] = {}
    propagate.inject(values)
    stored = {key: values[key] for key in _TRACE_KEYS if key in values}
    allowed = allowed_baggage(otel_context.get_current())
    if allowed is not None:
        BAGGAGE.inject(stored, context=allowed)
    return stored or None


def allowed_baggage(context: otel_context.Context) -> otel_context.Context | None:
    """A context holding only the baggage entries of ``context`` that may cross the queue."""
    names = get_settings().opentelemetry_baggage
    if not names:
        return None
    entries = {name: value for name, value in baggage.get_all(context).items() if name in names}
    if not entries:
        return None
    allowed = otel_context.Context()
    for name, value in entries.items():
        allowed = baggage.set_baggage(name, value, context=allowed)
    return allowed


# -- shared by the producer and the worker's spans ---------------------------------------------


def job_attributes(job: Any, *, attempt: bool = True) -> dict[str, Any]:
    """The span attributes of a job: identity and keys (redacted as in logs), never the payload."""
    fields = job_fields(job)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": job.queue_name,
        "messaging.message.id": str(job.id),
        "jobguard.job.id": job.id,
        "jobguard.task": job.task_name,
    }
    if attempt:
        attributes["jobguard.attempt"] = job.attempts
        attributes["jobguard.max_attempts"] = job.max_attempts
    if fields["idempotency_key"]:
        attributes["jobguard.idempotency_key"] = fields["idempotency_key"]
    if fields["lock_key"]:
        attributes["jobguard.lock_key"] = fields["lock_key"]
    workflow_id = getattr(job, "workflow_id", None)
    if workflow_id is not None:
        attributes["jobguard.workflow.id"] = workflow_id
    return attributes


# -- the event stream, logs -----------------------------------------------------------------------


def sink(event: Any) -> None:
    """An event sink: events of a job's settle (lease lost, lock contended...) as span events."""
    if isinstance(event, events.JobEnqueued | events.ScheduleTicked | events.RefillLoaded):
        return  # the producer span says as much already; cache events concern no job
    span = trace.get_current_span()
    if not span.is_recording():
        return
    name = type(event).__name__
    attributes = {
        f"jobguard.{key}": value
        for key in getattr(event, "__slots__", ())
        if isinstance(value := getattr(event, key), str | int | float | bool)
    }
    span.add_event(f"jobguard.{name}", attributes)


def trace_fields() -> dict[str, str | None]:
    """``trace_id`` and ``span_id`` of the current span (hex), for a log record's fields."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {"trace_id": None, "span_id": None}
    return {
        "trace_id": trace.format_trace_id(span_context.trace_id),
        "span_id": trace.format_span_id(span_context.span_id),
    }


def exemplar() -> dict[str, str] | None:
    """The current span's ids as a Prometheus exemplar; None outside a recorded span."""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid or not span_context.trace_flags.sampled:
        return None
    return {
        "trace_id": trace.format_trace_id(span_context.trace_id),
        "span_id": trace.format_span_id(span_context.span_id),
    }
