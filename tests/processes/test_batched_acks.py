"""Batched acks in real worker processes: written before the worker exits, and what a crash
between a handler's return and the batch's commit means (the job runs again)."""

import signal

import pytest

from tests.conftest import statuses, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_acks_waiting_in_the_window_are_written_before_the_worker_exits(workers):
    jobs = [tasks.short_lease_plain.enqueue(f"window-{n}") for n in range(5)]
    # A 1 s window: the handlers return at once, and their acks wait in it. Jobs awaiting
    # their ack count against the prefetch cap, so the cap must hold all five, with room to
    # spare: a claimer kept back by the acks alone would ask for them to be written at once.
    proc = workers.start("--concurrency", "2", "--batch-size", "10", env={"JOBGUARD_TEST_ACK_WINDOW": "1.0"})
    wait_for(
        lambda: (
            Execution.objects.filter(marker__startswith="window-").count() == 5
            and set(statuses(jobs)) == {"running"}
        ),
        interval=0.02,
        message="every handler to have run while its ack waits",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert statuses(jobs) == ["succeeded"] * 5
    log = workers.log(proc)
    # Acked on the way out: after the stop was asked for, not when the window ran out.
    assert log.index("worker_stopping") < log.index("job_succeeded")
    assert log.count("job_succeeded") == 5


def test_a_crash_before_the_batch_commits_runs_the_job_again(workers):
    job = tasks.short_lease_plain.enqueue("crash-window")
    # SIGKILL at the batch's write: the handler has returned, its ack is not committed.
    crash = {"JOBGUARD_TEST_FAULTS": "in_complete=1", "JOBGUARD_TEST_ACK_WINDOW": "0.005"}
    first = workers.start("--worker-id", "first", env=crash)
    assert first.wait(timeout=60) == -signal.SIGKILL
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("running", 1)
    # The lease (2 s) runs out, the job comes back and runs again: at-least-once.
    workers.start("--worker-id", "second", env={"JOBGUARD_TEST_ACK_WINDOW": "0.005"})
    wait_for(lambda: job.refresh_from_db() or job.status == "succeeded", timeout=60, message="the rerun")
    assert (job.attempts, job.worker_id, job.result) == (2, "second", 2)
    assert sorted(Execution.objects.filter(job_id=job.pk).values_list("attempt", flat=True)) == [1, 2]
