"""Progress a running job reports in a worker process, read from this one while it runs."""

import pytest

from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_a_long_jobs_progress_is_visible_from_another_process_while_it_runs(workers, tmp_path):
    flag = tmp_path / "release"
    job = tasks.reports_until_released.enqueue(str(flag), steps=3)
    worker = workers.start("--worker-id", "progress-1")

    def reported() -> bool:
        row = Job.objects.values("status", "progress").get(pk=job.pk)
        return row["status"] == "running" and row["progress"] is not None

    wait_for(reported, timeout=120, message="the running job's first report to reach the row")
    job.refresh_from_db()
    assert job.status == "running"  # the handler still waits for the flag: written by the heartbeat
    assert {k: job.progress[k] for k in ("done", "total", "message")} == {
        "done": 1,
        "total": 3,
        "message": "waiting for the flag",
    }

    # A waiter in this process follows it to the end without polling itself.
    seen = []
    for progress in job.watch(timeout=120, interval=0.05):
        seen.append(progress["done"])
        if not flag.exists():
            flag.touch()
    assert seen[0] == 1 and seen[-1] == 3
    assert (job.status, job.result, job.progress["message"]) == ("succeeded", "released", "done")
    assert worker.poll() is None


@pytest.mark.postgres
def test_on_postgresql_watch_is_woken_by_each_report_of_a_worker_process(workers, tmp_path, monkeypatch):
    # No backstop re-read and no poll within the test's timeout: each report that arrives
    # was carried by migration 0029's notification (the settlement's by 0027's).
    from django_jobguard.results import watching
    from django_jobguard.store.settled import settle_listener

    monkeypatch.setattr(watching, "RECHECK_SECONDS", 3600.0)
    flag = tmp_path / "release"
    job = tasks.reports_until_released.enqueue(str(flag), steps=3)
    watch = job.watch(timeout=240, interval=60)
    workers.start("--worker-id", "progress-woken")

    first = next(watch)  # the first read saw nothing: the heartbeat's write of report 1 woke it
    assert (first["done"], first["message"]) == (1, "waiting for the flag")
    row = Job.objects.values("status", "waited").get(pk=job.pk)
    assert row == {"status": "running", "waited": True}  # flagged, and still waiting for the flag
    assert settle_listener(job._state.db or "default").waiters == 1  # woken, not polling

    flag.touch()
    rest = [progress["done"] for progress in watch]
    assert rest == [3]
    assert (job.status, job.result, job.progress["message"]) == ("succeeded", "released", "done")
