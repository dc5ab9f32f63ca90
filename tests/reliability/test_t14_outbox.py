"""T14: the outbox relay under faults, with real brokers (issue 63's proof).

**Kills.** Two ``jobguard_worker`` processes relay messages, published while they run, to a
real destination (a webhook receiver on loopback, RabbitMQ, NATS JetStream, a Redis stream);
a worker chosen at random (seeded) is SIGKILLed each time another share of the messages has
arrived, and a new one started. The consumer reads what the destination holds: 0 lost, per-key
order (first sights) violated 0 times, duplicates only under the same message id, counted.
CI's size: 3,000 messages over 100 keys, 5 SIGKILLs per destination (about a minute each);
``--reliability-outbox-full`` runs the issue's: 50,000 over 1,000 keys, 20 SIGKILLs.

**Broker restarts.** Each broker the test starts itself, on loopback ports and a data directory
of its own, is SIGKILLed twice mid-run, kept down until the relay has failed a send to it, and
started again on the same data: nats-server (JetStream store), redis-server (append-only file,
``appendfsync always``: an acknowledged XADD is on disk, so a loss would be the relay's), and a
RabbitMQ node (``rabbitmq-server``, its own node name and Mnesia directory; a durable queue, and
the relay's persistent, confirmed messages). Besides, the machine's shared RabbitMQ closes the
workers' connections (``rabbitmqctl close_connection``: connection.close with CONNECTION_FORCED),
twice. Delivery resumes, nothing is lost, order is kept, duplicates only under the same id.

On PostgreSQL only (the scenario's figures are compared with the other T scenarios'), and the
brokers are those of tests/outbox/destination_backends: CI's PostgreSQL section sets their URLs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_jobguard.models import OutboxMessage, OutboxState
from django_jobguard.outbox import publish
from tests.conftest import WorkerProcesses, wait_for
from tests.outbox.destination_backends.conftest import nats_url, rabbitmq_url  # noqa: F401  (fixtures)
from tests.support import outbox_consumers as consumers
from tests.support.rabbitmq_node import RabbitMQNode, server_script
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

#: (messages, keys, SIGKILLs) of the kill scenario: CI's, and the issue's (--reliability-outbox-full).
CI_SIZE = (3_000, 100, 5)
FULL_SIZE = (50_000, 1_000, 20)
#: Relay settings in the workers: a killed worker's keys come back after the lease.
RELAY = {"RELAY_LEASE": 5.0, "RELAY_POLL_INTERVAL": 0.1, "RELAY_CONCURRENCY": 4}
#: Every destination: a send gives up well inside the lease; retries come fast and never run out
#: (the scenario is about crashes, not the backoff).
RELAY_OPTIONS = {"TIMEOUT": 3, "RETRY": {"base": 0.2, "max": 1.0, "jitter": 0.1}, "MAX_ATTEMPTS": 1000}
#: Messages one publishing transaction writes.
PUBLISH_CHUNK = 50
WORKERS = 2


def _consumer(backend: str, request: pytest.FixtureRequest, secret: str = "") -> consumers.Consumer:
    name = consumers.tag(f"t14-{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}")
    if backend == "webhook":
        from django_jobguard.outbox import signing

        return consumers.WebhookConsumer(name, secret or signing.generate_secret())
    if backend == "rabbitmq":
        return consumers.RabbitMQConsumer(name, request.getfixturevalue("rabbitmq_url"))
    if backend == "nats":
        return consumers.NatsConsumer(name, request.getfixturevalue("nats_url"))
    url = os.environ.get("JOBGUARD_TEST_REDIS_URL")
    if not url:
        pytest.skip("needs Redis: set JOBGUARD_TEST_REDIS_URL=redis://127.0.0.1:6379/0")
    return consumers.RedisStreamConsumer(name, url)


class Publisher(threading.Thread):
    """Publishes ``total`` messages over ``keys`` keys, ``PUBLISH_CHUNK`` per transaction, at ``rate``/s."""

    def __init__(self, destination: str, total: int, keys: int, rate: float) -> None:
        super().__init__(name="t14-publisher", daemon=True)
        self.destination, self.total, self.keys, self.rate = destination, total, keys, rate
        self.published = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection, transaction

        started = time.monotonic()
        try:
            while self.published < self.total:
                ahead = started + self.published / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)  # pacing to the publishing rate, not a wait on another process
                with transaction.atomic():
                    for n in range(self.published, min(self.published + PUBLISH_CHUNK, self.total)):
                        publish(self.destination, {"n": n}, key=f"k{n % self.keys}")
                self.published = min(self.published + PUBLISH_CHUNK, self.total)
        except BaseException as exc:
            self.error = exc
        finally:
            connection.close()


def _expected() -> dict[str, tuple[str, int]]:
    return {str(m): (k, s) for m, k, s in OutboxMessage.objects.values_list("message_id", "key", "seq")}


def _undelivered() -> int:
    return OutboxMessage.objects.exclude(state=OutboxState.DELIVERED).count()


def _stop(workers: WorkerProcesses, live: list[subprocess.Popen[bytes]]) -> dict[int, int | None]:
    for proc in live:
        workers.wait_started(proc)  # its handlers are in place: SIGTERM is a clean stop
        proc.send_signal(signal.SIGTERM)
    return {proc.pid: proc.wait(60) for proc in live}


@pytest.mark.scenario("T14")
@pytest.mark.parametrize("backend", ["webhook", "rabbitmq", "nats", "redis"])
def test_t14_relaying_workers_killed_lose_nothing_and_keep_each_keys_order(
    scenario: Any, workers: WorkerProcesses, settings: Any, request: pytest.FixtureRequest, backend: str
) -> None:
    scenario.id = f"T14-{backend}"
    full = request.config.getoption("--reliability-outbox-full")
    total, keys, kills = FULL_SIZE if full else CI_SIZE
    consumer = _consumer(backend, request)
    destinations = {"events": {**consumer.options(), **RELAY_OPTIONS}}
    settings.JOBGUARD = {**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}
    env = {"JOBGUARD_TEST_OUTBOX": json.dumps({"DESTINATIONS": destinations, **RELAY})}
    scenario.parameters = {
        "backend": backend,
        "messages": total,
        "keys": keys,
        "sigkills": kills,
        "workers": WORKERS,
        "relay": RELAY,
        "destination": RELAY_OPTIONS,
        "publish_chunk": PUBLISH_CHUNK,
    }
    consumer.start()
    # Published over the first half of the run at most (the relay's rate is not known here):
    # messages keep arriving while workers die.
    publisher = Publisher("events", total, keys, rate=max(total / 20, 100))
    publisher.start()
    try:
        live = [workers.start("--queue", "outbox-none", env=env) for _ in range(WORKERS)]
        began = time.monotonic()
        killed_at: list[float] = []
        for k in range(1, kills + 1):
            # Each kill after another share of the messages arrived, jittered within its share.
            threshold = int(total * (k - 1 + scenario.rng.uniform(0.3, 0.9)) / (kills + 1)) + 1
            wait_for(
                lambda t=threshold: consumer.count() >= t,
                600 if full else 300,
                message=f"{threshold} messages at the consumer before SIGKILL {k}",
            )
            victim = live.pop(scenario.rng.randrange(len(live)))
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(30)
            killed_at.append(time.monotonic())
            live.append(workers.start("--queue", "outbox-none", env=env))
        publisher.join(600 if full else 300)
        assert publisher.error is None, publisher.error
        assert publisher.published == total
        wait_for(lambda: _undelivered() == 0, 900 if full else 300, message="every message delivered")
        drained = time.monotonic()
        exit_codes = _stop(workers, live)
        # The last arrivals (and a redelivery's copy) may still be on their way to the consumer.
        wait_for(lambda: consumer.count() >= total, 60, message=f"{total} messages at the consumer")
        records = consumer.records()
    finally:
        consumer.close()
    figures = consumers.check(records, _expected())
    scenario.finish(
        **figures.as_dict(),
        sigkills=len(killed_at),
        seconds=round(drained - began, 1),
        messages_per_second=round(total / (drained - began), 1),
        settled_seconds_after_last_kill=round(drained - killed_at[-1], 1),
        consumer_errors=consumer.errors,
        exit_codes=exit_codes,
        load_average=os.getloadavg(),
    )
    print(
        f"T14 {backend}: {total} messages over {keys} keys, {len(killed_at)} SIGKILLs: lost {figures.lost}, "
        f"order violations {figures.order_violations}, duplicates {figures.duplicates} (same id), "
        f"under another id {figures.duplicates_under_another_id}; {total / (drained - began):.0f} msg/s, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    assert (figures.lost, figures.unknown) == (0, 0), figures
    assert figures.order_violations == 0, figures
    assert figures.duplicates_under_another_id == 0, figures
    assert len(killed_at) == kills
    assert set(exit_codes.values()) == {0}, exit_codes


# -- broker restarts ----------------------------------------------------------------------------

RESTART_MESSAGES, RESTART_KEYS = 1_500, 20


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class NatsServer:
    """nats-server with JetStream on a port and store directory of the test's own."""

    def __init__(self, directory: Path) -> None:
        self.binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        if not os.path.exists(self.binary):
            pytest.skip("needs nats-server (apt-get install nats-server)")
        self.port = _free_port()
        self.store = directory / "jetstream"
        self.log = directory / "nats-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: _answers(self.port), 30, message=f"nats-server on port {self.port}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def _socket_ports(pid: int) -> set[int]:
    """Local TCP ports of ``pid``'s sockets (from /proc: its socket inodes, then /proc/net/tcp)."""
    inodes = set()
    with_fds = Path(f"/proc/{pid}/fd")
    for fd in with_fds.iterdir() if with_fds.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _close_rabbitmq_connections(pids: list[int]) -> tuple[int, int]:
    """Have RabbitMQ close the connections that come from ``pids``: (connections listed, closed)."""
    ports = set().union(*(_socket_ports(pid) for pid in pids))
    listing = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "peer_port"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    closed = 0
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and int(parts[1]) in ports:
            subprocess.run(
                ["rabbitmqctl", "-q", "close_connection", parts[0], "T14: the broker closes the relay"],
                capture_output=True,
                timeout=60,
                check=False,
            )
            closed += 1
    return len(listing.splitlines()) - 1, closed


