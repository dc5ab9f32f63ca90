"""A worker's link to its destination cut mid-run, twice: delivery resumes, nothing lost, order kept per key.

The worker reaches RabbitMQ, NATS or the webhook receiver through a TCP forwarder
(tests/support/tcp_proxy.py) that the test cuts (connections closed, new ones refused) and
then breaks harder (what is in flight held, then every connection reset), restoring it each
time, while the test keeps publishing (before, during and after each break, so the relay is
busy when the link goes): from the worker's side, a broker gone and back. Only the test's own
connections go through it, so the shared servers and other runs carry on.
"""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_jobguard.models import OutboxMessage, OutboxState
from django_jobguard.outbox import publish, signing
from tests.conftest import WorkerProcesses, wait_for
from tests.outbox.destination_backends.conftest import Receiver, unique
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KEYS = 10
TOTAL = 1500
RELAY = {"RELAY_LEASE": 15.0, "RELAY_POLL_INTERVAL": 0.1, "RELAY_CONCURRENCY": 4}
# Retries come back fast and never run out: the test is about the link, not the backoff.
FAST_RETRY = {"RETRY": {"base": 0.2, "max": 1.0, "jitter": 0.0}, "MAX_ATTEMPTS": 1000}

Record = tuple[str, str, int]


def _delivered() -> int:
    return OutboxMessage.objects.filter(state=OutboxState.DELIVERED).count()


def _failures() -> int:
    return sum(OutboxMessage.objects.values_list("attempts", flat=True))


def _run_with_cuts(
    workers: WorkerProcesses, settings: Any, proxy: TcpProxy, name: str, options: dict[str, Any]
) -> None:
    destinations = {name: {**options, **FAST_RETRY}}
    settings.JOBGUARD = {**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}
    published = 0

    def publish_some(count: int) -> None:
        nonlocal published
        for n in range(published, published + count):
            publish(name, {"n": n}, key=f"order:{n % KEYS}")
        published += count

    batch = TOTAL // 5
    publish_some(batch)
    env = {"JOBGUARD_TEST_OUTBOX": json.dumps({"DESTINATIONS": destinations, **RELAY})}
    proc = workers.start("--queue", "outbox-none", env=env)
    wait_for(lambda: _delivered() > 0, 180, message="the relay to deliver")
    for breaking in (proxy.cut, lambda: (proxy.hold(), proxy.drop())):
        failed_before = _failures()
        breaking()
        # Published while the link is down: the relay must try them, so it sees the break
        # however fast it was until now.
        publish_some(batch)
        wait_for(lambda f=failed_before: _failures() > f, 120, message="the relay to see the link down")
        proxy.restore()
        publish_some(batch)

    assert published == TOTAL
    wait_for(lambda: _delivered() == TOTAL, 300, message=f"all {TOTAL} delivered after the cuts")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, workers.log(proc)
    assert not OutboxMessage.objects.exclude(state=OutboxState.DELIVERED).exists()


