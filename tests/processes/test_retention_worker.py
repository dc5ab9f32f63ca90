"""Real workers prune finished jobs past their retention by default: one of them, elected, while
they claim and run jobs. (A worker with RETENTION["INTERVAL"] 0 or --burst starts no pruning
thread: tests/integration/maintenance/test_job_retention.py.)"""

from __future__ import annotations

import datetime
import json

import pytest
from django.utils import timezone

from django_jobguard.models import Job, Lock
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

#: A short retention and interval, so a pass comes within a second of the worker's start.
SHORT = {"SUCCEEDED": 3600, "INTERVAL": 0.5, "BATCH_SIZE": 50}


def old_succeeded(count: int, queue: str) -> list[int]:
    """``count`` jobs of ``queue`` that succeeded two hours ago, enqueued in one call."""
    tasks.add.using(queue_name=queue).bulk_enqueue(((n,), {}) for n in range(count))
    ids = list(Job.objects.filter(queue_name=queue).values_list("pk", flat=True))
    two_hours_ago = timezone.now() - datetime.timedelta(hours=2)
    Job.objects.filter(pk__in=ids).update(status="succeeded", finished_at=two_hours_ago)
    return ids


@pytest.mark.postgres
def test_two_workers_prune_old_succeeded_jobs_by_default_while_they_run_new_ones(workers):
    old = old_succeeded(240, "retention-q")
    env = {"JOBGUARD_TEST_RETENTION": json.dumps(SHORT)}
    procs = [workers.start("--queue", "retention-q", "--concurrency", "2", env=env) for _ in range(2)]
    for proc in procs:
        workers.wait_started(proc)
    new = [tasks.add.using(queue_name="retention-q").enqueue(n) for n in range(20)]

    wait_for(
        lambda: not Job.objects.filter(pk__in=old).exists(),
        timeout=120,
        message="the old succeeded jobs to be pruned",
    )
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in new], status="succeeded").count() == len(new),
        timeout=120,
        message="the new jobs to run",
    )
    # The jobs that just succeeded are within their hour: kept.
    assert Job.objects.filter(pk__in=[j.pk for j in new]).count() == len(new)
    logs = [workers.log(proc) for proc in procs]
    pruned = [log for log in logs if "jobs_pruned worker_id=" in log]
    assert len(pruned) == 1, "one elected worker prunes"
    assert sum("retention_leader_elected" in log for log in logs) == 1
    assert Lock.objects.filter(key="jobguard:leader:retention").exists()
    counts = [
        int(line.split(" succeeded=")[1].split()[0])
        for line in pruned[0].splitlines()
        if "jobs_pruned worker_id=" in line
    ]
    assert sum(counts) == len(old)
