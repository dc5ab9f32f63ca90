"""Job.wait() and Job.await_result(): what a waiter gets back for each way a job settles.

The worker runs in this process (burst mode, on a thread where the waiter must be waiting);
tests/processes/test_wait_processes.py puts it in another process.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings

from django_jobguard import (
    InvalidArgumentsError,
    JobCancelled,
    JobFailed,
    JobNotFound,
    PermanentError,
    ResultExpired,
    ResultNotStored,
    WaitTimeout,
    task,
)
from django_jobguard.conf import get_settings
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.models import Job
from django_jobguard.operations import jobs as job_ops
from django_jobguard.results import waiting
from django_jobguard.store import settled
from django_jobguard.worker import Worker
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@task(name="tests.results.declines", max_attempts=1)
def declines(order_id: int) -> None:
    raise PermanentError(f"card declined for order {order_id}")


@task(name="tests.results.keeps_nothing", result_retention=0)
def keeps_nothing() -> int:
    return 1


@task(name="tests.results.keeps_a_minute", result_retention=60)
def keeps_a_minute() -> int:
    return 2


def run_burst() -> None:
    try:
        assert Worker(burst=True, install_signal_handlers=False, poll_interval=0.05).run() == 0
    finally:
        connections.close_all()


@pytest.fixture
def in_thread() -> Iterator[Callable[..., Future[Any]]]:
    """Run a callable on another thread (its own database connection, closed after)."""
    pool = ThreadPoolExecutor(max_workers=4)

    def submit(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        def run() -> Any:
            try:
                return function(*args, **kwargs)
            finally:
                connections.close_all()

        return pool.submit(run)

    yield submit
    pool.shutdown(wait=True)


def waiting_on(job: Job) -> None:
    """Until a waiter on PostgreSQL has flagged the job (so the test waits before the job settles)."""
    if connections["default"].vendor == "postgresql":
        listener = settled.settle_listener("default")
        assert listener is not None
        wait_for(
            lambda: Job.objects.filter(pk=job.pk, waited=True).exists() and listener.waiters >= 1,
            timeout=120,
            message="the waiter to flag its job",
        )


def burst_until_settled(job: Job) -> None:
    """Burst until the job settles: a claim passes over a row while a waiter's flag is being
    written (a worker that stays is woken again by the flag's NOTIFY; a burst worker exits)."""

    def burst_settled() -> bool:
        run_burst()
        return Job.objects.filter(pk=job.pk, status__in=["succeeded", "dead", "cancelled"]).exists()

    wait_for(burst_settled, timeout=120, interval=0.05, message=f"job {job.pk} to settle")


def close_async_connections() -> None:
    """Close the connection of the thread ``sync_to_async`` ran the reads on (it outlives the loop)."""
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


def finished_ago(job: Job, seconds: float) -> None:
    Job.objects.filter(pk=job.pk).update(finished_at=job.finished_at - datetime.timedelta(seconds=seconds))


# -- what a waiter gets back ----------------------------------------------------------------------


def test_wait_returns_the_result_once_a_worker_runs_the_job_meanwhile(in_thread):
    job = tasks.add.enqueue(20, b=22)
    waiter = in_thread(job.wait, timeout=120)
    waiting_on(job)
    burst_until_settled(job)
    assert waiter.result(timeout=120) == 42


def test_wait_on_a_settled_job_returns_its_result_and_the_instance_says_succeeded():
    job = tasks.add.enqueue(1, b=2)
    run_burst()
    assert (job.status, job.result) == ("queued", None)  # the instance as enqueued
    assert job.wait(timeout=5) == 3
    assert (job.status, job.result) == ("succeeded", 3)


def test_a_dead_job_raises_its_final_error_with_class_and_message():
    job = declines.enqueue(7)
    run_burst()
    with pytest.raises(JobFailed) as caught:
        job.wait(timeout=5)
    error = caught.value
    assert (error.job_id, error.error_class, error.reason) == (
        job.pk,
        "django_jobguard.exceptions.PermanentError",
        "permanent_error",
    )
    assert error.error_message == "card declined for order 7"
    assert error.dead_letter_id == job.dead_letter.pk
    assert str(error) == (
        f"Job {job.pk} failed (permanent_error): django_jobguard.exceptions.PermanentError: "
        "card declined for order 7"
    )


def test_a_cancelled_job_raises_job_cancelled_with_the_reason(in_thread):
    job = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(1)
    waiter = in_thread(job.wait, timeout=120)
    waiting_on(job)
    wait_for(lambda: job_ops.cancel([job.pk], reason="customer left") == [job.pk], message="the cancel")
    with pytest.raises(
        JobCancelled, match=rf"Job {job.pk} was cancelled, so it has no result \(cancelled: customer left\)"
    ):
        waiter.result(timeout=120)


def test_a_timeout_raises_a_timeout_error_and_leaves_the_job_queued():
    job = tasks.add.enqueue(1)
    with pytest.raises(TimeoutError, match=rf"Job {job.pk} did not settle within 0.05 s") as caught:
        job.wait(timeout=0.05)
    assert isinstance(caught.value, WaitTimeout) and caught.value.job_id == job.pk
    with pytest.raises(WaitTimeout, match="within 0 s"):
        job.wait(timeout=0)  # one look
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("queued", 0)


def test_a_job_retried_meanwhile_is_waited_for_until_its_last_attempt(in_thread):
    job = tasks.flaky.enqueue("retried", failures=1)
    waiter = in_thread(job.wait, timeout=120)
    waiting_on(job)
    for _ in range(200):
        run_burst()
        job.refresh_from_db()
        if job.status == "succeeded":
            break
        Job.objects.filter(pk=job.pk).update(run_after=job.enqueued_at)  # the backoff, skipped
    assert waiter.result(timeout=120) == 2  # the attempt that succeeded


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [-1, -0.001, float("nan")])
def test_a_negative_timeout_is_refused_naming_the_argument(timeout):
    job = tasks.add.enqueue(1)
    with pytest.raises(
        ValueError, match=r"timeout must be 0 or more seconds \(or None to wait without a limit\)"
    ):
        job.wait(timeout=timeout)


