"""A real idle worker under each ``JOBGUARD["NOTIFY"]`` mode that does not notify every job.

"none": no NOTIFY arrives, yet the worker runs a new job at its poll, or at once through Redis.
"coalesced": a job committed within NOTIFY_INTERVAL of the process's last NOTIFY is announced
by the next one, an interval later, and the worker runs it then, not at its poll.
(Waking on a NOTIFY at all: tests/processes/test_crash.py.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from django_jobguard import store
from tests.conftest import wait_for
from tests.integration.enqueue.test_enqueue_notify import _listener, _received
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.postgres]

#: The worker polls and runs its maintenance passes (after each of which it claims) this rarely,
#: so a pickup inside the deadlines below can only come from what each test names.
QUIET = ["--poll-interval", "600", "--reaper-interval", "600", "--no-schedule"]
#: No horizon watcher either: its pass every 30 s would end the worker's wait too.
QUIET_ENV = {"JOBGUARD_TEST_HORIZON": '{"INTERVAL": 0}'}


@pytest.fixture
def notify_mode() -> Iterator[Callable[..., None]]:
    """``notify_mode(mode, **settings)`` for this (enqueuing) process, installed in the database."""
    stack = contextlib.ExitStack()

    def use(mode: str, **extra: object) -> None:
        stack.enter_context(override_settings(JOBGUARD={**settings.JOBGUARD, "NOTIFY": mode, **extra}))
        store.install_notify_mode(connection.alias)

    yield use
    stack.close()
    store.install_notify_mode(connection.alias)


def status_of(job) -> str:
    job.refresh_from_db()
    return job.status


def test_with_notify_none_an_idle_worker_runs_a_new_job_at_its_poll(workers, notify_mode):
    notify_mode("none")
    worker = workers.start("--poll-interval", "0.5", env={"JOBGUARD_TEST_NOTIFY": "none"})
    workers.wait_started(worker)
    assert "listen_disabled reason=notify_none" in workers.log(worker), "no connection held to LISTEN"
    with _listener() as listener:
        job = tasks.add.enqueue(2, b=3)
        wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="the poll to find the job")
        assert _received(listener) == [], "no NOTIFY"


@pytest.mark.redis
def test_with_notify_none_and_a_wakeup_cache_an_idle_worker_wakes_through_redis(workers, notify_mode):
    notify_mode("none", WAKEUP_CACHE="redis")
    worker = workers.start(
        *QUIET, env={**QUIET_ENV, "JOBGUARD_TEST_NOTIFY": "none", "JOBGUARD_TEST_WAKEUP_CACHE": "redis"}
    )
    workers.wait_started(worker)
    wait_for(lambda: "listening cache=redis" in workers.log(worker), timeout=60, message="the subscription")
    job = tasks.add.enqueue(1, b=1)
    wait_for(lambda: status_of(job) == "succeeded", timeout=40, message="the Redis wake-up")


def test_with_coalesced_notify_a_job_held_back_runs_at_the_next_interval_s_notify(workers, notify_mode):
    interval = 10.0
    notify_mode("coalesced", NOTIFY_INTERVAL=interval)
    env = {**QUIET_ENV, "JOBGUARD_TEST_NOTIFY": "coalesced", "JOBGUARD_TEST_NOTIFY_INTERVAL": str(interval)}
    # A queue of its own: this process may have notified "default" within the interval already.
    queue = f"coalesced-{time.monotonic_ns()}"
    worker = workers.start(*QUIET, "--queue", queue, env=env)
    workers.wait_started(worker)
    with _listener() as listener:
        sent = time.monotonic()
        first = tasks.add.using(queue_name=queue).enqueue(1)
        # Claimed on its NOTIFY; the second is committed after that claim, within the interval.
        wait_for(lambda: status_of(first) != "queued", timeout=40, message="the NOTIFY to wake the worker")
        second = tasks.add.using(queue_name=queue).enqueue(2)
        if time.monotonic() - sent >= interval * 0.9:
            pytest.skip("the first job's claim took most of NOTIFY_INTERVAL: the second was not held back")
        wait_for(lambda: status_of(second) == "succeeded", timeout=interval * 3, message="the next NOTIFY")
        assert _received(listener) == [queue, queue], "the first job's NOTIFY, then the next interval's"
