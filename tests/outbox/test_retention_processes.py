"""A real worker prunes delivered outbox messages past their retention while its relay delivers
new ones; a dead message that holds its key stays, whatever its age."""

from __future__ import annotations

import datetime
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from django_jobguard.models import OutboxMessage
from django_jobguard.outbox import publish
from django_jobguard.outbox.publisher import outbox_alias
from django_jobguard.outbox.relay import Relay
from tests.conftest import WorkerProcesses, wait_for
from tests.outbox.conftest import FILE_BACKEND
from tests.outbox.destinations import read

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]

#: An hour's retention and a pass every half second, so the worker prunes soon after it starts.
RETENTION = {"OUTBOX_DELIVERED": 3600, "INTERVAL": 0.5, "BATCH_SIZE": 20}


def test_a_worker_prunes_old_delivered_messages_while_its_relay_delivers_new_ones(
    workers: WorkerProcesses, tmp_path: Path, settings: Any
) -> None:
    path, flag = tmp_path / "delivered.jsonl", tmp_path / "refuse"
    destinations = {"events": {"BACKEND": FILE_BACKEND, "PATH": str(path)}}
    settings.JOBGUARD = {**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}
    flag.touch()
    held = publish("events", {"fail_while": str(flag)}, key="held")
    old = [publish("events", {"n": n}, key=f"k{n % 5}") for n in range(100)]
    assert Relay(outbox_alias(), "test-relay").drain() == 100
    two_hours_ago = timezone.now() - datetime.timedelta(hours=2)
    OutboxMessage.objects.filter(pk__in=[held.pk, *(m.pk for m in old)]).update(published_at=two_hours_ago)
    OutboxMessage.objects.filter(pk__in=[m.pk for m in old]).update(delivered_at=two_hours_ago)
    new = [publish("events", {"n": n}, key=f"k{n % 5}") for n in range(100, 120)]

    env = {
        "JOBGUARD_TEST_OUTBOX": json.dumps({"DESTINATIONS": destinations, "RELAY_POLL_INTERVAL": 0.1}),
        "JOBGUARD_TEST_RETENTION": json.dumps(RETENTION),
    }
    proc = workers.start("--queue", "outbox-retention", env=env)
    wait_for(
        lambda: not OutboxMessage.objects.filter(pk__in=[m.pk for m in old]).exists(),
        timeout=120,
        message="the old delivered messages to be pruned",
    )
    wait_for(
        lambda: OutboxMessage.objects.filter(pk__in=[m.pk for m in new], state="delivered").count() == 20,
        timeout=120,
        message="the new messages to be delivered",
    )
    workers.wait_started(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, workers.log(proc)

    # Delivered within the hour: kept. Dead and holding its key: kept, however old.
    assert OutboxMessage.objects.filter(pk__in=[m.pk for m in new]).count() == 20
    assert OutboxMessage.objects.get(pk=held.pk).state == "dead"
    assert sorted(line["payload"]["n"] for line in read(path)[100:]) == list(range(100, 120))
    log = workers.log(proc)
    pruned = [line for line in log.splitlines() if "outbox_messages_pruned worker_id=" in line]
    assert sum(int(line.split(" delivered=")[1].split()[0]) for line in pruned) == 100, log
