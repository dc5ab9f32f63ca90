"""OpenTelemetry for the tracing tests: an in-memory exporter, and an OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def memory_exporter() -> InMemorySpanExporter:
    """The exporter every span of this process reaches (the global provider is set once)."""
    global _exporter
    if _exporter is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    return _exporter


def configure_otlp(endpoint: str, service: str = "jobguard-worker", delay_ms: int = 200) -> None:
    """A worker subprocess's provider: batches of spans to ``endpoint`` over OTLP/HTTP (protobuf).

    ``delay_ms``: how long the batch processor holds spans; the exit tests set it longer than
    the test runs, so only the worker's flush at exit can deliver them.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    # A short delay, so spans leave while the worker runs; the exit flush sends the rest.
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=200, max_queue_size=20_000
        )
    )
    trace.set_tracer_provider(provider)


def dump_spans(path: str, local: list[ReadableSpan], received: list[ReceivedSpan]) -> None:
    """Write this process's ``local`` spans and the worker's ``received`` ones as JSON."""
    rows: list[dict[str, Any]] = [
        {
            "name": span.name,
            "service": "shop-web",
            "trace_id": trace.format_trace_id(span.context.trace_id),
            "span_id": trace.format_span_id(span.context.span_id),
            "parent_id": trace.format_span_id(span.parent.span_id) if span.parent else None,
            "start_ns": span.start_time,
            "end_ns": span.end_time,
            "attributes": dict(span.attributes or {}),
            "links": [],
        }
        for span in local
    ]
    rows += [
        {
            "name": span.name,
            "service": span.service,
            "trace_id": span.trace_id,
            "span_id": span.span_id,
            "parent_id": span.parent_id,
            "start_ns": span.start_ns,
            "end_ns": span.end_ns,
            "attributes": span.attributes,
            "links": [[trace_id, span_id, attributes] for trace_id, span_id, attributes in span.links],
        }
        for span in received
    ]
    with open(path, "w") as out:
        json.dump(rows, out, indent=1)


def by_name(spans: Any, name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


class ReceivedSpan:
    """One span as an OTLP request carried it (ids as hex, attributes as Python values)."""

    def __init__(self, span: Any, service: str) -> None:
        self.name: str = span.name
        self.trace_id = span.trace_id.hex()
        self.span_id = span.span_id.hex()
        self.parent_id = span.parent_span_id.hex() or None
        self.kind: int = span.kind
        self.start_ns: int = span.start_time_unix_nano
        self.end_ns: int = span.end_time_unix_nano
        self.service = service
        self.status_code: int = span.status.code
        self.attributes = {kv.key: _value(kv.value) for kv in span.attributes}
        self.links = [
            (link.trace_id.hex(), link.span_id.hex(), {kv.key: _value(kv.value) for kv in link.attributes})
            for link in span.links
        ]
        self.events = [event.name for event in span.events]

    def __repr__(self) -> str:
        return (
            f"<{self.name} {self.trace_id[:8]}/{self.span_id[:8]} {self.attributes.get('jobguard.job.id')}>"
        )


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


class OtlpReceiver:
    """A tiny OTLP/HTTP trace receiver: collects the spans POSTed to ``/v1/traces``."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                received = []
                for resource_spans in request.resource_spans:
                    service = next(
                        (
                            kv.value.string_value
                            for kv in resource_spans.resource.attributes
                            if kv.key == "service.name"
                        ),
                        "",
                    )
                    for scope_spans in resource_spans.scope_spans:
                        received += [ReceivedSpan(span, service) for span in scope_spans.spans]
                with receiver._lock:
                    receiver.spans += received
                    receiver.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}/v1/traces"

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