def _failures() -> int:
    return (
        sum(OutboxMessage.objects.values_list("attempts", flat=True))
        - OutboxMessage.objects.filter(state=OutboxState.DELIVERED).count()
    )


def _publish_one_per_key() -> None:
    """One more message per key, published by the test during a round (the broker down, or its
    connections just closed): the relay has sends to fail however far the run got, even if the
    publisher finished during a long restart, and these must arrive once the broker is back.

    Each in a transaction of its own: one taking several keys in another order than the
    publisher's concurrent transaction deadlocks with it on PostgreSQL (each holds a key's
    sequence the other waits for)."""
    from django.db import transaction

    for k in range(RESTART_KEYS):
        with transaction.atomic():
            publish("events", {"n": "during-the-outage"}, key=f"k{k}")


def _run_restarts(
    scenario: Any,
    workers: WorkerProcesses,
    settings: Any,
    consumer: consumers.Consumer,
    restart: Any,
    rounds: int,
) -> dict[str, Any]:
    destinations = {"events": {**consumer.options(), **RELAY_OPTIONS}}
    settings.JOBGUARD = {**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}
    env = {"JOBGUARD_TEST_OUTBOX": json.dumps({"DESTINATIONS": destinations, **RELAY})}
    consumer.start()
    publisher = Publisher("events", RESTART_MESSAGES, RESTART_KEYS, rate=RESTART_MESSAGES / 30)
    publisher.start()
    live = [workers.start("--queue", "outbox-none", env=env) for _ in range(WORKERS)]
    outages = []
    for k in range(1, rounds + 1):
        threshold = RESTART_MESSAGES * k // (rounds + 2)
        wait_for(lambda t=threshold: _delivered() >= t, 300, message=f"{threshold} delivered")
        failed = _failures()
        outages.append(restart(live, lambda f=failed: _failures() > f))
    publisher.join(300)
    assert publisher.error is None, publisher.error
    wait_for(lambda: _undelivered() == 0, 300, message="every message delivered after the restarts")
    exit_codes = _stop(workers, live)
    total = OutboxMessage.objects.count()  # the publisher's and those published during the rounds
    # The last arrivals may still be on their way. Some that never come are lost: the figures
    # below count them (the assertion names how many, not a timeout).
    with contextlib.suppress(pytest.fail.Exception):
        wait_for(lambda: consumer.count() >= total, 60, message=f"{total} messages at the consumer")
    figures = consumers.check(consumer.records(), _expected())
    return {"figures": figures, "outages": outages, "exit_codes": exit_codes}


