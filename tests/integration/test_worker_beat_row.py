"""A worker's beat row follows the process that beats now."""

import datetime

import pytest
from django.db import connection
from django.utils import timezone

from django_jobguard.models import WorkerBeat
from django_jobguard.store import beats as store_beats

pytestmark = pytest.mark.django_db


def test_a_restarted_worker_id_shows_the_process_that_beats_now():
    # A worker id reused by a new process (WORKER_ID from a pod name): pid, queues,
    # concurrency and start time are the new process's, so nobody signals a dead pid.
    first_start = timezone.now() - datetime.timedelta(hours=1)
    common = {"worker_id": "pod-1", "host": "host-a", "jobs_in_hand": 0}
    store_beats.upsert_worker_beat(
        connection.alias, pid=101, queues="default", concurrency=1, started_at=first_start, **common
    )
    restarted = timezone.now()
    store_beats.upsert_worker_beat(
        connection.alias, pid=202, queues="default,slow", concurrency=8, started_at=restarted, **common
    )
    row = WorkerBeat.objects.get(pk="pod-1")
    assert (row.pid, row.queues, row.concurrency, row.started_at) == (202, "default,slow", 8, restarted)
