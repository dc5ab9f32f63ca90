"""A real jobguard_worker relays published events to each real destination: order per key, ids, signatures."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.parse
from typing import Any

import pytest

from django_jobguard.models import OutboxMessage
from django_jobguard.outbox import publish, signing
from tests.conftest import WorkerProcesses, wait_for
from tests.outbox.destination_backends.conftest import Receiver, unique

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RELAY = {"RELAY_LEASE": 10.0, "RELAY_POLL_INTERVAL": 0.1, "RELAY_CONCURRENCY": 4}
KEYS = 6
PER_KEY = 10


def _in_order(records: list[tuple[str, str, int]]) -> dict[str, list[int]]:
    """Each key's seqs in arrival order, a redelivery (an id seen before) left out."""
    seen: set[str] = set()
    by_key: dict[str, list[int]] = {}
    for message_id, key, seq in records:
        if message_id in seen:
            continue
        seen.add(message_id)
        by_key.setdefault(key, []).append(seq)
    return by_key


def _relay(workers: WorkerProcesses, settings: Any, destinations: dict[str, Any], arrived: Any) -> None:
    settings.JOBGUARD = {**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}
    for n in range(KEYS * PER_KEY):
        publish(next(iter(destinations)), {"n": n}, key=f"order:{n % KEYS}", headers={"tenant": "t1"})
    env = {"JOBGUARD_TEST_OUTBOX": json.dumps({"DESTINATIONS": destinations, **RELAY})}
    proc = workers.start("--queue", "outbox-none", env=env)

    def done() -> bool:
        return arrived() >= KEYS * PER_KEY and not OutboxMessage.objects.exclude(state="delivered").exists()

    wait_for(done, 180, message=f"{KEYS * PER_KEY} messages delivered")
    workers.wait_started(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, workers.log(proc)


def _check(records: list[tuple[str, str, int]]) -> None:
    expected = {message.message_id.hex: (message.key, message.seq) for message in OutboxMessage.objects.all()}
    assert {message_id.replace("-", "") for message_id, _, _ in records} == set(expected)
    for key, seqs in _in_order(records).items():
        assert seqs == list(range(1, PER_KEY + 1)), f"{key}: {seqs}"


def test_a_worker_relays_signed_webhooks_in_order_per_key(
    workers: WorkerProcesses, settings: Any, receiver: Receiver
) -> None:
    secret = signing.generate_secret()
    _relay(
        workers,
        settings,
        {"hook": {"BACKEND": "webhook", "URL": receiver.url, "SECRETS": [secret], "TIMEOUT": 10}},
        lambda: len(receiver.requests),
    )
    records = []
    for request in list(receiver.requests):
        message_id = signing.verify([secret], request.headers, request.body)
        assert json.loads(request.body)["n"] >= 0
        assert request.headers["tenant"] == "t1"
        key = urllib.parse.unquote(request.headers["jobguard-key"])
        records.append((message_id, key, int(request.headers["jobguard-seq"])))
    _check(records)


def test_a_worker_relays_to_rabbitmq_in_order_per_key(
    workers: WorkerProcesses, settings: Any, rabbitmq_url: str
) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    exchange, queue = unique("jobguard-test-x"), unique("jobguard-test-q")
    channel.exchange_declare(exchange=exchange, exchange_type="topic")
    channel.queue_declare(queue=queue)
    channel.queue_bind(queue=queue, exchange=exchange, routing_key="#")
    try:
        _relay(
            workers,
            settings,
            {"amqp": {"BACKEND": "rabbitmq", "URL": rabbitmq_url, "EXCHANGE": exchange}},
            lambda: channel.queue_declare(queue=queue, passive=True).method.message_count,
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
    _check(records)


def test_a_worker_relays_to_nats_jetstream_in_order_per_key(
    workers: WorkerProcesses, settings: Any, nats_url: str
) -> None:
    import nats

    stream = unique("JOBGUARD_TEST").replace("-", "_").upper()
    subject = f"jobguard-test.{stream.lower()}"

    async def read(work: Any) -> Any:
        client = await nats.connect(nats_url)
        try:
            return await work(client.jetstream())
        finally:
            await client.close()

    async def count(js: Any) -> int:
        try:
            return int((await js.stream_info(stream)).state.messages)
        except nats.js.errors.NotFoundError:
            return 0

    async def messages(js: Any) -> list[Any]:
        last = (await js.stream_info(stream)).state.last_seq
        return [await js.get_msg(stream, seq) for seq in range(1, last + 1)]

    async def delete(js: Any) -> None:
        await js.delete_stream(stream)

    destinations = {
        "stream": {
            "BACKEND": "nats",
            "SERVERS": [nats_url],
            "SUBJECT": subject + ".{key}",
            "STREAM": stream,
            "DECLARE": True,
        }
    }
    try:
        _relay(workers, settings, destinations, lambda: asyncio.run(read(count)))
        stored = asyncio.run(read(messages))
    finally:
        asyncio.run(read(delete))
    records = [
        (
            m.headers["Nats-Msg-Id"],
            urllib.parse.unquote(m.headers["jobguard-key"]),
            int(m.headers["jobguard-seq"]),
        )
        for m in stored
    ]
    _check(records)
