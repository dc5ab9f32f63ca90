"""The JobGuardBackend contract: Django's Tasks API on jobguard's table and worker.

Runs on django.tasks (Django 6.0, 6.1) and on the django-tasks backport (Django 5.2);
skips, saying why, where neither is importable.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import sys
import time

import pytest
from django.conf import settings

if not getattr(settings, "TASKS_ROOT", None):
    pytest.skip(
        "neither django.tasks (Django 6.0+) nor the django-tasks backport is importable; "
        'on Django 5.2: pip install "django-jobguard[backport]"',
        allow_module_level=True,
    )

from asgiref.sync import async_to_sync, sync_to_async
from django.core.checks import run_checks
from django.db import connections
from django.test import override_settings
from django.utils import timezone
from django.utils.module_loading import import_string

from django_jobguard.backends import JobGuardBackend, _compat
from django_jobguard.models import DeadLetter, Job
from django_jobguard.worker import Worker
from tests.testapp import tasks_django

pytestmark = pytest.mark.django_db(transaction=True)

Status = _compat.TaskResultStatus
task = tasks_django.task


def run_burst(**options):
    options.setdefault("concurrency", 1)
    return Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, **options).run()


def run_until_finished(result, rounds=200):
    """Burst until ``result`` is finished (retries come due after a short backoff)."""
    for _ in range(rounds):
        assert run_burst() == 0
        result.refresh()
        if result.is_finished:
            return result
        time.sleep(0.05)
    pytest.fail(f"result {result.id} still {result.status} after {rounds} bursts")


# -- the backend ---------------------------------------------------------------------------


def test_the_compat_module_picks_the_root_of_this_django():
    import django

    assert _compat.ROOT == ("django.tasks" if django.VERSION >= (6,) else "django_tasks")
    assert issubclass(_compat.InvalidTask, Exception)
    assert _compat.InvalidTask.__name__ in ("InvalidTask", "InvalidTaskError")


def test_the_backend_declares_every_feature():
    backend = _compat.task_backends["default"]
    assert isinstance(backend, JobGuardBackend)
    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)


def test_enqueue_stores_a_job_in_jobguards_table_and_returns_a_ready_result():
    result = tasks_django.add.enqueue(2, b=3)
    job = Job.objects.get(pk=int(result.id))
    assert (job.task_name, job.args, job.kwargs, job.status) == (
        "tests.testapp.tasks_django.add",
        [2],
        {"b": 3},
        "queued",
    )
    assert result.status == Status.READY
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None, None, None)
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert result.enqueued_at == job.enqueued_at
    assert result.backend == "default"
    with pytest.raises(ValueError, match="not finished yet"):
        result.return_value  # noqa: B018 - the property raises


def test_get_result_equals_what_enqueue_returned_field_by_field():
    result = tasks_django.echo.enqueue(1, "two", [3], four={"five": 5})
    again = tasks_django.echo.get_result(result.id)
    assert again == result
    for name in ("id", "status", "enqueued_at", "started_at", "finished_at", "last_attempted_at"):
        assert getattr(again, name) == getattr(result, name), name
    assert (again.args, again.kwargs) == ([1, "two", [3]], {"four": {"five": 5}})
    assert (again.task.priority, again.task.queue_name) == (5, "slow")


def test_a_successful_run_round_trips_every_field_to_the_microsecond():
    result = tasks_django.add.enqueue(20, 22)
    assert run_burst(worker_id="contract-worker") == 0
    done = tasks_django.add.get_result(result.id)
    job = Job.objects.get(pk=int(result.id))
    assert done.status == Status.SUCCESSFUL
    assert done.return_value == 42
    assert done.worker_ids == ["contract-worker"] and done.attempts == 1
    assert done.errors == []
    assert done.enqueued_at == result.enqueued_at == job.enqueued_at
    assert done.started_at == done.last_attempted_at == job.started_at
    assert done.finished_at == job.finished_at
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert tasks_django.add.get_result(result.id) == done
    result.refresh()
    assert result == done


def test_the_context_attempt_starts_at_one_and_names_the_running_result():
    result = tasks_django.whoami.enqueue()
    run_burst()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "status": str(Status.RUNNING)}


def test_each_failed_attempt_adds_an_error_and_a_worker_id():
    result = tasks_django.fails_until.enqueue(3)
    run_until_finished(result)
    assert result.status == Status.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == len(result.worker_ids) == 3
    assert [error.exception_class_path for error in result.errors] == ["builtins.ValueError"] * 2
    assert result.errors[0].exception_class is ValueError
    assert "attempt 1 fails on purpose" in result.errors[0].traceback
    assert "Traceback" in result.errors[1].traceback
    assert result.started_at < result.last_attempted_at


def test_a_task_failing_every_attempt_ends_failed_with_a_dead_letter():
    result = tasks_django.always_fails.enqueue()
    run_until_finished(result)
    job = Job.objects.get(pk=int(result.id))
    assert result.status == Status.FAILED
    assert len(result.errors) == result.attempts == job.max_attempts
    assert all(e.exception_class_path == "builtins.ValueError" for e in result.errors)
    assert DeadLetter.objects.get(job=job).reason == "retries_exhausted"
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018 - the property raises


def test_a_non_json_return_value_fails_the_job_permanently_with_a_clear_error():
    result = tasks_django.returns_set.enqueue()
    run_until_finished(result)
    assert result.status == Status.FAILED
    assert result.attempts == 1
    (error,) = result.errors
    assert error.exception_class_path == "builtins.TypeError"
    assert "builtins.set is not JSON-serialisable" in error.traceback
    assert DeadLetter.objects.get(job_id=int(result.id)).reason == "invalid_result"


def test_a_cancelled_job_reads_as_failed():
    result = tasks_django.add.enqueue(1, 1)
    Job.objects.filter(pk=int(result.id)).update(status="cancelled", finished_at=timezone.now())
    result.refresh()
    assert result.status == Status.FAILED


def test_a_job_waiting_for_its_retry_reads_as_ready():
    result = tasks_django.fails_until.enqueue(2)
    run_burst()
    result.refresh()
    assert result.status == Status.READY
    assert len(result.errors) == 1 and result.attempts == 1


def test_unknown_and_malformed_ids_raise_does_not_exist():
    backend = _compat.task_backends["default"]
    # The last one is an Arabic-Indic digit one: a digit, but not ASCII.
    for bad in ("999999999", "abc", "", "-1", " 1", "1.0", "\u0661"):
        with pytest.raises(_compat.TaskResultDoesNotExist, match="result"):
            backend.get_result(bad)


def test_the_result_of_another_task_raises_mismatch():
    result = tasks_django.add.enqueue(1, 2)
    with pytest.raises(_compat.TaskResultMismatch, match=re.escape("tests.testapp.tasks_django.add")):
        tasks_django.whoami.get_result(result.id)


def test_jobguards_own_jobs_are_not_results_of_the_backend():
    from tests.testapp import tasks

    job = tasks.add.enqueue(1, b=2)
    with pytest.raises(_compat.TaskResultDoesNotExist, match="not a task of backend"):
        _compat.task_backends["default"].get_result(str(job.pk))


def test_run_after_defers_the_job_and_round_trips():
    later = timezone.now() + datetime.timedelta(hours=1)
    result = tasks_django.add.using(run_after=later).enqueue(1, 1)
    assert Job.objects.get(pk=int(result.id)).run_after == later
    assert tasks_django.add.get_result(result.id) == result
    assert result.task.run_after == later
    run_burst()
    result.refresh()
    assert result.status == Status.READY


def test_priority_orders_the_claims():
    low = tasks_django.add.using(priority=-10).enqueue(1, 1)
    high = tasks_django.add.using(priority=10).enqueue(2, 2)
    run_burst()
    low.refresh()
    high.refresh()
    assert high.started_at <= low.started_at


# -- validation: Django's messages and exception ---------------------------------------


def test_validation_uses_djangos_messages_and_exception():
    naive = datetime.datetime(2030, 1, 1)  # noqa: DTZ001 - naive on purpose
    with pytest.raises(_compat.InvalidTask, match="priority must be a whole number between -100 and 100"):
        tasks_django.add.using(priority=101)
    with pytest.raises(_compat.InvalidTask, match="run_after must be an aware datetime"):
        tasks_django.add.using(run_after=naive)
    with pytest.raises(_compat.InvalidTask, match="Queue 'nowhere' is not valid for backend"):
        tasks_django.add.using(queue_name="nowhere")

    def local() -> None: ...

    with pytest.raises(_compat.InvalidTask, match="Task function must be defined at a module level"):
        task(local)

    def no_context() -> None: ...

    no_context.__qualname__ = "no_context"  # looks module level, so the context check is reached
    with pytest.raises(_compat.InvalidTask, match="Task takes context but does not have a first argument"):
        task(takes_context=True)(no_context)


def test_non_json_arguments_are_refused_at_enqueue_and_write_nothing():
    # Django's own suite matches "Unsupported type"; ours adds the argument and the fix.
    expected = r"args\[0\]: Unsupported type: datetime\.date is not JSON-serialisable"
    with pytest.raises(TypeError, match=expected):
        tasks_django.add.enqueue(datetime.date(2030, 1, 1), 1)
    assert not Job.objects.exists()


def test_non_json_arguments_are_refused_by_aenqueue_in_djangos_words():
    with pytest.raises(TypeError, match="Unsupported type"):
        async_to_sync(tasks_django.add.aenqueue)({1, 2}, 1)
    assert not Job.objects.exists()


def test_a_stored_path_that_is_not_a_task_is_refused_never_run(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGUARD_TEST_MARKER", str(tmp_path))
    result = tasks_django.add.enqueue(1, 1)
    Job.objects.filter(pk=int(result.id)).update(task_name="tests.testapp.tasks_django.not_a_task", args=[])
    run_burst()
    letter = DeadLetter.objects.get(job_id=int(result.id))
    assert letter.reason == "unknown_task"
    assert "tests.testapp.tasks_django.not_a_task" in letter.error_message
    assert not (tmp_path / "not_a_task.ran").exists()


def test_a_stored_path_outside_the_installed_apps_is_never_imported(tmp_path, monkeypatch):
    monkeypatch.setenv("JOBGUARD_TEST_MARKER", str(tmp_path))
    result = tasks_django.add.enqueue(1, 1)
    Job.objects.filter(pk=int(result.id)).update(task_name="tests.import_side_effect.anything", args=[])
    run_burst()
    letter = DeadLetter.objects.get(job_id=int(result.id))
    assert letter.reason == "unknown_task"
    assert "tests.import_side_effect" not in sys.modules
    assert not (tmp_path / "imported").exists()


# -- async -------------------------------------------------------------------------------


def test_an_async_task_runs_in_the_worker():
    result = tasks_django.add_async.enqueue(40, 2)
    run_burst()
    result.refresh()
    assert (result.status, result.return_value) == (Status.SUCCESSFUL, 42)


def test_aenqueue_and_aget_result_work_inside_an_event_loop():
    async def scenario():
        result = await tasks_django.add.aenqueue(3, 4)
        try:
            return result, await tasks_django.add.aget_result(result.id)
        finally:
            # The thread sync_to_async ran them in keeps its connection open otherwise.
            await sync_to_async(connections.close_all)()

    result, again = asyncio.run(scenario())
    assert again == result
    assert Job.objects.filter(pk=int(result.id), status="queued").exists()


# -- signals -----------------------------------------------------------------------------


def test_djangos_signals_are_sent_with_the_backend_class_and_the_result():
    seen: list[tuple[str, type, str, str]] = []

    def receiver(name):
        def receive(sender, task_result, **kwargs):
            seen.append((name, sender, task_result.id, str(task_result.status)))

        return receive

    handlers = {name: receiver(name) for name in ("task_enqueued", "task_started", "task_finished")}
    for name, handler in handlers.items():
        getattr(_compat, name).connect(handler)
    try:
        ok = tasks_django.add.enqueue(1, 2)
        bad = tasks_django.returns_set.enqueue()
        run_burst()
    finally:
        for name, handler in handlers.items():
            getattr(_compat, name).disconnect(handler)
    assert ("task_enqueued", JobGuardBackend, ok.id, str(Status.READY)) in seen
    assert ("task_started", JobGuardBackend, ok.id, str(Status.RUNNING)) in seen
    assert ("task_finished", JobGuardBackend, ok.id, str(Status.SUCCESSFUL)) in seen
    assert ("task_finished", JobGuardBackend, bad.id, str(Status.FAILED)) in seen


# -- options -----------------------------------------------------------------------------


@pytest.mark.skipif(
    not tasks_django.TASK_TAKES_OPTIONS, reason="this Django's @task passes no extra keywords (Django 6.0)"
)
def test_jobguard_options_pass_through_djangos_decorator():
    result = tasks_django.with_options.enqueue(thing_id=7)
    job = Job.objects.get(pk=int(result.id))
    assert (job.max_attempts, job.lock_key) == (2, "thing:7")
    run_until_finished(result)
    assert result.status == Status.FAILED
    assert [e.exception_class_path for e in result.errors] == ["tests.testapp.tasks_django.RetryMe"] * 2
    assert DeadLetter.objects.get(job=job).reason == "retries_exhausted"


@pytest.mark.skipif(
    not tasks_django.TASK_TAKES_OPTIONS, reason="this Django's @task passes no extra keywords (Django 6.0)"
)
def test_an_invalid_jobguard_option_is_djangos_invalid_task():
    with pytest.raises(_compat.InvalidTask, match=re.escape("lock template 'x:{nope}' names 'nope'")):
        task(lock="x:{nope}")(tasks_django.add.func)


@pytest.mark.skipif(
    not tasks_django.TASK_TAKES_OPTIONS, reason="this Django's @task passes no extra keywords (Django 6.0)"
)
def test_the_checklists_classification_passes_through_djangos_decorator():
    from django_jobguard import checks

    first = tasks_django.keyed.enqueue(thing_id=5)
    again = tasks_django.keyed.enqueue(thing_id=5)
    assert again.id == first.id  # the key template dedupes, as on jobguard's own @task
    assert Job.objects.get(pk=int(first.id)).idempotency_key == "thing:5"
    tasks_django.natural.enqueue(thing_id=5)
    names = {"tests.testapp.tasks_django.keyed", "tests.testapp.tasks_django.natural"}
    said = [m for m in checks.tasks.check_task_classification() if getattr(m.obj, "name", None) in names]
    assert said == []


def test_the_backends_options_are_defaults_for_its_tasks():
    tasks_config = {
        "default": {
            "BACKEND": "django_jobguard.backends.JobGuardBackend",
            "QUEUES": ["default", "slow"],
            "OPTIONS": {"max_attempts": 3},
        }
    }
    with override_settings(TASKS=tasks_config):
        fresh = import_string(f"{settings.TASKS_ROOT}.task")(tasks_django.always_fails.func)
        result = fresh.enqueue()
        assert Job.objects.get(pk=int(result.id)).max_attempts == 3


def test_an_unknown_backend_option_names_the_full_key():
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=r"TASKS\['x'\]\['OPTIONS'\]\['lock'\] is not an option"):
        JobGuardBackend("x", {"OPTIONS": {"lock": "a"}})


def test_check_warns_about_a_queue_jobguard_does_not_configure():
    backend = JobGuardBackend("extra", {"QUEUES": ["default", "elsewhere"]})
    messages = list(backend.check())
    assert [m.id for m in messages] == ["jobguard.W017"]
    assert "'elsewhere'" in messages[0].msg
    silenced = set(settings.SILENCED_SYSTEM_CHECKS)  # run_checks() does not apply it; manage.py check does
    assert not [
        m for m in run_checks() if m.id.startswith("jobguard.") and m.level >= 30 and m.id not in silenced
    ]


# -- the admin -----------------------------------------------------------------------------


def test_the_job_admin_shows_the_attempt_timeline(admin_client):
    result = tasks_django.fails_until.enqueue(2)
    run_until_finished(result)
    page = admin_client.get(f"/admin/jobguard/job/{result.id}/change/").content.decode()
    assert "Attempt timeline" in page
    assert "builtins.ValueError" in page
    assert result.worker_ids[0] in page
