"""Django's Tasks API against real ``jobguard_worker`` processes: crashes, stops, several workers."""

from __future__ import annotations

import signal

import pytest
from django.conf import settings

if not getattr(settings, "TASKS_ROOT", None):
    pytest.skip(
        "neither django.tasks (Django 6.0+) nor the django-tasks backport is importable",
        allow_module_level=True,
    )

from django_jobguard.backends import _compat
from django_jobguard.models import DeadLetter, Job
from tests.conftest import wait_for
from tests.testapp import tasks_django

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

Status = _compat.TaskResultStatus


def status_of(result):
    result.refresh()
    return result.status


def test_a_task_killed_mid_run_ends_successful_after_its_lease_expires(workers, tmp_path):
    result = tasks_django.sleep_once.enqueue(str(tmp_path), 60)
    first = workers.start("--worker-id", "first")
    wait_for(lambda: any(tmp_path.glob("1.*.started")), message="the first attempt to start")
    assert status_of(result) == Status.RUNNING
    first.kill()  # SIGKILL: no hand-back, no ack; only the lease can free the job
    first.wait(timeout=10)
    workers.start("--worker-id", "second")
    wait_for(lambda: status_of(result) == Status.SUCCESSFUL, timeout=90, message="the second worker")
    assert result.worker_ids == ["first", "second"]
    assert result.attempts == 2 and result.return_value == 2
    (error,) = result.errors  # the killed attempt, recorded by the reaper
    assert error.exception_class_path == "django_jobguard.exceptions.LeaseLost"
    assert "lease expired" in error.traceback
    assert result.started_at < result.last_attempted_at < result.finished_at


def test_sigterm_lets_the_running_task_finish_and_exits_zero(workers, tmp_path):
    result = tasks_django.sleep_once.enqueue(str(tmp_path), 1.5)
    proc = workers.start("--worker-id", "graceful", "--shutdown-grace", "30")
    wait_for(lambda: any(tmp_path.glob("1.*.started")), message="the task to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert status_of(result) == Status.SUCCESSFUL
    assert (result.worker_ids, result.errors, result.return_value) == (["graceful"], [], 1)


def test_several_workers_run_each_task_once(workers):
    results = [tasks_django.add.enqueue(i, 1) for i in range(40)]
    procs = [workers.start("--worker-id", f"w{n}", "--concurrency", "2") for n in range(3)]
    ids = [int(result.id) for result in results]
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status="succeeded").count() == len(ids),
        timeout=120,
        message="every task to succeed",
    )
    for number, result in enumerate(results):
        result.refresh()
        assert result.return_value == number + 1
        assert result.attempts == 1 and len(result.worker_ids) == 1
        assert result.worker_ids[0] in {"w0", "w1", "w2"}
    for proc in procs:
        assert proc.poll() is None


def test_an_async_task_runs_in_a_worker_process(workers):
    result = tasks_django.add_async.enqueue(40, 2)
    workers.start("--worker-id", "async")
    wait_for(lambda: status_of(result) == Status.SUCCESSFUL, timeout=60, message="the async task")
    assert (result.return_value, result.worker_ids) == (42, ["async"])


def test_a_failing_task_gains_an_error_per_attempt_and_ends_failed_with_a_dead_letter(workers):
    result = tasks_django.fails_until.enqueue(99)
    workers.start("--worker-id", "failing")
    wait_for(lambda: status_of(result) == Status.FAILED, timeout=90, message="the task to fail for good")
    job = Job.objects.get(pk=int(result.id))
    assert result.attempts == len(result.errors) == job.max_attempts
    for attempt, error in enumerate(result.errors, start=1):
        assert error.exception_class_path == "builtins.ValueError"
        assert f"attempt {attempt} fails on purpose" in error.traceback
    letter = DeadLetter.objects.get(job=job)
    assert (letter.reason, letter.attempts) == ("retries_exhausted", job.max_attempts)
