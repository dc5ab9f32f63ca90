"""A real worker upserts its beat row and its outcome counts; the workers page shows it."""

import datetime
import io
import signal
import socket

import pytest
from django.core.management import call_command

from django_jobguard.models import QueueMinute, WorkerBeat
from tests.conftest import wait_for
from tests.support.factories import force_login
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def beat_of(worker_id):
    return WorkerBeat.objects.filter(worker_id=worker_id).first()


def test_a_worker_reports_itself_its_jobs_in_hand_and_its_outcomes(workers, client):
    worker = workers.start(
        "--worker-id", "beating", "--queue", "default", "--queue", "slow", "--concurrency", "2"
    )
    wait_for(lambda: beat_of("beating") is not None, timeout=60, message="the worker's first beat")
    row = beat_of("beating")
    assert (row.host, row.pid, row.queues, row.concurrency) == (
        socket.gethostname(),
        worker.pid,
        "default,slow",
        2,
    )
    first_beat = row.last_beat_at
    tasks.short_lease_plain.enqueue("beat", seconds=8)  # not atomic: SQLite can write meanwhile
    wait_for(lambda: beat_of("beating").jobs_in_hand == 1, timeout=60, message="a beat with the job in hand")
    assert beat_of("beating").last_beat_at > first_beat
    for n in range(3):
        tasks.add.enqueue(n)
    wait_for(
        lambda: (
            sum(QueueMinute.objects.filter(queue_name="default").values_list("succeeded", flat=True)) == 4
        ),
        timeout=60,
        message="the four successes (three adds, the slow job) counted by a beat",
    )

    force_login(client, "ops", "view_workerbeat")
    html = client.get("/admin/jobguard/workerbeat/").content.decode()
    assert "beating" in html and "state-live" in html and "state-stale" not in html
    assert "worker_id=beating&amp;status__exact=running" in html
    # A worker that stopped beating (killed: no chance to say goodbye) is marked stale.
    worker.kill()
    worker.wait(timeout=10)
    WorkerBeat.objects.filter(pk="beating").update(
        last_beat_at=beat_of("beating").last_beat_at - datetime.timedelta(minutes=5)
    )
    html = client.get("/admin/jobguard/workerbeat/").content.decode()
    assert "state-stale" in html
    assert (
        client.get("/admin/jobguard/workerbeat/", {"stale": "yes"}).content.decode().count("state-stale") == 1
    )
    assert (
        "beating"
        not in client.get("/admin/jobguard/workerbeat/", {"stale": "no"})
        .content.decode()
        .split("<tbody>")[-1]
    )


def test_two_live_workers_started_with_one_worker_id_keep_a_row_each_and_one_warns(workers):
    first = workers.start("--worker-id", "twin", "--queue", "default")
    second = workers.start("--worker-id", "twin", "--queue", "default")

    def rows():
        return dict(WorkerBeat.objects.filter(worker_id__startswith="twin").values_list("worker_id", "pid"))

    # Whichever beats second takes the row; the other finds it taken at its next beat.
    wait_for(lambda: len(rows()) == 2, timeout=90, message="a row for each of the two processes")
    by_pid = {pid: worker_id for worker_id, pid in rows().items()}
    assert set(by_pid) == {first.pid, second.pid}
    (moved,) = [proc for proc in (first, second) if by_pid[proc.pid] != "twin"]
    assert by_pid[moved.pid] == f"twin (pid {moved.pid} on {socket.gethostname()[:60]})"
    assert "worker_id_clash worker_id='twin'" in workers.log(moved)
    # No more flapping: three beats later each row still shows its own process.
    last = WorkerBeat.objects.get(pk="twin").last_beat_at
    wait_for(
        lambda: WorkerBeat.objects.get(pk="twin").last_beat_at > last + datetime.timedelta(seconds=9),
        timeout=60,
        message="two more beats of the row's process",
    )
    assert {pid: worker_id for worker_id, pid in rows().items()} == by_pid


def test_a_worker_that_stops_cleanly_leaves_the_list_and_a_killed_one_shows_as_not_beating(workers):
    leaving = workers.start("--worker-id", "leaving", "--queue", "default")
    vanishing = workers.start("--worker-id", "vanishing", "--queue", "default")
    wait_for(
        lambda: beat_of("leaving") is not None and beat_of("vanishing") is not None,
        timeout=90,
        message="both workers' first beats",
    )
    leaving.send_signal(signal.SIGTERM)
    assert leaving.wait(timeout=60) == 0, workers.log(leaving)[-3000:]
    vanishing.kill()
    vanishing.wait(timeout=10)
    assert beat_of("leaving") is None  # its clean exit took its row away
    WorkerBeat.objects.filter(pk="vanishing").update(
        last_beat_at=beat_of("vanishing").last_beat_at - datetime.timedelta(minutes=5)
    )
    out = io.StringIO()
    call_command("jobguard_status", stdout=out)
    first = out.getvalue().splitlines()[0]
    assert "1 not beating (killed, frozen or cut off from the database): vanishing (" in first
    assert "leaving" not in out.getvalue()
