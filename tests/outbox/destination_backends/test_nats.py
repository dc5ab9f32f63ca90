"""The NATS JetStream destination against the real server: acks, Nats-Msg-Id deduplication, threads."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_jobguard.outbox.destinations.base import PermanentDeliveryError, TransientDeliveryError
from django_jobguard.outbox.destinations.nats import NatsDestination
from tests.outbox.destination_backends.conftest import WORKER, closed_port, envelope, unique

pytest.importorskip("nats", reason="needs nats-py: pip install -e '.[outbox]'")


def stream_name() -> str:
    # Stream names take no dots or dashes trouble: letters, digits, underscores.
    return unique("JOBGUARD_TEST").replace("-", "_").upper()


def run(url: str, work: Any) -> Any:
    """Run ``work(jetstream)`` on a connection of the test's own, in a loop of its own."""
    import nats

    async def main() -> Any:
        client = await nats.connect(url)
        try:
            return await work(client.jetstream())
        finally:
            await client.close()

    return asyncio.run(main())


class Streams:
    def __init__(self, url: str) -> None:
        self.url = url
        self.names: list[str] = []

    def messages(self, name: str) -> list[Any]:
        async def read(js: Any) -> list[Any]:
            info = await js.stream_info(name)
            return [await js.get_msg(name, seq) for seq in range(1, info.state.last_seq + 1)]

        return list(run(self.url, read))

    def info(self, name: str) -> Any:
        async def read(js: Any) -> Any:
            return await js.stream_info(name)

        return run(self.url, read)

    def create(self, name: str, subjects: list[str]) -> None:
        async def add(js: Any) -> None:
            await js.add_stream(name=name, subjects=subjects)

        run(self.url, add)
        self.names.append(name)

    def delete_all(self) -> None:
        async def delete(js: Any) -> None:
            import nats.js.errors

            for name in self.names:
                try:
                    await js.delete_stream(name)
                except nats.js.errors.NotFoundError:
                    pass

        run(self.url, delete)


@pytest.fixture
def streams(nats_url: str) -> Iterator[Streams]:
    made = Streams(nats_url)
    yield made
    made.delete_all()


@pytest.fixture
def destinations() -> Iterator[list[NatsDestination]]:
    made: list[NatsDestination] = []
    yield made
    for destination in made:
        destination.close()


def nats_destination(made: list[NatsDestination], **options: object) -> NatsDestination:
    destination = NatsDestination.from_options(unique("orders-nats"), options)
    made.append(destination)
    return destination


def subject_prefix() -> str:
    return f"jobguard-test.{WORKER}.{unique('s')}"


def test_a_message_is_stored_with_its_id_and_headers(nats_url: str, streams: Streams, destinations) -> None:
    name, prefix = stream_name(), subject_prefix()
    streams.names.append(name)
    destination = nats_destination(
        destinations, SERVERS=[nats_url], SUBJECT=prefix + ".{key}", STREAM=name, DECLARE=True
    )
    message = envelope(key="order:42", seq=5, headers={"traceparent": "00-abc-def-01"}, attempt=2)
    destination.send(message)

    assert streams.info(name).config.subjects == [prefix + ".>"]
    [stored] = streams.messages(name)
    assert stored.subject == prefix + ".order:42"
    assert json.loads(stored.data) == message.payload
    assert stored.headers["Nats-Msg-Id"] == message.id
    assert stored.headers["jobguard-key"] == "order:42"
    assert (stored.headers["jobguard-seq"], stored.headers["jobguard-attempt"]) == ("5", "2")
    assert stored.headers["traceparent"] == "00-abc-def-01"


def test_a_redelivery_with_the_same_id_is_stored_once(nats_url: str, streams: Streams, destinations) -> None:
    name, prefix = stream_name(), subject_prefix()
    streams.names.append(name)
    destination = nats_destination(
        destinations, SERVERS=nats_url, SUBJECT=prefix + ".{key}", STREAM=name, DECLARE=True
    )
    message = envelope(key="order:1")
    destination.send(message)
    # After a crash between the send and its record, the relay sends it again: same id.
    redelivery = envelope(key="order:1", id=message.id, attempt=2)
    destination.send(redelivery)
    following = envelope(key="order:1", seq=2)
    destination.send(following)

    stored = streams.messages(name)
    assert [m.headers["Nats-Msg-Id"] for m in stored] == [message.id, following.id]
    assert streams.info(name).state.messages == 2
    assert stored[0].headers["jobguard-attempt"] == "1"  # the first copy kept, the second dropped


