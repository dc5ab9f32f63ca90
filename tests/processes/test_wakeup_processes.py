"""Without LISTEN/NOTIFY, a real idle worker wakes through Redis pub/sub: it picks each new job
up long before its next poll (SQLite and MariaDB/MySQL; PostgreSQL wakes on NOTIFY, which
tests/integration/enqueue/test_enqueue_notify.py covers)."""

from __future__ import annotations

import pytest

from tests.conftest import ON_POSTGRES, wait_for
from tests.testapp import tasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.processes,
    pytest.mark.redis,
    pytest.mark.skipif(ON_POSTGRES, reason="PostgreSQL wakes idle workers on NOTIFY; this covers the others"),
]

#: The worker polls (and runs its maintenance passes, after each of which it claims) this rarely,
#: so a pickup inside PICKUP_DEADLINE can only come from a wake-up.
POLL_SECONDS = 120
PICKUP_DEADLINE = 40


def status_of(job) -> str:
    job.refresh_from_db()
    return job.status


def test_an_idle_worker_picks_each_new_job_up_on_a_redis_wake_up_not_at_its_poll(workers, settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "WAKEUP_CACHE": "redis"}  # this process enqueues
    quiet = ["--poll-interval", str(POLL_SECONDS), "--reaper-interval", str(POLL_SECONDS), "--no-schedule"]
    worker = workers.start("--worker-id", "waker", *quiet, env={"JOBGUARD_TEST_WAKEUP_CACHE": "redis"})
    workers.wait_started(worker)
    wait_for(lambda: "listening cache=redis" in workers.log(worker), timeout=60, message="the subscription")
    # The worker's first claim at start-up found nothing; from here only a wake-up moves it.
    for n in range(3):
        job = tasks.add.enqueue(n, 1)
        wait_for(lambda job=job: status_of(job) == "succeeded", timeout=PICKUP_DEADLINE, message=f"job {n}")
    assert "wakeup_lost" not in workers.log(worker)
