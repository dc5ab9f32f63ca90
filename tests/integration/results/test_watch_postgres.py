"""On PostgreSQL a watcher is woken by its job's new progress (migration 0029's trigger), not a poll."""

from __future__ import annotations

import asyncio
import select
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection, connections

from django_jobguard.models import Job
from django_jobguard.results import watching
from django_jobguard.store.listener import listen_connection
from django_jobguard.store.settled import SETTLED_CHANNEL, mark_waited, settle_listener
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def notifications(conn: Any) -> set[str]:
    """The payloads ``conn`` heard (after the statements before this call committed)."""
    select.select([conn.fileno()], [], [], 2.0)
    return {note.payload for note in conn.notifies(timeout=0.5)}


def test_a_watched_jobs_new_progress_notifies_and_an_unwatched_ones_does_not():
    watched = tasks.add.enqueue(1)
    unwatched = tasks.add.enqueue(2)
    Job.objects.filter(pk=watched.pk).update(waited=True)
    conn = listen_connection("default", SETTLED_CHANNEL)
    try:
        Job.objects.filter(pk__in=[watched.pk, unwatched.pk]).update(progress={"done": 1})
        assert notifications(conn) == {f"p{watched.pk}"}
        Job.objects.filter(pk=watched.pk).update(progress={"done": 1})  # the same: nothing new
        Job.objects.filter(pk=watched.pk).update(priority=5)  # no progress written
        assert notifications(conn) == set()
    finally:
        conn.close()


def _trigger_exists() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'jobguard_job_progress_notify'")
        return bool(cursor.fetchone()[0])


def test_the_progress_migration_reverses_and_applies_again():
    assert _trigger_exists()
    try:
        call_command("migrate", "jobguard", "0028", verbosity=0)
        assert not _trigger_exists()
    finally:
        call_command("migrate", "jobguard", verbosity=0)
    assert _trigger_exists()


def test_awatch_is_woken_by_each_new_progress(monkeypatch):
    monkeypatch.setattr(watching, "RECHECK_SECONDS", 3600.0)
    job = tasks.add.enqueue(1)

    async def follow() -> list[Any]:
        seen = []
        try:
            async for progress in job.awatch(timeout=60, interval=60):
                seen.append(progress["done"])
                if progress["done"] < 3:
                    await sync_to_async(Job.objects.filter(pk=job.pk).update)(
                        progress={"done": progress["done"] + 1}
                    )
                else:
                    await sync_to_async(Job.objects.filter(pk=job.pk).update)(status="cancelled")
        finally:  # the thread-sensitive thread's connection: else the test database stays in use
            await sync_to_async(connections.close_all, thread_sensitive=True)()
        return seen

    Job.objects.filter(pk=job.pk).update(progress={"done": 1})
    assert asyncio.run(follow()) == [1, 2, 3]  # the last woken by the settlement (0027)
    assert job.status == "cancelled"


def test_a_new_progress_wakes_the_jobs_watchers_and_not_its_waiters():
    job = tasks.add.enqueue(1)
    listener = settle_listener("default")
    assert listener is not None
    woke = {"waiter": 0, "watcher": 0}

    def waiter() -> None:
        woke["waiter"] += 1

    def watcher() -> None:
        woke["watcher"] += 1

    listener.subscribe(job.pk, waiter)
    listener.subscribe(job.pk, watcher, progress=True)
    try:
        assert listener.listening(10.0)
        assert mark_waited("default", job.pk)
        # Each dispatch calls the waiter, then the watcher; the connection's opening wakes
        # both, keeping them level. The report puts the watcher one ahead; had it woken the
        # waiter too, they would stay level.
        Job.objects.filter(pk=job.pk).update(progress={"done": 1})
        wait_for(lambda: woke["watcher"] - woke["waiter"] == 1, message="the watcher alone to be woken")
        waiter_before = woke["waiter"]
        Job.objects.filter(pk=job.pk).update(status="cancelled")
        wait_for(lambda: woke["waiter"] > waiter_before, message="the waiter to be woken by the settlement")
    finally:
        listener.unsubscribe(job.pk, waiter)
        listener.unsubscribe(job.pk, watcher)
