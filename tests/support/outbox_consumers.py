"""Consumers of the outbox's real destinations, reading what the broker (or receiver) got.

One interface for the four backends, shared by the outbox fault scenario
(``tests/reliability/test_t14_outbox.py``) and ``benchmarks/bench_outbox.py``:

- :meth:`Consumer.options` is the destination's entry for ``JOBGUARD["OUTBOX"]["DESTINATIONS"]``;
- :meth:`Consumer.start` begins recording each arrival (message id, key, seq, the time it was
  read) on a thread of its own, with a connection of its own;
- :meth:`Consumer.records` is what the destination holds, in its order: the arrivals for the
  webhook receiver, the RabbitMQ queue and the Redis stream (read as they come, nothing
  acked away before it is recorded), the stream's stored messages for NATS JetStream (its
  core subscription, which misses what arrives while it reconnects, gives the times only);
- :meth:`Consumer.close` stops reading and deletes what the consumer declared.

:func:`check` turns records into the figures the issue asks for: lost, per-key order
violations (first sights only: a redelivery carries its first id), duplicates (same id
again) and duplicates under another id (a (key, seq) seen with two ids: must be 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.server
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable
from typing import Any

#: Messages of one NATS JetStream fetch when the stream is read back.
NATS_READ_BATCH = 500


@dataclasses.dataclass(frozen=True, slots=True)
class Arrival:
    """One message as the consumer read it: its id, key, seq and the time (``time.time()``)."""

    id: str
    key: str
    seq: int
    at: float


class Consumer:
    """What every consumer offers (see the module's docstring)."""

    backend = ""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.arrivals: list[Arrival] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0

    def options(self) -> dict[str, Any]:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"consumer-{self.backend}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def count(self) -> int:
        return len(self.arrivals)

    def records(self) -> list[Arrival]:
        return list(self.arrivals)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)


