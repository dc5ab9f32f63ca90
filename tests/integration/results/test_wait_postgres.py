"""On PostgreSQL a waiter is woken by its job's settlement (migration 0027's trigger), not a poll."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

from django_jobguard.models import Job
from django_jobguard.results import waiting
from django_jobguard.store import listener as listener_module
from django_jobguard.store import settled
from django_jobguard.worker import Worker
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


@pytest.fixture
def no_backstop(monkeypatch: pytest.MonkeyPatch) -> None:
    """No periodic re-read: a waiter that returns was woken by the notification."""
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 3600.0)
    monkeypatch.setattr(waiting, "POLL_FIRST_SECONDS", 3600.0)  # nor by a fallback poll


@pytest.fixture
def in_thread() -> Iterator[Callable[..., Future[Any]]]:
    pool = ThreadPoolExecutor(max_workers=8)

    def submit(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        def run() -> Any:
            try:
                return function(*args, **kwargs)
            finally:
                connections.close_all()

        return pool.submit(run)

    yield submit
    pool.shutdown(wait=True)


def run_burst() -> None:
    try:
        assert Worker(burst=True, install_signal_handlers=False, poll_interval=0.05).run() == 0
    finally:
        connections.close_all()


def listening_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN jobguard_settled'"
        )
        return int(cursor.fetchone()[0])


def settle(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(status="succeeded", result=1)


def test_only_a_waited_jobs_settlement_notifies():
    plain, waited = tasks.add.enqueue(1), tasks.add.enqueue(2)
    assert settled.mark_waited("default", waited.pk) is True
    listen = listener_module.listen_connection("default", settled.SETTLED_CHANNEL)
    try:
        settle(plain)  # committed first: had it notified, its notification would come first
        settle(waited)
        heard = [note.payload for note in listen.notifies(timeout=30, stop_after=1)]
    finally:
        listen.close()
    assert heard == [str(waited.pk)]
    assert list(
        Job.objects.filter(pk__in=[plain.pk, waited.pk]).order_by("pk").values_list("waited", flat=True)
    ) == [
        False,
        True,
    ]


def test_a_settled_job_is_not_flagged():
    job = tasks.add.enqueue(1)
    settle(job)
    assert settled.mark_waited("default", job.pk) is False
    assert settled.mark_waited("default", 987654321) is False
    assert Job.objects.get(pk=job.pk).waited is False


def test_waiters_in_threads_are_woken_through_one_listen_connection(in_thread, no_backstop):
    jobs = [tasks.add.enqueue(i, b=100) for i in range(5)]
    listener = settled.settle_listener("default")
    assert listener is not None
    waiters = [in_thread(job.wait, timeout=300) for job in jobs]

    def all_waiting() -> bool:
        return listener.waiters == len(jobs) and Job.objects.filter(
            pk__in=[j.pk for j in jobs], waited=True
        ).count() == len(jobs)

    wait_for(all_waiting, timeout=120, message="every waiter to flag its job")
    assert listening_sessions() == 1
    run_burst()
    assert [w.result(timeout=300) for w in waiters] == [i + 100 for i in range(5)]
    assert listener.waiters == 0


def test_coroutines_are_woken_through_one_listen_connection(no_backstop):
    jobs = [tasks.add.enqueue(i, b=1) for i in range(200)]
    listener = settled.settle_listener("default")
    assert listener is not None
    seen: dict[str, int] = {}

    async def main() -> list[Any]:
        waits = [asyncio.ensure_future(job.await_result(timeout=300)) for job in jobs]
        deadline = time.monotonic() + 120  # every waiter subscribed and its row flagged
        while listener.waiters < len(jobs) or await sync_to_async(flagged, thread_sensitive=True)() < len(
            jobs
        ):
            assert time.monotonic() < deadline, f"{listener.waiters} of {len(jobs)} waiters subscribed"
            await asyncio.sleep(0.05)
        seen["sessions"] = await sync_to_async(listening_sessions, thread_sensitive=True)()
        worker = threading.Thread(target=run_burst)
        worker.start()
        results = await asyncio.gather(*waits)
        await asyncio.get_running_loop().run_in_executor(None, worker.join)
        await sync_to_async(connections.close_all, thread_sensitive=True)()
        return results

    def flagged() -> int:
        return Job.objects.filter(pk__in=[j.pk for j in jobs], waited=True).count()

    assert asyncio.run(main()) == [i + 1 for i in range(200)]
    assert seen["sessions"] == 1


def test_a_pooled_database_without_listen_database_polls(in_thread):
    with override_settings(JOBGUARD={**settings.JOBGUARD, "POOLED_DATABASES": ["default"]}):
        assert settled.settle_listener("default") is None
        job = tasks.add.enqueue(3, b=3)
        waiter = in_thread(job.wait, timeout=120)
        run_burst()
        assert waiter.result(timeout=120) == 6
    assert Job.objects.get(pk=job.pk).waited is False  # nobody listens there: no flag


def test_flagging_a_due_queued_job_announces_its_queue_again():
    # A claim passes over the row while its flag is written: the flag wakes the queue's workers.
    job = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(1)  # not announced
    Job.objects.filter(pk=job.pk).update(run_after=job.enqueued_at)  # due now, still not announced
    later = tasks.add.using(queue_name="slow", run_after=datetime.timedelta(hours=1)).enqueue(2)
    listen = listener_module.listen_connection("default", "jobguard_jobs")
    try:
        assert settled.mark_waited("default", later.pk) is True  # not due: no announcement
        assert settled.mark_waited("default", job.pk) is True
        heard = [note.payload for note in listen.notifies(timeout=30, stop_after=1)]
    finally:
        listen.close()
    assert heard == [job.queue_name]
