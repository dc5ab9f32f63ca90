"""A worker's beat row follows the process that beats now."""

import datetime

import pytest
from django.db import connection
from django.utils import timezone

from django_jobguard.models import WorkerBeat
from django_jobguard.store import beats as store_beats
from tests.support.factories import force_login

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


def beat(pid, host="host-a"):
    from django_jobguard.monitoring.beats import Beat

    process = Beat(worker_id="pod-1", alias=connection.alias, queues=None, concurrency=1, pid=pid)
    process.host = host
    return process


def test_a_restart_takes_the_row_over_without_a_clash(caplog):
    first = beat(101)
    first.beat(0)
    restarted = beat(202)  # the first process died; a new one starts under its id
    restarted.beat(0)
    restarted.beat(0)
    assert restarted.row_id == "pod-1"
    assert WorkerBeat.objects.get(pk="pod-1").pid == 202
    assert "worker_id_clash" not in caplog.text


def test_two_live_processes_under_one_worker_id_keep_a_row_each_and_warn(caplog, client):
    first, second = beat(101, "host-a"), beat(101, "host-b")  # same pid, other pods
    first.beat(2)
    second.beat(5)  # takes the row, as a restart would
    first.beat(2)  # finds another process wrote its row: a clash, not a restart
    assert first.row_id == "pod-1 (pid 101 on host-a)"
    (record,) = [r for r in caplog.records if r.getMessage().startswith("worker_id_clash")]
    assert record.levelname == "WARNING"
    assert "worker_id='pod-1' host='host-a' pid=101 other_host='host-b' other_pid=101" in record.getMessage()
    for _ in range(3):  # no more flapping: each process keeps its row
        second.beat(5)
        first.beat(2)
    rows = dict(WorkerBeat.objects.values_list("worker_id", "host"))
    assert rows == {"pod-1": "host-b", "pod-1 (pid 101 on host-a)": "host-a"}

    force_login(client, "ops", "view_workerbeat")
    html = client.get("/admin/jobguard/workerbeat/").content.decode()
    assert html.count("worker-id-clash") == 2  # both rows are marked
    # The jobs of either process carry the shared id: both rows link to them.
    assert html.count("worker_id=pod-1&amp;status__exact=running") == 2


def test_a_dead_workers_jobs_in_hand_are_not_shown_as_held(client):
    long_ago = timezone.now() - datetime.timedelta(minutes=10)
    WorkerBeat.objects.create(
        worker_id="gone",
        host="h",
        pid=1,
        queues="*",
        concurrency=4,
        started_at=long_ago,
        last_beat_at=long_ago,
        jobs_in_hand=3,
    )
    force_login(client, "ops", "view_workerbeat")
    html = client.get("/admin/jobguard/workerbeat/").content.decode()
    assert '<td class="field-jobs_in_hand_link">-</td>' in html
    assert "worker_id=gone" not in html