def _delivered() -> int:
    return OutboxMessage.objects.filter(state=OutboxState.DELIVERED).count()


def _kill_and_restart(kill: Callable[[], None], start: Callable[[], None]) -> Callable[..., dict[str, float]]:
    """A round of :func:`_run_restarts`: SIGKILL the server, keep it down until the relay failed a
    send to it (the restart is one it lives through), start it again on the same data."""

    def restart(_live: list[Any], relay_saw_it: Callable[[], bool]) -> dict[str, float]:
        down = time.monotonic()
        kill()
        _publish_one_per_key()
        wait_for(relay_saw_it, 120, message="the relay to fail a send to the stopped server")
        starting = time.monotonic()
        start()
        now = time.monotonic()
        return {"down_seconds": round(now - down, 2), "start_seconds": round(now - starting, 2)}

    return restart


def _assert_nothing_lost(scenario: Any, run: dict[str, Any], label: str, how: str) -> None:
    """Record the restart run's figures, then: 0 lost, 0 order violations, duplicates only under
    the same id, every worker stopped cleanly."""
    figures = run["figures"]
    scenario.parameters = {
        "messages": RESTART_MESSAGES,
        "keys": RESTART_KEYS,
        "restarts": 2,
        "how": how,
        "published_during_each_round": f"one per key, {RESTART_KEYS}",
    }
    scenario.finish(**figures.as_dict(), restarts=run["outages"], exit_codes=run["exit_codes"])
    print(f"T14 {label} {run['outages']}: {figures}")
    assert (figures.lost, figures.unknown, figures.order_violations) == (0, 0, 0), figures
    assert figures.duplicates_under_another_id == 0, figures
    assert set(run["exit_codes"].values()) == {0}, run["exit_codes"]


