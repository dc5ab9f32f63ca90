"""The relay in real jobguard_worker processes: Redis Streams end to end, and SIGKILLs mid-run."""

from __future__ import annotations

import json
import os
import random
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from django_jobguard.models import OutboxMessage
from django_jobguard.outbox import publish
from tests.conftest import WorkerProcesses, wait_for
from tests.outbox.conftest import FILE_BACKEND
from tests.outbox.destinations import check_order, read

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: Settings of the relay in the workers: short leases, so a killed worker's keys come back soon.
RELAY = {"RELAY_LEASE": 3.0, "RELAY_POLL_INTERVAL": 0.1, "RELAY_CONCURRENCY": 4, "RELAY_BATCH_SIZE": 20}


def _env(destinations: dict[str, Any]) -> dict[str, str]:
    return {"JOBGUARD_TEST_OUTBOX": json.dumps({"DESTINATIONS": destinations, **RELAY})}


def _undelivered() -> int:
    return OutboxMessage.objects.exclude(state="delivered").count()


def test_workers_killed_mid_run_lose_nothing_and_keep_each_keys_order(
    workers: WorkerProcesses, tmp_path: Path, settings: Any
) -> None:
    path = tmp_path / "delivered.jsonl"
    destinations = {"events": {"BACKEND": FILE_BACKEND, "PATH": str(path)}}
    settings.JOBGUARD = {**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}
    total, keys = 1200, 24
    for n in range(total):
        publish("events", {"n": n, "sleep_after": 0.005}, key=f"key-{n % keys}")
    env = _env(destinations)
    live = [workers.start("--queue", "outbox-none", env=env) for _ in range(2)]
    rng = random.Random(63)
    kills = 0
    for threshold in (150, 400, 650, 900):
        wait_for(lambda t=threshold: len(read(path)) >= t, 300, message=f"{threshold} deliveries")
        victim = live.pop(rng.randrange(len(live)))
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(30)
        kills += 1
        live.append(workers.start("--queue", "outbox-none", env=env))
    wait_for(lambda: _undelivered() == 0, 300, message="every message delivered")
    for proc in live:
        workers.wait_started(proc)  # its signal handlers are in place: SIGTERM is a clean stop
        proc.send_signal(signal.SIGTERM)
    for proc in live:
        assert proc.wait(60) == 0, workers.log(proc)

    distinct, duplicates = check_order(read(path))
    assert distinct == total  # nothing lost
    assert kills == 4
    # Each SIGKILL may catch at most one send per delivery thread between its send and record.
    assert duplicates <= kills * RELAY["RELAY_CONCURRENCY"]
    print(f"outbox kill test: {total} messages, {keys} keys, {kills} SIGKILLs, {duplicates} duplicates")


@pytest.mark.redis
def test_a_worker_relays_to_a_redis_stream_in_order_per_key(workers: WorkerProcesses, settings: Any) -> None:
    import redis

    url = os.environ["JOBGUARD_TEST_REDIS_URL"]
    stream = f"jobguard-test-outbox-{uuid.uuid4().hex}"
    destinations = {"stream": {"BACKEND": "redis", "URL": url, "STREAM": stream}}
    settings.JOBGUARD = {**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}
    published = [
        publish("stream", {"n": n}, key=f"order:{n % 5}", headers={"tenant": "t1"}) for n in range(100)
    ]
    client = redis.Redis.from_url(url)
    try:
        proc = workers.start("--queue", "outbox-none", env=_env(destinations))
        wait_for(lambda: client.xlen(stream) >= 100 and _undelivered() == 0, 120, message="100 entries")
        workers.wait_started(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, workers.log(proc)
        entries = client.xrange(stream)
    finally:
        client.delete(stream)
        client.close()

    records = []
    for _entry_id, fields in entries:
        text = {name.decode(): value.decode() for name, value in fields.items()}
        records.append(
            {
                "id": text["id"],
                "destination": text["jobguard-destination"],
                "key": text["jobguard-key"],
                "seq": int(text["jobguard-seq"]),
                "payload": json.loads(text["payload"]),
                "tenant": text["tenant"],
            }
        )
    assert check_order(records) == (100, 0)
    by_id = {record["id"]: record for record in records}
    for message in published:
        record = by_id[str(message.message_id)]
        assert (record["key"], record["seq"], record["payload"]) == (
            message.key,
            message.seq,
            message.payload,
        )
        assert record["tenant"] == "t1"
