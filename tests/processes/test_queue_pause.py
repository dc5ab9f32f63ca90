"""A real worker stops claiming from a paused queue at its next poll and resumes when told."""

import datetime

import pytest

from django_jobguard.operations import queues
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def status_of(job):
    job.refresh_from_db()
    return job.status


@pytest.mark.parametrize("queue_args", [["--queue", "held", "--queue", "free"], []], ids=["listed", "all"])
def test_a_paused_queue_gets_no_claims_while_a_sibling_queue_runs_then_runs_after_resume(workers, queue_args):
    worker = workers.start("--worker-id", "w1", "--poll-interval", "0.2", *queue_args)
    workers.wait_started(worker)
    # Only a queue that exists can be paused: one with a job (due in an hour, so never run here).
    tasks.add.using(queue_name="held", run_after=datetime.timedelta(hours=1)).enqueue(0)
    queues.pause("held", actor="test", reason="dependency degraded")
    # A claim already under way when the pause commits may have read the paused set just
    # before it; once a job enqueued after the pause is done, every later claim sees it.
    first = tasks.add.using(queue_name="free").enqueue(100)
    wait_for(lambda: status_of(first) == "succeeded", timeout=60, message="a claim after the pause")
    held = tasks.add.using(queue_name="held").enqueue(1, 1)
    # Jobs of the unpaused queue enqueued after the paused one: each one done proves the
    # worker polled (and claimed) after the paused job was waiting.
    for n in range(3):
        free = tasks.add.using(queue_name="free").enqueue(n)
        wait_for(lambda free=free: status_of(free) == "succeeded", timeout=60, message="the free queue's job")
        held.refresh_from_db()
        assert (held.status, held.attempts, held.worker_id) == ("queued", 0, "")
    # The worker's log says why the queue sits still, and when it moves again.
    wait_for(
        lambda: "queue_paused_skipped worker_id=w1 queue=held" in workers.log(worker),
        timeout=60,
        message="the worker to log the paused queue",
    )
    queues.resume("held", actor="test")
    wait_for(lambda: status_of(held) == "succeeded", timeout=60, message="the resumed queue's job")
    assert (held.result, held.worker_id) == (2, "w1")
    wait_for(
        lambda: "queue_resumed_seen worker_id=w1 queue=held" in workers.log(worker),
        timeout=60,
        message="the worker to log the resumed queue",
    )
    assert workers.log(worker).count("queue_paused_skipped") == 1, "logged once per pause, not per poll"
