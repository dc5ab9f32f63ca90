"""jobguard's own ``@task`` on ``async def`` functions."""

import pytest

from django_jobguard.worker import Worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_async_task_runs_in_the_worker_and_stores_its_result():
    job = tasks.add_async.enqueue(40, b=2)
    assert Worker(burst=True, install_signal_handlers=False, poll_interval=0.05).run() == 0
    job.refresh_from_db()
    assert (job.status, job.result, job.attempts) == ("succeeded", 42, 1)


def test_call_runs_an_async_task_here_and_now():
    assert tasks.add_async.call(1, b=2) == 3
