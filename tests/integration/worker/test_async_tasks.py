"""jobguard's own ``@task`` on ``async def`` functions."""

import pytest

from django_jobguard.models import DeadLetter
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


@pytest.mark.processes
def test_an_async_task_past_its_hard_timeout_is_dead_lettered_by_the_watchdog(workers):
    job = tasks.hangs_async.enqueue()
    done = workers.burst()
    assert done.returncode == 0, done.stderr.decode()
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("dead", 1)
    letter = DeadLetter.objects.get(job=job)
    assert letter.reason == "hard_timeout"
    assert "hard timeout of 1.0s" in letter.error_message
    (entry,) = job.attempt_history
    assert entry["error_class"] == "builtins.TimeoutError"
