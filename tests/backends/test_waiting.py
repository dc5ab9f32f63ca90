"""wait_for() and await_for(): a Django TaskResult of the jobguard backend waited on with
Job.wait()'s wake-up, then refreshed (SUCCESSFUL or FAILED, as Django's API reads them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from django.conf import settings

if not getattr(settings, "TASKS_ROOT", None):
    pytest.skip(
        "neither django.tasks (Django 6.0+) nor the django-tasks backport is importable; "
        'on Django 5.2: pip install "django-jobguard[backport]"',
        allow_module_level=True,
    )

from asgiref.sync import sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_jobguard.backends import _compat, await_for, wait_for
from django_jobguard.exceptions import InvalidArgumentsError, WaitTimeout
from django_jobguard.models import Job
from django_jobguard.worker import Worker
from tests.conftest import wait_for as wait_until
from tests.testapp import tasks_django

pytestmark = pytest.mark.django_db(transaction=True)

Status = _compat.TaskResultStatus


def run_until_settled(result: Any) -> None:
    """Burst workers until the result's job settles (retries come due after a short backoff)."""

    def burst_settled() -> bool:
        try:
            assert Worker(burst=True, install_signal_handlers=False, poll_interval=0.05).run() == 0
        finally:
            connections.close_all()
        return Job.objects.filter(pk=int(result.id), status__in=["succeeded", "dead", "cancelled"]).exists()

    wait_until(burst_settled, timeout=120, interval=0.05, message=f"job {result.id} to settle")


@pytest.fixture
def in_thread() -> Iterator[Callable[..., Future[Any]]]:
    """Run a callable on another thread (its own database connection, closed after)."""
    pool = ThreadPoolExecutor(max_workers=2)

    def submit(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        def run() -> Any:
            try:
                return function(*args, **kwargs)
            finally:
                connections.close_all()

        return pool.submit(run)

    yield submit
    pool.shutdown(wait=True)


def test_wait_for_returns_the_result_refreshed_once_a_worker_ran_the_job(in_thread):
    result = tasks_django.add.enqueue(2, b=3)
    waiter = in_thread(wait_for, result, timeout=120)
    run_until_settled(result)
    assert waiter.result(timeout=120) is result
    assert result.status == Status.SUCCESSFUL
    assert result.return_value == 5
    assert result.finished_at is not None


def test_a_task_that_failed_reads_failed_with_its_errors_and_raises_nothing(in_thread):
    result = tasks_django.always_fails.enqueue()
    waiter = in_thread(wait_for, result, timeout=120)
    run_until_settled(result)
    assert waiter.result(timeout=120) is result
    assert result.status == Status.FAILED
    assert result.errors and all(e.exception_class_path == "builtins.ValueError" for e in result.errors)


def test_a_cancelled_job_reads_failed():
    result = tasks_django.add.enqueue(1, 1)
    Job.objects.filter(pk=int(result.id)).update(status="cancelled", finished_at=timezone.now())
    assert wait_for(result, timeout=5).status == Status.FAILED


def test_a_timeout_raises_a_timeout_error_and_leaves_the_result_as_it_was():
    result = tasks_django.add.enqueue(1, 2)
    with pytest.raises(WaitTimeout, match=f"Job {result.id} did not settle within 0.05 s"):
        wait_for(result, timeout=0.05)
    assert result.status == Status.READY
    assert Job.objects.get(pk=int(result.id)).status == "queued"


def test_a_finished_result_returns_at_once_without_a_query(django_assert_num_queries):
    result = tasks_django.add.enqueue(4, 4)
    run_until_settled(result)
    result.refresh()
    with django_assert_num_queries(0):
        assert wait_for(result, timeout=0).return_value == 8


@pytest.mark.parametrize("value", [None, "12", 12])
def test_anything_but_a_task_result_is_refused_naming_the_argument(value):
    with pytest.raises(InvalidArgumentsError, match="result must be the TaskResult"):
        wait_for(value)


def test_a_result_of_another_tasks_backend_is_refused_naming_it():
    dummy = {"BACKEND": f"{settings.TASKS_ROOT}.backends.dummy.DummyBackend"}
    with override_settings(TASKS={**settings.TASKS, "dummy": dummy}):
        result = tasks_django.add.using(backend="dummy").enqueue(1, 2)
        with pytest.raises(InvalidArgumentsError, match="of the tasks backend 'dummy' \\(DummyBackend\\)"):
            wait_for(result, timeout=1)


def test_a_negative_timeout_is_refused():
    result = tasks_django.add.enqueue(1, 2)
    with pytest.raises(ValueError, match="timeout must be 0 or more"):
        wait_for(result, timeout=-1)


def test_await_for_waits_without_blocking_the_loop_and_wait_for_is_refused_there():
    result = tasks_django.add.enqueue(20, b=22)
    ticks = 0

    async def main() -> Any:
        nonlocal ticks
        with pytest.raises(SynchronousOnlyOperation, match=r"use await await_for\(result\)"):
            wait_for(result, timeout=5)
        waiting = asyncio.ensure_future(await_for(result, timeout=120))
        loop = asyncio.get_running_loop()
        # The executor's thread closes what it opened (its last read included).
        worker = loop.run_in_executor(None, lambda: (run_until_settled(result), connections.close_all()))
        while not waiting.done():  # the loop keeps turning while the waiter waits
            ticks += 1
            await asyncio.sleep(0.01)
        await worker
        try:
            return await waiting
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    assert asyncio.run(main()) is result
    assert result.status == Status.SUCCESSFUL
    assert result.return_value == 42
    assert ticks > 0