class WebhookConsumer(Consumer):
    """An HTTP/1.1 receiver on loopback (keep-alive, 204 to every POST), on a thread per connection."""

    backend = "webhook"

    def __init__(self, tag: str, secret: str) -> None:
        super().__init__(tag)
        self.secret = secret
        consumer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                consumer.arrivals.append(
                    Arrival(
                        self.headers["webhook-id"],
                        urllib.parse.unquote(self.headers["jobguard-key"]),
                        int(self.headers["jobguard-seq"]),
                        time.time(),
                    )
                )
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                consumer.errors += 1  # a connection a killed worker dropped mid-request

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/{tag}"

    def options(self) -> dict[str, Any]:
        return {"BACKEND": "webhook", "URL": self.url, "SECRETS": [self.secret]}

    def _run(self) -> None:
        self.server.serve_forever(poll_interval=0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        super().close()


class RabbitMQConsumer(Consumer):
    """A topic exchange, a queue bound to it with ``#``, consumed as messages come (acked once recorded).

    ``durable``: both survive a broker restart (with the persistent messages the relay publishes);
    otherwise a restart deletes them, and the queue's messages with them.
    """

    backend = "rabbitmq"

    def __init__(self, tag: str, url: str, *, durable: bool = False) -> None:
        import pika

        super().__init__(tag)
        self.url = url
        self.exchange, self.queue = f"jobguard-{tag}-x", f"jobguard-{tag}-q"
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.exchange_declare(exchange=self.exchange, exchange_type="topic", durable=durable)
        channel.queue_declare(queue=self.queue, durable=durable)
        channel.queue_bind(queue=self.queue, exchange=self.exchange, routing_key="#")
        connection.close()

    def options(self) -> dict[str, Any]:
        return {"BACKEND": "rabbitmq", "URL": self.url, "EXCHANGE": self.exchange}

    def _run(self) -> None:
        import pika

        params = pika.URLParameters(self.url)
        params.client_properties = {"connection_name": f"jobguard consumer {self.tag}"}
        while not self._stop.is_set():
            try:
                connection = pika.BlockingConnection(params)
                channel = connection.channel()
                channel.basic_qos(prefetch_count=1000)

                def received(_channel: Any, method: Any, properties: Any, _body: bytes) -> None:
                    headers = properties.headers or {}
                    self.arrivals.append(
                        Arrival(
                            properties.message_id,
                            str(headers["jobguard-key"]),
                            int(headers["jobguard-seq"]),
                            time.time(),
                        )
                    )
                    _channel.basic_ack(method.delivery_tag)

                channel.basic_consume(queue=self.queue, on_message_callback=received)
                while not self._stop.is_set():
                    connection.process_data_events(time_limit=0.2)
                connection.close()
            except Exception:  # the broker closed us: unacked messages come back, read them again
                self.errors += 1
                self._stop.wait(0.5)

    def close(self) -> None:
        import pika

        super().close()
        with contextlib.suppress(Exception):
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.queue_delete(queue=self.queue)
            channel.exchange_delete(exchange=self.exchange)
            connection.close()


class RedisStreamConsumer(Consumer):
    """``XREAD BLOCK`` from the stream's start: every entry, in the stream's order."""

    backend = "redis"

    def __init__(self, tag: str, url: str) -> None:
        super().__init__(tag)
        self.url = url
        self.stream = f"jobguard-{tag}"

    def options(self) -> dict[str, Any]:
        return {"BACKEND": "redis", "URL": self.url, "STREAM": self.stream}

    def _run(self) -> None:
        import redis

        last = "0-0"
        client = redis.Redis.from_url(self.url)
        while not self._stop.is_set():
            try:
                for _stream, entries in client.xread({self.stream: last}, count=1000, block=200) or []:
                    now = time.time()
                    for entry_id, fields in entries:
                        last = entry_id
                        self.arrivals.append(
                            Arrival(
                                fields[b"id"].decode(),
                                fields[b"jobguard-key"].decode(),
                                int(fields[b"jobguard-seq"]),
                                now,
                            )
                        )
            except redis.RedisError:
                self.errors += 1
                self._stop.wait(0.5)
        client.close()

    def close(self) -> None:
        import redis

        super().close()
        with contextlib.suppress(Exception):
            client = redis.Redis.from_url(self.url)
            client.delete(self.stream)
            client.close()


class NatsConsumer(Consumer):
    """A JetStream stream the relay declares; a core subscription times arrivals, the stream is the record."""

    backend = "nats"

    def __init__(self, tag: str, url: str) -> None:
        super().__init__(tag)
        self.url = url
        self.stream = tag.replace("-", "_").upper()
        self.subject = f"jobguard-{tag}"
        self._loop: asyncio.AbstractEventLoop | None = None

    def options(self) -> dict[str, Any]:
        return {
            "BACKEND": "nats",
            "SERVERS": [self.url],
            "SUBJECT": self.subject + ".{key}",
            "STREAM": self.stream,
            "DECLARE": True,
        }

    def _run(self) -> None:
        import nats

        async def subscribe() -> None:
            async def received(msg: Any) -> None:
                headers = msg.headers or {}
                self.arrivals.append(
                    Arrival(
                        headers.get("Nats-Msg-Id", ""),
                        urllib.parse.unquote(headers.get("jobguard-key", "")),
                        int(headers.get("jobguard-seq", 0)),
                        time.time(),
                    )
                )

            client = await nats.connect(self.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
            await client.subscribe(self.subject + ".>", cb=received)
            # Until stop(): the stop event, waited on off the loop (the loop delivers meanwhile).
            await asyncio.get_running_loop().run_in_executor(None, self._stop.wait)
            await client.close()

        asyncio.run(subscribe())

    def count(self) -> int:
        """Messages the stream holds (0 until the relay declared it)."""
        import nats

        async def stored() -> int:
            client = await nats.connect(self.url)
            try:
                return int((await client.jetstream().stream_info(self.stream)).state.messages)
            except nats.js.errors.NotFoundError:
                return 0
            finally:
                await client.close()

        try:
            return asyncio.run(stored())
        except Exception:  # the server is down (a test restarts it): nothing countable now
            return 0

    def records(self) -> list[Arrival]:
        """The stream's messages in stored order (their time: when the subscription saw them, if it did)."""
        import nats

        seen = {arrival.id: arrival.at for arrival in self.arrivals}

        async def read() -> list[Arrival]:
            client = await nats.connect(self.url)
            try:
                js = client.jetstream()
                info = await js.stream_info(self.stream)
                out: list[Arrival] = []
                for seq in range(info.state.first_seq, info.state.last_seq + 1):
                    msg = await js.get_msg(self.stream, seq)
                    headers = msg.headers or {}
                    message_id = headers["Nats-Msg-Id"]
                    out.append(
                        Arrival(
                            message_id,
                            urllib.parse.unquote(headers["jobguard-key"]),
                            int(headers["jobguard-seq"]),
                            seen.get(message_id, 0.0),
                        )
                    )
                return out
            finally:
                await client.close()

        return asyncio.run(read())

    def close(self) -> None:
        import nats

        super().close()

        async def delete() -> None:
            client = await nats.connect(self.url)
            try:
                await client.jetstream().delete_stream(self.stream)
            finally:
                await client.close()

        with contextlib.suppress(Exception):
            asyncio.run(delete())


def tag(prefix: str) -> str:
    """A name no other run uses (streams, queues, exchanges)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclasses.dataclass
class Figures:
    """What a consumer saw of the messages it should have."""

    expected: int
    received: int
    lost: int
    unknown: int
    order_violations: int
    duplicates: int
    duplicates_under_another_id: int

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def check(records: Iterable[Arrival], expected: dict[str, tuple[str, int]]) -> Figures:
    """``records`` against ``expected`` (message id -> (key, seq)), first sights in order per key."""
    seen: set[str] = set()
    place_ids: dict[tuple[str, int], str] = {}
    last: dict[str, int] = {}
    received = duplicates = other_id = violations = unknown = 0
    for record in records:
        received += 1
        first_id = place_ids.setdefault((record.key, record.seq), record.id)
        if first_id != record.id:
            other_id += 1
        if record.id in seen:
            duplicates += 1
            continue
        seen.add(record.id)
        if expected.get(record.id) != (record.key, record.seq):
            unknown += 1
            continue
        if record.seq != last.get(record.key, 0) + 1:
            violations += 1
        last[record.key] = max(last.get(record.key, 0), record.seq)
    return Figures(
        expected=len(expected),
        received=received,
        lost=len(set(expected) - seen),
        unknown=unknown,
        order_violations=violations,
        duplicates=duplicates,
        duplicates_under_another_id=other_id,
    )
