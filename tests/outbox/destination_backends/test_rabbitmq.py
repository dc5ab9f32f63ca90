"""The RabbitMQ destination against the real broker: confirms, a consumer, unroutable, a killed connection."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_jobguard.outbox.destinations.base import PermanentDeliveryError, TransientDeliveryError
from django_jobguard.outbox.destinations.rabbitmq import RabbitMQDestination
from tests.conftest import wait_for
from tests.outbox.destination_backends.conftest import closed_port, envelope, unique

pika = pytest.importorskip("pika", reason="needs pika: pip install -e '.[outbox]'")


class Broker:
    """The test's own connection: declares, binds, reads queues, and deletes what it made."""

    def __init__(self, url: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.exchanges: list[str] = []
        self.queues: list[str] = []

    def exchange(self, name: str, kind: str = "topic") -> str:
        self.channel.exchange_declare(exchange=name, exchange_type=kind, durable=False)
        self.exchanges.append(name)
        return name

    def queue(self, exchange: str, binding: str = "#") -> str:
        name = unique("jobguard-test-q")
        self.channel.queue_declare(queue=name, durable=False)
        self.channel.queue_bind(queue=name, exchange=exchange, routing_key=binding)
        self.queues.append(name)
        return name

    def exchange_exists(self, name: str) -> bool:
        probe = self.connection.channel()
        try:
            probe.exchange_declare(exchange=name, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404
            return False
        probe.close()
        return True

    def drain(self, queue: str) -> list[tuple[Any, Any, bytes]]:
        messages = []
        while True:
            method, properties, body = self.channel.basic_get(queue=queue, auto_ack=True)
            if method is None:
                return messages
            messages.append((method, properties, body))

    def close(self) -> None:
        if not self.channel.is_open:
            self.channel = self.connection.channel()
        for queue in self.queues:
            self.channel.queue_delete(queue=queue)
        for exchange in self.exchanges:
            self.channel.exchange_delete(exchange=exchange)
        self.connection.close()


@pytest.fixture
def broker(rabbitmq_url: str) -> Iterator[Broker]:
    made = Broker(rabbitmq_url)
    yield made
    made.close()


@pytest.fixture
def destinations() -> Iterator[list[RabbitMQDestination]]:
    made: list[RabbitMQDestination] = []
    yield made
    for destination in made:
        destination.close()


def rabbitmq(url: str, made: list[RabbitMQDestination], **options: object) -> RabbitMQDestination:
    destination = RabbitMQDestination.from_options(unique("orders-amqp"), {"URL": url, **options})
    made.append(destination)
    return destination


def test_a_consumer_gets_the_message_id_headers_and_a_persistent_body(
    rabbitmq_url: str, broker: Broker, destinations
) -> None:
    exchange = broker.exchange(unique("jobguard-test-x"))
    queue = broker.queue(exchange, "order.*")
    destination = rabbitmq(rabbitmq_url, destinations, EXCHANGE=exchange)
    message = envelope(key="order.42", seq=7, headers={"traceparent": "00-abc-def-01"}, attempt=3)
    destination.send(message)

    # The send returned after the broker's confirm: the message is in the queue already.
    [(method, properties, body)] = broker.drain(queue)
    assert method.routing_key == "order.42"
    assert method.exchange == exchange
    assert properties.message_id == message.id
    assert properties.delivery_mode == 2
    assert properties.content_type == "application/json"
    assert properties.timestamp == int(message.published_at.timestamp())
    assert properties.headers == {
        "traceparent": "00-abc-def-01",
        "jobguard-key": "order.42",
        "jobguard-seq": "7",
        "jobguard-attempt": "3",
        "jobguard-destination": "events",
    }
    assert json.loads(body) == message.payload


def test_a_fixed_routing_key_template(rabbitmq_url: str, broker: Broker, destinations) -> None:
    exchange = broker.exchange(unique("jobguard-test-x"), "direct")
    queue = broker.queue(exchange, "orders.events")
    destination = rabbitmq(rabbitmq_url, destinations, EXCHANGE=exchange, ROUTING_KEY="orders.{destination}")
    destination.send(envelope(key="anything"))
    [(method, _, _)] = broker.drain(queue)
    assert method.routing_key == "orders.events"


def test_an_unroutable_message_is_transient_and_goes_once_a_queue_is_bound(
    rabbitmq_url: str, broker: Broker, destinations
) -> None:
    name = unique("jobguard-test-x")
    destination = rabbitmq(rabbitmq_url, destinations, EXCHANGE=name, DECLARE=True, EXCHANGE_TYPE="topic")
    broker.exchanges.append(name)  # declared by the destination; deleted by the fixture
    message = envelope(key="order.1")
    with pytest.raises(
        TransientDeliveryError,
        match=rf"exchange '{name}', routing key 'order.1': unroutable, no queue is bound for it",
    ):
        destination.send(message)
    assert broker.exchange_exists(name)  # DECLARE declared it

    queue = broker.queue(name, "order.#")
    destination.send(message)  # the same connection, once a queue takes it
    [(_, properties, _)] = broker.drain(queue)
    assert properties.message_id == message.id


def test_a_missing_exchange_is_transient_then_delivers_once_it_exists(
    rabbitmq_url: str, broker: Broker, destinations
) -> None:
    name = unique("jobguard-test-x")
    destination = rabbitmq(rabbitmq_url, destinations, EXCHANGE=name)
    with pytest.raises(
        TransientDeliveryError, match=r"404 NOT_FOUND.*\(declare the exchange, or set DECLARE\)"
    ):
        destination.send(envelope())
    queue = broker.queue(broker.exchange(name))
    destination.send(envelope())
    assert len(broker.drain(queue)) == 1


def _rabbitmqctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _close_from_the_server(connection_name: str) -> None:
    """Close one connection from the broker's side (``close_connection <pid>``), as a shutdown does.

    Only the destination's own connection: other tests and runs on the broker keep theirs.
    """
    found: list[str] = []

    def listed() -> bool:
        out = _rabbitmqctl("list_connections", "--no-table-headers", "pid", "client_properties")
        assert out.returncode == 0, out.stderr
        found[:] = [line.split("\t")[0] for line in out.stdout.splitlines() if connection_name in line]
        return bool(found)

    wait_for(listed, timeout=60, interval=0.5, message=f"the broker lists {connection_name!r}")
    closed = _rabbitmqctl("close_connection", found[0], "closed by the jobguard test")
    assert closed.returncode == 0, closed.stderr


def test_a_connection_closed_by_the_broker_is_transient_then_the_next_send_reconnects(
    rabbitmq_url: str, broker: Broker, destinations
) -> None:
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl (the broker's own tool) to close a connection from the server")
    if (probe := _rabbitmqctl("list_connections", "--no-table-headers", "pid")).returncode != 0:
        pytest.skip(f"rabbitmqctl cannot reach the broker's node here: {probe.stderr.strip()[:200]}")
    exchange = broker.exchange(unique("jobguard-test-x"))
    queue = broker.queue(exchange)
    destination = rabbitmq(rabbitmq_url, destinations, EXCHANGE=exchange)
    first, second, third = envelope(seq=1), envelope(seq=2), envelope(seq=3)
    destination.send(first)
    _close_from_the_server(destination.connection_name)

    with pytest.raises(TransientDeliveryError, match=r"connection lost: ConnectionClosedByBroker.*320"):
        destination.send(second)
    destination.send(third)  # a new connection

    ids = [properties.message_id for _, properties, _ in broker.drain(queue)]
    assert ids == [first.id, third.id]


def test_a_connection_left_idle_is_replaced_before_use(
    rabbitmq_url: str, broker: Broker, destinations
) -> None:
    # With a 2 s heartbeat nobody answers while the destination is idle, the broker drops the
    # connection after a few seconds; the next send must not find it dead.
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("needs rabbitmqctl (the broker's own tool) to see the broker drop a connection")
    if (probe := _rabbitmqctl("list_connections", "--no-table-headers", "pid")).returncode != 0:
        pytest.skip(f"rabbitmqctl cannot reach the broker's node here: {probe.stderr.strip()[:200]}")
    exchange = broker.exchange(unique("jobguard-test-x"))
    queue = broker.queue(exchange)
    destination = rabbitmq(rabbitmq_url + "?heartbeat=2", destinations, EXCHANGE=exchange)
    first, second = envelope(seq=1), envelope(seq=2)
    destination.send(first)

    def dropped() -> bool:
        out = _rabbitmqctl("list_connections", "--no-table-headers", "client_properties")
        return out.returncode == 0 and destination.connection_name not in out.stdout

    wait_for(dropped, timeout=60, interval=1, message="the broker drops the idle connection")
    destination.send(second)
    ids = [properties.message_id for _, properties, _ in broker.drain(queue)]
    assert ids == [first.id, second.id]


def test_an_unreachable_broker_is_transient(destinations) -> None:
    destination = rabbitmq(f"amqp://guest:guest@127.0.0.1:{closed_port()}/%2F", destinations, TIMEOUT=2)
    with pytest.raises(TransientDeliveryError, match="cannot connect or declare: AMQPConnectionError"):
        destination.send(envelope())


def test_sends_from_several_threads_take_turns_on_one_connection(
    rabbitmq_url: str, broker: Broker, destinations
) -> None:
    exchange = broker.exchange(unique("jobguard-test-x"))
    queue = broker.queue(exchange)
    destination = rabbitmq(rabbitmq_url, destinations, EXCHANGE=exchange)
    errors: list[BaseException] = []

    def deliver(thread: int) -> None:
        try:
            for seq in range(25):
                destination.send(envelope(key=f"k{thread}", seq=seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    received = broker.drain(queue)
    assert len(received) == 100
    # Each key's messages in the order its thread sent them.
    for thread in range(4):
        seqs = [
            int(p.headers["jobguard-seq"])
            for _, p, _ in received
            if p.headers["jobguard-key"] == f"k{thread}"
        ]
        assert seqs == list(range(25))


def test_a_routing_key_over_255_bytes_is_permanent(rabbitmq_url: str, destinations) -> None:
    destination = rabbitmq(rabbitmq_url, destinations, EXCHANGE="amq.topic")
    with pytest.raises(PermanentDeliveryError, match=r"routing key of message \S+ is over 255 bytes"):
        destination.send(envelope(key="k" * 256))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"URL": "http://127.0.0.1/"}, r"\['URL'\] must be an amqp:// or amqps:// URL, not a 'http' one"),
        ({"DECLARE": True}, r"\['DECLARE'\] needs an EXCHANGE"),
        ({"DECLARE": "yes", "EXCHANGE": "x"}, r"\['DECLARE'\] must be True or False, not 'yes'"),
        ({"EXCHANGE_TYPE": "x-delayed"}, r"\['EXCHANGE_TYPE'\] must be one of \['direct', 'fanout'"),
        ({"ROUTING_KEY": "{tenant}"}, r"\['ROUTING_KEY'\] uses unknown field \['tenant'\]"),
        ({"ROUTING_KEY": "{key"}, r"\['ROUTING_KEY'\] is not a valid template"),
        ({"EXCHANG": "orders"}, r"unknown option 'EXCHANG'"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, object], message: str) -> None:
    pytest.importorskip("pika")
    with pytest.raises(ValueError, match=r"^JOBGUARD\['OUTBOX'\]\['DESTINATIONS'\]\['amqp'\]") as caught:
        RabbitMQDestination.from_options("amqp", options)
    assert caught.match(message)


def test_the_url_is_not_shown_in_errors() -> None:
    with pytest.raises(ValueError) as caught:
        RabbitMQDestination.from_options("amqp", {"URL": "http://user:s3cret@host/"})
    assert "s3cret" not in str(caught.value)
