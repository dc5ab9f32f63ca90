#!/usr/bin/env python
"""The outbox relay: messages/s to each real destination with 2 worker processes, and commit-to-delivery.

    benchmarks/bench_outbox.py                                    # every destination, both relays, 3 runs
    benchmarks/bench_outbox.py --destinations redis,webhook --runs 5 --messages 10000
    benchmarks/bench_outbox.py --db-url postgres://postgres@127.0.0.1:5432/jg_outbox_bench \\
        --rabbitmq-url amqp://guest:guest@127.0.0.1:5672/%2F --nats-url nats://127.0.0.1:4222 \\
        --redis-url redis://127.0.0.1:6379/5

Each run, for each destination (a webhook receiver on loopback, RabbitMQ with publisher
confirms, NATS JetStream, a Redis stream: the consumers of ``tests/support/outbox_consumers.py``,
reading as messages arrive) and each relay:

- **throughput**: ``--messages`` messages over ``--keys`` keys are published first (transactions
  of 500), then 2 relay processes start; messages/s is the messages over the time from the first
  arrival at the consumer to the last (the processes' start-up left out). CPU per message is
  the relay processes' (user + system, from /proc) over the same span, over the messages.
- **latency**: the same processes, idle, then ``--latency-messages`` published one per
  transaction at ``--latency-rate``/s; commit-to-delivery is the consumer's arrival time minus
  the time the publishing transaction's commit returned (same clock), p50 and p99.
- **order**: per-key order violations the consumer saw (first sights), and duplicates.

The relays:

- ``jobguard``: ``jobguard_worker --concurrency 1`` x 2, the relay at its defaults
  (``RELAY_CONCURRENCY`` 4, ``RELAY_BATCH_SIZE`` 100, ``RELAY_POLL_INTERVAL`` 0.5 s);
- ``polling``: the hand-written baseline, 2 processes of one loop each: ``SELECT ... FROM
  bench_polling_outbox WHERE delivered_at IS NULL ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED``,
  send each row, mark them delivered, commit; sleep 0.5 s when nothing is found. It sends through
  the same destination classes as jobguard's relay, so only the relaying differs; and it keeps
  no per-key order across its two processes (the column says how often that showed);
- ``jaiminho``: the peer outbox library django-jaiminho (``requirements-jaiminho.txt``, installed
  into ``benchmarks/.venv-jaiminho`` on first use), Redis destination only: its ``keep-order``
  strategy (each event saved to its table in the caller's transaction) and
  ``events_relay --run-in-loop --loop-interval 0.5`` x 2, whose event function XADDs to the same
  stream with the fields jobguard's Redis destination writes (``benchmarks/peers/jaiminho_app``).
  Its publisher is a process in that virtualenv (``jaiminho_app.publish``), which reports the
  time each commit returned. Its relay sends one event per transaction, in ``created_at`` order.

Prints a table of medians [min-max] over ``--runs`` and writes the JSON to
``benchmarks/results/outbox-<time>.json``. Needs PostgreSQL; the database is created and
migrated if missing, and its outbox tables emptied before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DESTINATIONS = ("webhook", "rabbitmq", "nats", "redis")
RELAYS = ("jobguard", "polling", "jaiminho")
#: The relay's defaults, which the baseline matches: seconds between looks when idle, rows per pass.
POLL_SECONDS = 0.5
POLLING_BATCH = 100
PUBLISH_CHUNK = 500
PROCESSES = 2
POLLING_TABLE = "bench_polling_outbox"
JAIMINHO_VENV = ROOT / "benchmarks" / ".venv-jaiminho"
JAIMINHO_SETTINGS = "benchmarks.peers.jaiminho_app.settings"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-url", default="postgres://postgres@127.0.0.1:5432/jg_outbox_bench")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--destinations", default=",".join(DESTINATIONS))
    parser.add_argument("--relays", default=",".join(RELAYS))
    parser.add_argument("--messages", type=int, default=5_000, help="messages of the throughput part")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--latency-messages", type=int, default=300)
    parser.add_argument("--latency-rate", type=float, default=20.0, help="messages/s of the latency part")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobguard", default="{}", help="JSON merged into JOBGUARD['OUTBOX'] (experiments)")
    parser.add_argument("--skip-install", action="store_true", help="use benchmarks/.venv-jaiminho as it is")
    sub = parser.add_subparsers(dest="command")
    relay = sub.add_parser("polling-relay", help="(internal) one process of the hand-written baseline")
    relay.add_argument("--options", required=True, help="the destination's options, JSON")
    return parser.parse_args(argv)


# -- the hand-written polling relay ---------------------------------------------------------------

CREATE_POLLING_TABLE = f"""
CREATE TABLE IF NOT EXISTS {POLLING_TABLE} (
    id bigserial PRIMARY KEY,
    message_id uuid NOT NULL,
    key text NOT NULL,
    seq integer NOT NULL,
    payload jsonb NOT NULL,
    published_at timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz
);
CREATE INDEX IF NOT EXISTS {POLLING_TABLE}_undelivered ON {POLLING_TABLE} (id) WHERE delivered_at IS NULL;
"""


def polling_relay(options: dict[str, Any], db_url: str) -> None:
    """The baseline's loop, until SIGTERM: claim a batch, send each row, mark them, commit."""
    import django

    django.setup()
    import psycopg
    from django.utils.module_loading import import_string

    from benchmarks._common import conninfo
    from django_jobguard.outbox.destinations.base import BACKENDS, Envelope

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    destination = import_string(BACKENDS[options["BACKEND"]]).from_options(
        "bench", {k: v for k, v in options.items() if k != "BACKEND"}
    )
    with psycopg.connect(conninfo(db_url)) as conn:
        while not stop:
            with conn.transaction():
                rows = conn.execute(
                    f"SELECT id, message_id, key, seq, payload, published_at FROM {POLLING_TABLE} "
                    "WHERE delivered_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                    [POLLING_BATCH],
                ).fetchall()
                for _id, message_id, key, seq, payload, published_at in rows:
                    destination.send(
                        Envelope(str(message_id), "bench", key, seq, payload, {}, published_at, 1)
                    )
                if rows:
                    conn.execute(
                        f"UPDATE {POLLING_TABLE} SET delivered_at = now() WHERE id = ANY(%s)",
                        [[row[0] for row in rows]],
                    )
            if not rows:
                time.sleep(POLL_SECONDS)
    destination.close()


