"""The bridge in real jobguard_worker processes: the jobs in a database of their own, each
enqueued from an outbox message in the application's database exactly once, a SIGKILL between
the job's commit and the delivery's record included."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings

from django_jobguard import enqueue_via_outbox
from django_jobguard.models import Job, OutboxMessage
from tests.conftest import WorkerProcesses, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [
    pytest.mark.processes,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "jobs"]),
]

PAUSING = "tests.outbox.bridge_destinations.PausingJobsDestination"
#: The workers' relay: a short lease, so a killed worker's key comes back soon.
RELAY = {"RELAY_LEASE": 2.0, "RELAY_POLL_INTERVAL": 0.1, "RELAY_CONCURRENCY": 4}


def _outbox(pause_dir: Path) -> dict[str, Any]:
    retry = {"base": 0.0, "max": 0.0, "jitter": 0.0}
    return {
        "DATABASE_ALIAS": "default",
        "DESTINATIONS": {"jobs": {"BACKEND": PAUSING, "PAUSE_DIR": str(pause_dir), "RETRY": retry}},
        **RELAY,
    }


def _env(outbox: dict[str, Any]) -> dict[str, str]:
    return {
        "JOBGUARD_TEST_DATABASE_ALIAS": "jobs",
        "JOBGUARD_TEST_JOBS_DB_NAME": str(connections["jobs"].settings_dict["NAME"]),
        "JOBGUARD_TEST_OUTBOX": json.dumps(outbox),
    }


def test_a_relay_killed_between_the_jobs_commit_and_its_record_makes_no_second_job(
    workers: WorkerProcesses, tmp_path: Path, settings: Any
) -> None:
    pause_dir = tmp_path / "paused"
    pause_dir.mkdir()
    outbox = _outbox(pause_dir)
    queue = f"bridge-{uuid.uuid4().hex[:8]}"
    markers = [f"pause-{queue}", *(f"plain-{queue}-{n}" for n in range(9))]
    with override_settings(JOBGUARD={**settings.JOBGUARD, "DATABASE_ALIAS": "jobs", "OUTBOX": outbox}):
        with transaction.atomic(using="default"):
            messages = [
                enqueue_via_outbox(tasks.record_plain.using(queue_name=queue), marker=marker)
                for marker in markers
            ]
        paused = messages[0]
        env = _env(outbox)

        first = workers.start("--queue", queue, env=env)
        marker = pause_dir / str(paused.message_id)
        wait_for(marker.exists, 120, message="the paused send's job committed")
        # The job is in the jobs database; the message is not recorded as delivered.
        assert [job.kwargs["marker"] for job in Job.objects.using("jobs").filter(queue_name=queue)].count(
            markers[0]
        ) == 1
        assert OutboxMessage.objects.using("default").get(pk=paused.pk).state == "pending"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)

        second = workers.start("--queue", queue, env=env)
        wait_for(
            lambda: not OutboxMessage.objects.using("default").exclude(state="delivered").exists(),
            120,
            message="every message delivered",
        )
        wait_for(
            lambda: (
                set(Job.objects.using("jobs").filter(queue_name=queue).values_list("status", flat=True))
                == {"succeeded"}
            ),
            300,  # a job the SIGKILL cut short runs again once its visibility timeout passed
            message="every job succeeded",
        )
        workers.wait_started(second)
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, workers.log(second)

        jobs = list(Job.objects.using("jobs").filter(queue_name=queue))
        # One job per message, the one sent twice included, each under its message's key.
        assert sorted(job.kwargs["marker"] for job in jobs) == sorted(markers)
        assert sorted(str(job.idempotency_key) for job in jobs) == sorted(
            f"outbox:{message.message_id}" for message in messages
        )
        # Each ran (a job the SIGKILL cut short may have run twice: the task is not atomic);
        # its effect is in the application's database.
        runs = Execution.objects.using("default").filter(marker__in=markers)
        assert set(runs.values_list("marker", flat=True)) == set(markers)
        assert OutboxMessage.objects.using("default").get(pk=paused.pk).attempts == 1
        assert not Job.objects.using("default").exists()