@pytest.mark.scenario("T14-restart")
def test_t14_a_nats_server_killed_and_restarted_mid_run_loses_nothing(
    scenario: Any, workers: WorkerProcesses, settings: Any, tmp_path: Path
) -> None:
    pytest.importorskip("nats", reason="needs nats-py: pip install -e '.[outbox]'")
    scenario.id = "T14-restart-nats"
    server = NatsServer(tmp_path)
    server.start()
    consumer = consumers.NatsConsumer(consumers.tag("t14-restart"), server.url)
    restart = _kill_and_restart(server.kill, server.start)
    try:
        run = _run_restarts(scenario, workers, settings, consumer, restart, rounds=2)
    finally:
        consumer.close()
        server.stop()
    _assert_nothing_lost(scenario, run, "NATS restarts", "SIGKILL")


def _stream_records(url: str, stream: str) -> list[consumers.Arrival]:
    """What the Redis stream holds, in its order (``XRANGE``), read back after the run."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return [
            consumers.Arrival(
                fields[b"id"].decode(), fields[b"jobguard-key"].decode(), int(fields[b"jobguard-seq"]), 0.0
            )
            for _entry_id, fields in client.xrange(stream)
        ]
    finally:
        client.close()


@pytest.mark.scenario("T14-restart")
def test_t14_a_redis_server_killed_and_restarted_mid_run_loses_nothing(
    scenario: Any, workers: WorkerProcesses, settings: Any, tmp_path: Path
) -> None:
    pytest.importorskip("redis", reason="needs redis-py: pip install -e '.[redis]'")
    if not shutil.which("redis-server"):
        if os.environ.get("JOBGUARD_TEST_REDIS_URL"):
            pytest.fail(
                "JOBGUARD_TEST_REDIS_URL is set but redis-server is not installed: the test starts its own"
            )
        pytest.skip("needs redis-server (apt-get install redis-server): the test starts a server of its own")
    scenario.id = "T14-restart-redis"
    # The append-only file with appendfsync always, as a deployment that relies on its stream
    # would run: an XADD is on disk before Redis answers it, so what the relay was told was taken
    # survives the SIGKILL. Without it a restart empties the stream (everysec: loses up to a
    # second), a loss of the server's own that would hide whether the relay lost anything.
    server = RedisServer(tmp_path, appendfsync="always")
    server.start()
    consumer = consumers.RedisStreamConsumer(consumers.tag("t14-restart"), server.url)
    restart = _kill_and_restart(server.crash, server.start)
    try:
        run = _run_restarts(scenario, workers, settings, consumer, restart, rounds=2)
        stored = consumers.check(_stream_records(server.url, consumer.stream), _expected())
    finally:
        consumer.close()
        server.stop()
    _assert_nothing_lost(scenario, run, "Redis restarts", "SIGKILL, appendonly yes, appendfsync always")
    # And the stream itself, read back after the restarts, holds each message in each key's order.
    assert (stored.lost, stored.unknown, stored.order_violations) == (0, 0, 0), stored
    assert stored.duplicates_under_another_id == 0, stored


@pytest.mark.scenario("T14-restart")
def test_t14_a_rabbitmq_node_killed_and_restarted_mid_run_loses_nothing(
    scenario: Any, workers: WorkerProcesses, settings: Any, tmp_path: Path
) -> None:
    pytest.importorskip("pika", reason="needs pika: pip install -e '.[outbox]'")
    script = server_script()
    if script is None:
        if os.environ.get("JOBGUARD_TEST_RABBITMQ_URL"):
            pytest.fail(
                "JOBGUARD_TEST_RABBITMQ_URL is set but rabbitmq-server is not installed: "
                "the test starts a node of its own"
            )
        pytest.skip(
            "needs rabbitmq-server (apt-get install rabbitmq-server): the test starts a node of its own"
        )
    scenario.id = "T14-restart-rabbitmq-node"
    node = RabbitMQNode(tmp_path, script)
    node.start()
    # A durable exchange and queue: with the relay's persistent, confirmed messages they survive
    # the node's restart (a non-durable queue would not, and its messages with it).
    consumer = consumers.RabbitMQConsumer(consumers.tag("t14-restart"), node.url, durable=True)
    restart = _kill_and_restart(node.kill, node.start)
    try:
        run = _run_restarts(scenario, workers, settings, consumer, restart, rounds=2)
    finally:
        consumer.close()
        node.stop()
    _assert_nothing_lost(scenario, run, "RabbitMQ node restarts", "SIGKILL of the node (beam), durable queue")


@pytest.mark.scenario("T14-restart")
def test_t14_rabbitmq_closing_the_relays_connections_mid_run_loses_nothing(
    scenario: Any, workers: WorkerProcesses, settings: Any, request: pytest.FixtureRequest
) -> None:
    if not shutil.which("rabbitmqctl"):
        pytest.skip("needs rabbitmqctl on this machine (the broker closes the connections)")
    scenario.id = "T14-restart-rabbitmq"
    consumer = _consumer("rabbitmq", request)

    def restart(live: list[subprocess.Popen[bytes]], relay_saw_it: Any) -> dict[str, float]:
        listed = closed = 0
        deadline = time.monotonic() + 120
        # Until the broker closed some and the relay has failed a send since (each round lists
        # the connections anew: the relay opens new ones after a close). A failure of another
        # cause (a timeout on a loaded host) alone does not end the round.
        while (not closed or not relay_saw_it()) and time.monotonic() < deadline:
            listed, closing = _close_rabbitmq_connections([proc.pid for proc in live])
            closed += closing
            if closing:
                _publish_one_per_key()
        assert closed and relay_saw_it(), (
            f"the relay never saw its connections closed ({closed} closed, {listed} listed)"
        )
        return {"connections_closed": closed}

    try:
        run = _run_restarts(scenario, workers, settings, consumer, restart, rounds=2)
    finally:
        consumer.close()
    _assert_nothing_lost(
        scenario,
        run,
        "RabbitMQ connections closed",
        "rabbitmqctl close_connection of the workers' connections (the broker is shared)",
    )