def _check(records: list[Record]) -> int:
    """Every message arrived, each key's in order; returns the duplicates (same id again)."""
    expected = {str(m.message_id) for m in OutboxMessage.objects.all()}
    seen: set[str] = set()
    by_key: dict[str, list[int]] = {}
    duplicates = 0
    for message_id, key, seq in records:
        if message_id in seen:
            duplicates += 1
            continue
        seen.add(message_id)
        by_key.setdefault(key, []).append(seq)
    assert seen == expected, f"{len(expected - seen)} lost, {len(seen - expected)} unknown"
    for key, seqs in by_key.items():
        assert seqs == list(range(1, TOTAL // KEYS + 1)), f"{key} out of order"
    return duplicates


@pytest.fixture
def proxies() -> Iterator[Callable[[int], TcpProxy]]:
    made: list[TcpProxy] = []

    def make(port: int) -> TcpProxy:
        proxy = TcpProxy(port)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def test_webhooks_resume_after_the_link_is_cut(
    workers: WorkerProcesses, settings: Any, receiver: Receiver, proxies: Any
) -> None:
    parts = urllib.parse.urlsplit(receiver.url)
    proxy = proxies(parts.port)
    secret = signing.generate_secret()
    url = f"http://127.0.0.1:{proxy.port}{parts.path}"
    _run_with_cuts(
        workers,
        settings,
        proxy,
        "hook",
        {"BACKEND": "webhook", "URL": url, "SECRETS": [secret], "TIMEOUT": 2},
    )
    records = [
        (
            signing.verify([secret], r.headers, r.body),
            urllib.parse.unquote(r.headers["jobguard-key"]),
            int(r.headers["jobguard-seq"]),
        )
        for r in list(receiver.requests)
    ]
    duplicates = _check(records)
    print(f"webhook: {TOTAL} messages, 2 cuts, {duplicates} duplicates (same id)")


def test_rabbitmq_resumes_after_the_link_is_cut(
    workers: WorkerProcesses, settings: Any, rabbitmq_url: str, proxies: Any
) -> None:
    import pika

    parts = urllib.parse.urlsplit(rabbitmq_url)
    proxy = proxies(parts.port or 5672)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    exchange, queue = unique("jobguard-test-x"), unique("jobguard-test-q")
    channel.exchange_declare(exchange=exchange, exchange_type="topic")
    channel.queue_declare(queue=queue)
    channel.queue_bind(queue=queue, exchange=exchange, routing_key="#")
    url = parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}").geturl()
    try:
        _run_with_cuts(
            workers,
            settings,
            proxy,
            "amqp",
            {"BACKEND": "rabbitmq", "URL": url, "EXCHANGE": exchange, "TIMEOUT": 2},
        )
        records = []
        while True:
            method, properties, _body = channel.basic_get(queue=queue, auto_ack=True)
            if method is None:
                break
            headers = properties.headers
            records.append((properties.message_id, headers["jobguard-key"], int(headers["jobguard-seq"])))
    finally:
        channel.queue_delete(queue=queue)
        channel.exchange_delete(exchange=exchange)
        connection.close()
    duplicates = _check(records)
    print(f"rabbitmq: {TOTAL} messages, 2 cuts, {duplicates} duplicates (same id)")


def test_nats_resumes_after_the_link_is_cut(
    workers: WorkerProcesses, settings: Any, nats_url: str, proxies: Any
) -> None:
    import nats

    proxy = proxies(urllib.parse.urlsplit(nats_url).port or 4222)
    stream = unique("JOBGUARD_TEST").replace("-", "_").upper()

    async def with_js(work: Any) -> Any:
        client = await nats.connect(nats_url)
        try:
            return await work(client.jetstream())
        finally:
            await client.close()

    async def stored(js: Any) -> list[Any]:
        last = (await js.stream_info(stream)).state.last_seq
        return [await js.get_msg(stream, seq) for seq in range(1, last + 1)]

    async def delete(js: Any) -> None:
        await js.delete_stream(stream)

    options = {
        "BACKEND": "nats",
        "SERVERS": [f"nats://127.0.0.1:{proxy.port}"],
        "SUBJECT": f"jobguard-test.{stream.lower()}.{{key}}",
        "STREAM": stream,
        "DECLARE": True,
        "TIMEOUT": 2,
    }
    try:
        _run_with_cuts(workers, settings, proxy, "stream", options)
        messages = asyncio.run(with_js(stored))
    finally:
        asyncio.run(with_js(delete))
    records = [
        (
            m.headers["Nats-Msg-Id"],
            urllib.parse.unquote(m.headers["jobguard-key"]),
            int(m.headers["jobguard-seq"]),
        )
        for m in messages
    ]
    duplicates = _check(records)
    print(f"nats: {TOTAL} messages, 2 cuts, {duplicates} duplicates (same id)")
