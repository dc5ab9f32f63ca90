"""Cancelling a running job asks its handler through the heartbeat; nothing is killed."""

import pytest

from django_jobguard.operations import jobs
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_a_running_job_sees_cancel_requested_at_its_next_heartbeat_and_stops_itself(workers):
    job = tasks.until_cancelled.enqueue()
    worker = workers.start("--worker-id", "w1")
    wait_for(lambda: jobs.request_cancel([job.pk]) == [job.pk], timeout=60, message="the job to be running")
    job.refresh_from_db()
    assert job.cancel_requested is True
    assert jobs.request_cancel([job.pk]) == []  # asked once is enough
    wait_for(
        lambda: (job.refresh_from_db(), job.status)[1] == "succeeded",
        timeout=60,
        message="the handler to stop",
    )
    assert job.result == "stopped on request"
    assert worker.poll() is None  # the worker was not killed either
