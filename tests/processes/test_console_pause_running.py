"""A pause stops new claims, never a job already running: it finishes and is acknowledged."""

import os

import pytest

from django_jobguard.models import Job
from django_jobguard.operations import queues
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_a_job_running_when_its_queue_is_paused_finishes_and_the_next_waits(workers, tmp_path):
    go = tmp_path / "go"
    worker = workers.start(
        "--worker-id",
        "w1",
        "--poll-interval",
        "0.2",
        "--concurrency",
        "2",
        "--queue",
        "held",
        "--queue",
        "free",
    )
    workers.wait_started(worker)
    running = tasks.blocks_plain.using(queue_name="held").enqueue(marker="in-hand", path=str(go))
    wait_for(lambda: os.path.exists(f"{go}.started"), timeout=60, message="the handler to start")
    queues.pause("held", actor="test", reason="dependency degraded")
    # A claim under way as the pause commits may have read the paused set just before it:
    # once a job enqueued after the pause is done, every later claim sees it.
    first = tasks.add.using(queue_name="free").enqueue(0)
    wait_for(lambda: Job.objects.get(pk=first.pk).status == "succeeded", timeout=60, message="a claim")
    assert Job.objects.get(pk=running.pk).status == "running"  # still in hand
    waiting = tasks.add.using(queue_name="held").enqueue(1, 1)
    go.touch()  # the running handler may finish now
    wait_for(
        lambda: Job.objects.get(pk=running.pk).status == "succeeded", timeout=60, message="the running job"
    )
    # A job of the other queue done after the running one proves the worker polled again since.
    sibling = tasks.add.using(queue_name="free").enqueue(2)
    wait_for(lambda: Job.objects.get(pk=sibling.pk).status == "succeeded", timeout=60, message="a later poll")
    assert Job.objects.values_list("status", "attempts").get(pk=waiting.pk) == ("queued", 0)
    queues.resume("held", actor="test")
    wait_for(lambda: Job.objects.get(pk=waiting.pk).status == "succeeded", timeout=60, message="the resume")
