"""Tasks with ``lock=`` in a worker run in this process: lock, contention, outage, lost lock."""

from __future__ import annotations

import logging
import time

import pytest
from django.conf import settings
from django.test import override_settings
from prometheus_client import REGISTRY

from django_jobguard.models import DeadLetter, Job, Lock
from django_jobguard.worker import Worker
from tests.support import locking
from tests.testapp import tasks_locks
from tests.testapp.models import Execution, Interval, LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)

make_lock = locking.make_lock


def lock_settings(backend: str, **locks: object) -> override_settings:
    """The suite's JOBGUARD with the lock back end under test."""
    merged = {**settings.JOBGUARD["LOCKS"], "BACKEND": backend, **locks}
    if backend == "redis":
        merged.setdefault("CACHE_ALIAS", "redis")
    return override_settings(JOBGUARD={**settings.JOBGUARD, "LOCKS": merged})


backend = locking.backend


@pytest.fixture
def uses(backend: str):
    """The worker (in this process) locks with the back end under test."""
    with lock_settings(backend):
        yield backend


def run_burst() -> int:
    return Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, concurrency=2).run()


def run_until(job: Job, status: str, rounds: int = 200) -> None:
    """Burst repeatedly (delayed retries come due) until ``job`` reaches ``status``."""
    for _ in range(rounds):
        assert run_burst() == 0
        job.refresh_from_db()
        if job.status == status:
            return
        time.sleep(0.05)
    pytest.fail(f"job {job.pk} is {job.status}, not {status}, after {rounds} bursts")


def metric(name: str, task: object, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, {"queue": "default", "task": task.name, **labels})
    return value or 0.0


def free_the_key(backend: str, name: str) -> None:
    """Forget whoever holds ``name`` (the test's stand-in for the other owner)."""
    if backend == "redis":
        from django_redis import get_redis_connection

        from django_jobguard.conf import get_settings
        from django_jobguard.locks.redis import redis_key

        prefix = get_settings().locks.prefix
        get_redis_connection("redis").delete(redis_key(prefix, name.removeprefix(prefix)))
    else:
        Lock.objects.filter(key=name).update(token=None, expires_at=None)


def test_a_locked_job_runs_under_its_lock_and_releases_it(uses):
    job = tasks_locks.interval.enqueue("a")
    assert job.lock_key == "res:a"
    assert run_burst() == 0
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lock_contentions) == ("succeeded", 1, 0)
    [run] = Interval.objects.all()
    assert run.fencing_token == job.result  # the handler saw its fencing token in the context
    assert not make_lock(uses, "res:a").locked()
    follower = make_lock(uses, "res:a", ttl=30)
    assert follower.acquire(blocking=False)
    assert follower.fencing_token > run.fencing_token
    follower.release()


def test_contention_puts_the_job_back_without_using_an_attempt_and_counts_it(uses, caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard.worker")
    contended = metric("jobguard_lock_contentions_total", tasks_locks.interval)
    holder = make_lock(uses, "res:a", ttl=30)
    assert holder.acquire()
    job = tasks_locks.interval.enqueue("a")
    assert run_burst() == 0
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lock_contentions) == ("queued", 0, 1)
    # The claim was refunded: no attempt counted, so no start either; due again after a short delay.
    assert job.started_at is None
    assert job.run_after > job.enqueued_at
    assert not Interval.objects.exists()
    assert metric("jobguard_lock_contentions_total", tasks_locks.interval) == contended + 1
    assert f"lock_contended job_id={job.pk} lock_key='res:a'; retry in" in caplog.text

    holder.release()
    run_until(job, "succeeded")
    assert job.attempts == 1
    assert Interval.objects.get().fencing_token > holder.fencing_token


DOWN_CACHES = {
    **settings.CACHES,
    # Nothing listens on port 1: every connection is refused.
    "down": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
}


def test_an_unreachable_lock_store_puts_the_job_back_unrun_without_using_an_attempt(caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard.worker")
    task = tasks_locks.interval
    unavailable = metric("jobguard_lock_failures_total", task, reason="unavailable")
    job = task.enqueue("a")
    with override_settings(CACHES=DOWN_CACHES), lock_settings("redis", CACHE_ALIAS="down"):
        assert run_burst() == 0
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("queued", 0)
    assert "django_jobguard.exceptions.LockUnavailable: lock 'jobguard:lock:res:a': Redis did not answer" in (
        job.last_error
    )
    assert not Interval.objects.exists()  # never run unlocked
    assert metric("jobguard_lock_failures_total", task, reason="unavailable") == unavailable + 1
    assert f"lock_unavailable job_id={job.pk} lock_key='res:a'; handler not run, retry in" in caplog.text

    # The store is back (here: the database back end): the job runs on its first attempt.
    with lock_settings("database"):
        run_until(job, "succeeded")
    assert job.attempts == 1


@pytest.mark.parametrize(
    "task", [tasks_locks.loses_lock, tasks_locks.loses_lock_atomic], ids=["plain", "atomic"]
)
def test_a_job_whose_lock_was_taken_over_is_not_acked(uses, task, caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard.worker")
    lost = metric("jobguard_lock_failures_total", task, reason="lost")
    job = task.enqueue("a", marker="m")
    assert run_burst() == 0
    job.refresh_from_db()
    # The attempt counts (the handler ran) and is retried; nothing was acked.
    assert (job.status, job.attempts) == ("queued", 1)
    assert "_LockLostError: job" in job.last_error and "lock 'res:a' was lost while the handler ran" in (
        job.last_error
    )
    assert f"lock_lost job_id={job.pk} lock_key='res:a'; the job will not be acked" in caplog.text
    assert metric("jobguard_lock_failures_total", task, reason="lost") == lost + 1
    if task.atomic:
        # Its writes rolled back with the refused ack.
        assert not Execution.objects.exists() and not LedgerEntry.objects.exists()
    else:
        assert list(Execution.objects.values_list("attempt", flat=True)) == [1]

    free_the_key(uses, "jobguard:lock:res:a")
    run_until(job, "succeeded")
    assert (job.attempts, job.result) == (2, 2)


def test_a_key_too_long_to_lock_dead_letters_the_job(uses):
    # Enqueue refuses such a key (test_enqueue.py); a row stored otherwise, or before the lock
    # prefix grew, is dead-lettered by the worker rather than run unlocked.
    job = Job.objects.create(
        task_name=tasks_locks.interval.name, args=["x" * 245], kwargs={}, lock_key="res:" + "x" * 245
    )
    assert run_burst() == 0
    job.refresh_from_db()
    assert job.status == "dead"
    letter = DeadLetter.objects.get(job=job)
    assert letter.reason == "invalid_payload"
    assert "prefix and key together may have at most 255" in letter.error_message
    assert not Interval.objects.exists()