@pytest.mark.parametrize("timeout", ["5", True, [1]])
def test_a_timeout_that_is_not_a_number_is_refused(timeout):
    job = tasks.add.enqueue(1)
    with pytest.raises(InvalidArgumentsError, match="timeout must be a number of seconds"):
        job.wait(timeout=timeout)


def test_a_job_that_does_not_exist_is_a_clear_error():
    with pytest.raises(JobNotFound, match="No job 987654321: never enqueued") as caught:
        Job(pk=987654321).wait(timeout=5)
    assert isinstance(caught.value, LookupError)
    with pytest.raises(JobNotFound, match="never saved"):
        Job(task_name="x").wait(timeout=5)


def test_a_job_whose_row_was_pruned_says_its_result_expired():
    job = tasks.add.enqueue(1)
    run_burst()
    Job.objects.filter(pk=job.pk).delete()
    with pytest.raises(ResultExpired, match=rf"Job {job.pk} is gone: its row was deleted"):
        job.wait(timeout=5)


def test_a_task_that_keeps_no_result_is_refused_at_once_without_waiting():
    job = keeps_nothing.enqueue()
    with pytest.raises(ResultNotStored, match=r"keeps no result to wait for \(@task\(result_retention=0\)\)"):
        job.wait()  # no timeout: it would block if it waited
    run_burst()
    with pytest.raises(ResultNotStored):
        Job(pk=job.pk).wait(timeout=5)  # known only from the row


def test_waiting_inside_a_transaction_is_refused_unless_the_job_settled():
    job = tasks.add.enqueue(1, b=1)
    with transaction.atomic():
        with pytest.raises(TransactionManagementError, match="cannot wait inside a transaction"):
            job.wait(timeout=5)
    run_burst()
    with transaction.atomic():
        assert job.wait(timeout=5) == 2


# -- results expire -----------------------------------------------------------------------------


def test_a_result_past_its_tasks_retention_has_expired():
    job = keeps_a_minute.enqueue()
    run_burst()
    job.refresh_from_db()
    assert job.wait(timeout=5) == 2
    finished_ago(job, 61)
    with pytest.raises(
        ResultExpired, match=rf"Job {job.pk}'s result expired: it finished 6\d s ago .* kept 60 s"
    ):
        job.wait(timeout=5)