def test_an_existing_stream_is_used_as_it_is(nats_url: str, streams: Streams, destinations) -> None:
    name, prefix = stream_name(), subject_prefix()
    streams.create(name, [prefix + ".*"])
    destination = nats_destination(destinations, SERVERS=[nats_url], SUBJECT=prefix + ".fixed", STREAM=name)
    destination.send(envelope())
    assert streams.info(name).state.messages == 1


def test_no_stream_on_the_subject_is_transient(nats_url: str, destinations) -> None:
    destination = nats_destination(
        destinations, SERVERS=[nats_url], SUBJECT=subject_prefix() + ".{key}", TIMEOUT=5
    )
    with pytest.raises(TransientDeliveryError, match=r"no stream listens on it \(no responders\)"):
        destination.send(envelope())


def test_a_stream_other_than_the_expected_one_is_refused(
    nats_url: str, streams: Streams, destinations
) -> None:
    name, prefix = stream_name(), subject_prefix()
    streams.create(name, [prefix + ".>"])
    destination = nats_destination(
        destinations, SERVERS=[nats_url], SUBJECT=prefix + ".{key}", STREAM="JOBGUARD_TEST_SOMEWHERE_ELSE"
    )
    with pytest.raises(TransientDeliveryError, match="JetStream answered 400"):
        destination.send(envelope())
    assert streams.info(name).state.messages == 0


def test_an_unreachable_server_is_transient_within_the_timeout(destinations) -> None:
    destination = nats_destination(
        destinations, SERVERS=[f"nats://127.0.0.1:{closed_port()}"], SUBJECT="orders.{key}", TIMEOUT=1
    )
    with pytest.raises(TransientDeliveryError, match=r"no connection or no ack within 1 s"):
        destination.send(envelope())


def test_a_key_that_cannot_make_a_subject_is_permanent(nats_url: str, destinations) -> None:
    destination = nats_destination(destinations, SERVERS=[nats_url], SUBJECT="orders.{key}")
    for key in ("order 1", "order.*", "order.", ">"):
        with pytest.raises(PermanentDeliveryError, match=f"key {key!r} makes the subject"):
            destination.send(envelope(key=key))


def test_threads_share_one_connection_and_close_stops_the_loop(
    nats_url: str, streams: Streams, destinations
) -> None:
    name, prefix = stream_name(), subject_prefix()
    streams.names.append(name)
    destination = nats_destination(
        destinations, SERVERS=[nats_url], SUBJECT=prefix + ".{key}", STREAM=name, DECLARE=True
    )
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
    assert streams.info(name).state.messages == 100
    loops = [t for t in threading.enumerate() if t.name == f"jobguard-outbox-nats-{destination.name}"]
    assert len(loops) == 1

    destination.close()
    assert not loops[0].is_alive()
    destination.send(envelope(key="after-close"))  # a new loop and connection
    assert streams.info(name).state.messages == 101
    destination.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"\['SUBJECT'\] is required"),
        ({"SUBJECT": "orders.{tenant}"}, r"\['SUBJECT'\] uses unknown field \['tenant'\]"),
        ({"SUBJECT": "orders..{key}"}, r"\['SUBJECT'\] has an empty token"),
        ({"SUBJECT": "orders.*"}, r"\['SUBJECT'\] contains a wildcard"),
        ({"SUBJECT": "{key}.x", "STREAM": "S", "DECLARE": True}, r"\['SUBJECT'\] must start with a token"),
        ({"SUBJECT": "o.{key}", "DECLARE": True}, r"\['DECLARE'\] needs a STREAM"),
        ({"SUBJECT": "o.{key}", "STREAM": "a.b"}, r"\['STREAM'\] is not a stream name"),
        ({"SUBJECT": "o", "SERVERS": ["http://x:4222"]}, r"\['SERVERS'\] must be nats://"),
        ({"SUBJECT": "o", "SERVERS": []}, r"\['SERVERS'\] must not be empty"),
        ({"SUBJECT": "o", "TIMEOUT": -1}, r"\['TIMEOUT'\] must be a number of seconds above zero"),
        ({"SUBJECT": "o", "STREAMS": "S"}, r"unknown option 'STREAMS'"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=r"^JOBGUARD\['OUTBOX'\]\['DESTINATIONS'\]\['nats'\]") as caught:
        NatsDestination.from_options("nats", options)
    assert caught.match(message)


def test_from_options_starts_no_thread() -> None:
    before = threading.active_count()
    destination = NatsDestination.from_options("nats", {"SUBJECT": "orders.{key}"})
    assert threading.active_count() == before
    destination.close()