# -- django-jaiminho, the peer ---------------------------------------------------------------------


def jaiminho_python(skip_install: bool) -> str:
    """``benchmarks/.venv-jaiminho``'s python (created once), with the project's Django, psycopg, redis."""
    import django
    import psycopg
    import redis

    from benchmarks.bench_peers import ensure_venv

    pins = [
        f"Django=={django.__version__}",
        f"psycopg[binary]=={psycopg.__version__}",
        f"redis=={redis.__version__}",
    ]
    return ensure_venv(JAIMINHO_VENV, ROOT / "benchmarks" / "requirements-jaiminho.txt", pins, skip_install)


def jaiminho_env(db_url: str, options: dict[str, Any] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE=JAIMINHO_SETTINGS,
        BENCH_DATABASE_URL=db_url,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),
    )
    if options is not None:
        env["BENCH_JAIMINHO_REDIS"] = json.dumps(options)
    return env


class JaiminhoPublisher:
    """``jaiminho_app.publish`` in the peer's virtualenv: one transaction per line sent."""

    def __init__(self, python: str, db_url: str) -> None:
        self.process = subprocess.Popen(
            [python, "-m", "benchmarks.peers.jaiminho_app.publish"],
            cwd=ROOT,
            env=jaiminho_env(db_url),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def publish(self, rows: list[tuple[str, str, int, dict[str, Any]]]) -> float:
        """Saves ``rows`` in one transaction; the time (``time.time()``) its commit returned."""
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps(rows) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit("jaiminho's publisher exited (its error is above)")
        return float(json.loads(line)["committed"])

    def close(self) -> None:
        assert self.process.stdin
        self.process.stdin.close()
        self.process.wait(60)


# -- one run ----------------------------------------------------------------------------------------


def _consumer(name: str, args: argparse.Namespace) -> Any:
    from tests.support import outbox_consumers as consumers

    tag = consumers.tag("bench-outbox")
    if name == "webhook":
        from django_jobguard.outbox import signing

        return consumers.WebhookConsumer(tag, signing.generate_secret())
    if name == "rabbitmq":
        return consumers.RabbitMQConsumer(tag, args.rabbitmq_url)
    if name == "nats":
        return consumers.NatsConsumer(tag, args.nats_url)
    return consumers.RedisStreamConsumer(tag, args.redis_url)


class Publisher:
    """Publishes into the relay's table: ``publish()`` for jobguard, an INSERT for the baseline."""

    def __init__(
        self,
        relay: str,
        options: dict[str, Any],
        extra: dict[str, Any],
        jaiminho: JaiminhoPublisher | None = None,
    ) -> None:
        self.relay = relay
        self.jaiminho = jaiminho
        self.options = options
        self.extra = extra
        self.seqs: dict[str, int] = {}
        #: message id -> (key, seq), and -> the time its commit returned.
        self.expected: dict[str, tuple[str, int]] = {}
        self.committed: dict[str, float] = {}

    def settings(self) -> Any:
        from django.conf import settings
        from django.test import override_settings

        outbox = {"DESTINATIONS": {"bench": self.options}, **self.extra}
        return override_settings(JOBGUARD={**settings.JOBGUARD, "OUTBOX": outbox})

    def publish(self, numbers: range, key_count: int) -> None:
        """Messages ``numbers`` (key ``k{n % key_count}``) in one transaction."""
        from django.db import connection, transaction

        from django_jobguard.outbox import publish

        written: list[str] = []
        if self.jaiminho is not None:
            rows = []
            for n in numbers:
                key = f"k{n % key_count}"
                self.seqs[key] = seq = self.seqs.get(key, 0) + 1
                message_id = str(uuid.uuid4())
                rows.append((message_id, key, seq, {"n": n}))
                self.expected[message_id] = (key, seq)
            committed = self.jaiminho.publish(rows)
            for row in rows:
                self.committed[row[0]] = committed
            return
        with transaction.atomic():
            if self.relay == "jobguard":
                for n in numbers:
                    message = publish("bench", {"n": n}, key=f"k{n % key_count}")
                    self.expected[str(message.message_id)] = (message.key, message.seq)
                    written.append(str(message.message_id))
            else:
                rows = []
                for n in numbers:
                    key = f"k{n % key_count}"
                    self.seqs[key] = seq = self.seqs.get(key, 0) + 1
                    message_id = str(uuid.uuid4())
                    rows.append((message_id, key, seq, json.dumps({"n": n})))
                    self.expected[message_id] = (key, seq)
                    written.append(message_id)
                with connection.cursor() as cursor:
                    cursor.executemany(
                        f"INSERT INTO {POLLING_TABLE} (message_id, key, seq, payload) "
                        "VALUES (%s, %s, %s, %s)",
                        rows,
                    )
        now = time.time()
        for message_id in written:
            self.committed[message_id] = now


def _start(relay: str, options: dict[str, Any], extra: dict[str, Any], args: argparse.Namespace) -> list[Any]:
    env = dict(os.environ)
    if relay == "jaiminho":
        env = jaiminho_env(args.db_url, options)
        command = [args.jaiminho_python, "-m", "django", "events_relay", "--run-in-loop"]
        command += ["--loop-interval", str(POLL_SECONDS)]
    elif relay == "jobguard":
        env["BENCH_JOBGUARD"] = json.dumps({"OUTBOX": {"DESTINATIONS": {"bench": options}, **extra}})
        command = [sys.executable, "-m", "django", "jobguard_worker", "--queue", "bench-outbox-idle"]
        command += ["--concurrency", "1"]
    else:
        command = [sys.executable, __file__, "--db-url", args.db_url, "polling-relay"]
        command += ["--options", json.dumps(options)]
    return [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(PROCESSES)
    ]


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def run_once(relay: str, destination: str, args: argparse.Namespace) -> dict[str, float]:
    from benchmarks._common import tree_cpu_seconds
    from benchmarks._database import empty, load
    from benchmarks._workloads import percentile
    from tests.support.outbox_consumers import check

    tables = ["jobguard_outboxmessage", "jobguard_outboxkey", "jobguard_outboxcursor", POLLING_TABLE]
    # jaiminho's table exists once its migration has run (main() runs it when jaiminho is asked for).
    empty(tables + (["jaiminho_event"] if relay == "jaiminho" else []))
    consumer = _consumer(destination, args)
    extra = json.loads(args.jobguard)
    jaiminho = JaiminhoPublisher(args.jaiminho_python, args.db_url) if relay == "jaiminho" else None
    publisher = Publisher(relay, consumer.options(), extra, jaiminho)
    processes: list[Any] = []
    try:
        consumer.start()
        with publisher.settings():
            for start in range(0, args.messages, PUBLISH_CHUNK):
                publisher.publish(range(start, min(start + PUBLISH_CHUNK, args.messages)), args.keys)
            processes = _start(relay, consumer.options(), extra, args)
            _wait(lambda: consumer.count() > 0, 300, f"the first message ({relay})")
            # From the first arrival: the processes' start-up (imports, checks) left out.
            cpu0 = sum(tree_cpu_seconds(p.pid) for p in processes)
            _wait(lambda: consumer.count() >= args.messages, 1800, f"{args.messages} messages ({relay})")
            cpu = sum(tree_cpu_seconds(p.pid) for p in processes) - cpu0
            first = consumer.records()
            # The latency part: the same processes, idle now, one message per transaction.
            began = time.monotonic()
            for k in range(args.latency_messages):
                time.sleep(max(0.0, began + k / args.latency_rate - time.monotonic()))
                n = args.messages + k
                publisher.publish(range(n, n + 1), args.keys)
            total = args.messages + args.latency_messages
            _wait(lambda: consumer.count() >= total, 600, f"{total} messages ({relay})")
        records = consumer.records()
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
        consumer.close()
        if jaiminho is not None:
            jaiminho.close()
    seen: dict[str, float] = {}
    for record in first:
        seen.setdefault(record.id, record.at)
    times = sorted(seen.values())
    arrivals: dict[str, float] = {}
    for record in records:
        arrivals.setdefault(record.id, record.at)
    latencies = sorted(
        (arrivals[m] - publisher.committed[m]) * 1000
        for m in list(publisher.committed)[args.messages :]
        if arrivals.get(m)
    )
    figures = check(records, publisher.expected)
    return {
        "messages_per_second": args.messages / (times[-1] - times[0]) if len(times) > 1 else 0.0,
        "cpu_ms_per_message": cpu * 1000 / args.messages,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "lost": figures.lost,
        "order_violations": figures.order_violations,
        "duplicates": figures.duplicates,
        "load": float(load().split()[0]),
    }


def spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def main() -> None:
    args = parse_args()
    if args.command == "polling-relay":
        polling_relay(json.loads(args.options), args.db_url)
        return
    from benchmarks._database import load, setup_django
    from benchmarks._report import table

    setup_django(args.db_url)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(CREATE_POLLING_TABLE)
    destinations = [d for d in args.destinations.split(",") if d]
    relays = [r for r in args.relays.split(",") if r]
    args.jaiminho_python = None
    if "jaiminho" in relays:
        if "redis" in destinations:
            args.jaiminho_python = jaiminho_python(args.skip_install)
            # jaiminho's table, by its own migrations (run_once empties it, whoever runs).
            subprocess.run(
                [args.jaiminho_python, "-m", "django", "migrate", "-v0", "jaiminho"],
                cwd=ROOT,
                env=jaiminho_env(args.db_url),
                check=True,
            )
        else:
            relays.remove("jaiminho")
            print("bench_outbox: jaiminho runs with --destinations redis only; left out", file=sys.stderr)
    print(
        f"bench_outbox: {args.messages:,} messages over {args.keys} keys, {PROCESSES} processes, "
        f"latency {args.latency_messages} at {args.latency_rate:g}/s, {args.runs} runs; load {load()}",
        file=sys.stderr,
    )
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for run in range(args.runs):
        for destination in destinations:
            # Alternate which relay goes first, so neither always runs on the warmer host.
            for relay in relays if run % 2 == 0 else relays[::-1]:
                if relay == "jaiminho" and destination != "redis":
                    continue  # its event function writes to a Redis stream only
                figures = run_once(relay, destination, args)
                results.setdefault(destination, {}).setdefault(relay, []).append(figures)
                print(
                    f"run {run + 1} {destination} {relay}: {json.dumps(figures)}", file=sys.stderr, flush=True
                )
    rows = []
    for destination, by_relay in results.items():
        for relay, runs in by_relay.items():
            rows.append(
                [
                    destination,
                    relay,
                    spread([r["messages_per_second"] for r in runs]),
                    spread([r["cpu_ms_per_message"] for r in runs], 2),
                    spread([r["p50_ms"] for r in runs]),
                    spread([r["p99_ms"] for r in runs]),
                    str(max(r["lost"] for r in runs)),
                    spread([r["order_violations"] for r in runs]),
                    spread([r["duplicates"] for r in runs]),
                    spread([r["load"] for r in runs], 1),
                ]
            )
    headers = [
        "destination",
        "relay",
        "messages/s",
        "relay CPU ms/msg",
        "p50 ms",
        "p99 ms",
        "lost",
        "order violations",
        "duplicates",
        "load",
    ]
    print(table(headers, rows))
    out = ROOT / "benchmarks" / "results" / f"outbox-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"JSON: {out.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