def test_the_global_result_retention_applies_to_tasks_without_their_own():
    job = tasks.add.enqueue(1)
    run_burst()
    job.refresh_from_db()
    finished_ago(job, 3600)
    assert job.wait(timeout=5) == 1  # None by default: as long as the row is kept
    with override_settings(JOBGUARD={**settings.JOBGUARD, "RETENTION": {"RESULTS": 1800}}):
        assert get_settings().retention.results == 1800
        with pytest.raises(ResultExpired, match="kept 1800 s"):
            job.wait(timeout=5)


@pytest.mark.parametrize("value", [-1, "1h", True])
def test_a_bad_result_retention_is_refused(value):
    with pytest.raises(InvalidTaskError, match="result_retention must be a number of seconds, 0 or more"):
        task(name="tests.results.bad", result_retention=value)(lambda: None)
    with (
        override_settings(JOBGUARD={**settings.JOBGUARD, "RETENTION": {"RESULTS": value}}),
        pytest.raises(ImproperlyConfigured, match=r"RESULTS"),
    ):
        get_settings()


# -- async ----------------------------------------------------------------------------------------


def test_await_result_returns_the_result_without_blocking_the_loop():
    job = tasks.add.enqueue(2, b=3)
    ticks = 0

    async def main() -> Any:
        nonlocal ticks
        waiting = asyncio.ensure_future(job.await_result(timeout=120))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: (waiting_on(job), connections.close_all()))
        worker = loop.run_in_executor(None, burst_until_settled, job)
        while not waiting.done():  # the loop keeps turning while the waiter waits
            ticks += 1
            await asyncio.sleep(0.01)
        await worker
        return await waiting

    assert asyncio.run(main()) == 5
    close_async_connections()
    assert ticks > 0


def test_await_result_raises_as_wait_does():
    dead = declines.enqueue(8)
    run_burst()
    pending = tasks.add.enqueue(1)

    async def main() -> None:
        with pytest.raises(JobFailed, match="card declined for order 8"):
            await dead.await_result(timeout=5)
        with pytest.raises(WaitTimeout):
            await pending.await_result(timeout=0.05)
        with pytest.raises(ValueError, match="timeout must be 0 or more"):
            await pending.await_result(timeout=-1)

    asyncio.run(main())
    close_async_connections()


def test_more_waiters_than_one_read_holds_each_get_their_own_result(monkeypatch):
    # The batcher reads READ_ROWS rows per round trip; the rest are read in the next ones.
    monkeypatch.setattr(waiting, "READ_ROWS", 3)
    jobs = [tasks.add.enqueue(i, b=100) for i in range(8)]
    for job in jobs:
        burst_until_settled(job)

    async def main() -> list[Any]:
        return await asyncio.gather(*(job.await_result(timeout=60) for job in jobs))

    assert asyncio.run(main()) == [i + 100 for i in range(8)]
    close_async_connections()


def test_the_blocking_wait_is_refused_inside_an_event_loop():
    job = tasks.add.enqueue(1)

    async def main() -> None:
        with pytest.raises(SynchronousOnlyOperation, match=r"use await job.await_result\(\) in async code"):
            job.wait(timeout=5)

    asyncio.run(main())


def test_aenqueue_stores_the_job_from_async_code():
    async def main() -> Job:
        return await tasks.add.aenqueue(4, b=4)

    job = asyncio.run(main())
    close_async_connections()
    assert Job.objects.get(pk=job.pk).kwargs == {"b": 4}
    run_burst()
    assert job.wait(timeout=5) == 8


def test_many_threads_wait_on_one_job(in_thread):
    job = tasks.add.enqueue(5, b=5)
    started = threading.Barrier(4)

    def wait() -> Any:
        started.wait(timeout=60)
        return job.wait(timeout=120)

    waiters = [in_thread(wait) for _ in range(3)]
    started.wait(timeout=60)
    waiting_on(job)
    burst_until_settled(job)
    assert [w.result(timeout=120) for w in waiters] == [10, 10, 10]
