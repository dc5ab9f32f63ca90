"""The outbox destination backends' tests: real servers on loopback, skipped with the reason when absent.

RabbitMQ and NATS are looked for at their usual local addresses (or ``JOBGUARD_TEST_RABBITMQ_URL``,
``JOBGUARD_TEST_NATS_URL``). A server that does not answer skips its tests, unless its variable
is set: a run that names the server fails when it is not there. Webhooks go to an HTTP server
each test starts in a thread.
"""

from __future__ import annotations

import datetime
import http.server
import os
import socket
import threading
import urllib.parse
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from django_jobguard.outbox.destinations.base import Envelope

#: Per-run names (exchanges, queues, streams) start with this: helpers and CI runs apart.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")

RABBITMQ_URL = os.environ.get("JOBGUARD_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
NATS_URL = os.environ.get("JOBGUARD_TEST_NATS_URL", "nats://127.0.0.1:4222")


def unique(prefix: str) -> str:
    """A name no other test run uses: ``prefix``, the pytest worker, random hex."""
    return f"{prefix}-{WORKER}-{uuid.uuid4().hex[:10]}"


def envelope(
    key: str = "order:1",
    seq: int = 1,
    payload: Any = None,
    headers: dict[str, str] | None = None,
    *,
    id: str | None = None,
    attempt: int = 1,
    destination: str = "events",
) -> Envelope:
    return Envelope(
        id=id or str(uuid.uuid4()),
        destination=destination,
        key=key,
        seq=seq,
        payload={"order": 1, "total": "9.90", "note": "café"} if payload is None else payload,
        headers=headers or {},
        published_at=datetime.datetime.now(tz=datetime.UTC),
        attempt=attempt,
    )


def _reachable(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), timeout=1):
            return True
    except OSError:
        return False


def _server(url: str, variable: str, how: str) -> str:
    if _reachable(url):
        return url
    if os.environ.get(variable):
        pytest.fail(f"{variable}={url} is set but nothing answers there")
    pytest.skip(f"no server at {url} ({how}; or set {variable})")


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    pytest.importorskip("pika", reason="needs pika: pip install -e '.[outbox]'")
    return _server(
        RABBITMQ_URL, "JOBGUARD_TEST_RABBITMQ_URL", "start RabbitMQ: service rabbitmq-server start"
    )


@pytest.fixture(scope="session")
def nats_url() -> str:
    pytest.importorskip("nats", reason="needs nats-py: pip install -e '.[outbox]'")
    return _server(
        NATS_URL, "JOBGUARD_TEST_NATS_URL", "start NATS with JetStream: nats-server -js -a 127.0.0.1 -p 4222"
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The webhook receiver.


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int
    #: Every header name as sent, lower-cased, repeats included.
    raw_headers: list[str] = field(default_factory=list)


@dataclass
class Receiver:
    """A real HTTP/1.1 server on loopback: records each request, answers from ``answers`` (else 204)."""

    url: str
    requests: list[Received] = field(default_factory=list)
    answers: deque[tuple[int, bytes, float]] = field(default_factory=deque)
    release: threading.Event = field(default_factory=threading.Event)

    def answer(self, status: int, body: bytes = b"", delay: float = 0.0) -> None:
        self.answers.append((status, body, delay))


def _handler(receiver: Receiver) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client's connection reuse is observable

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            receiver.requests.append(
                Received(
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=body,
                    client_port=self.client_address[1],
                    raw_headers=[name.lower() for name in self.headers],
                )
            )
            status, text, delay = receiver.answers.popleft() if receiver.answers else (204, b"", 0.0)
            if delay:
                receiver.release.wait(delay)
            self.send_response(status)
            self.send_header("content-length", str(len(text)))
            if status in (301, 302, 307, 308):
                self.send_header("location", "https://elsewhere.example/hook")
            if status == 429:
                self.send_header("retry-after", "30")
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A connection the client (or a test's cut link) dropped mid-request: nothing to report.
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = _QuietServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    state = Receiver(url=f"http://{host}:{port}/hooks/orders")
    server.RequestHandlerClass = _handler(state)
    # A short poll: shutdown() waits for the loop's next look (0.5 s by default, per test).
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="webhook-receiver", daemon=True
    )
    thread.start()
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)
