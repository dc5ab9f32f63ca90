"""The pipeline and the completer on the in-memory store: the worker's decisions with no database.

No ``django_db`` mark: a query would fail the test, so each one proves that the path it runs
(claim, handler, ack, retry after its delay, an ack fenced off by a newer lease) needs nothing
but the store contract. Dead letters, keys, locks and checkpoints on the memory store, from
``Task.enqueue()`` on: tests/unit/test_memory_store_setting.py; the same paths on real
databases: tests/integration/worker/test_worker_pipeline.py.
"""

from __future__ import annotations

import time

import pytest

from django_jobguard import TransientError, store
from django_jobguard.outcome import HeldState, Retry, Stale, Succeeded
from django_jobguard.store.memory import MemoryStore
from django_jobguard.task import task
from django_jobguard.worker import pipeline
from django_jobguard.worker.completer import Completer
from django_jobguard.worker.held import Held
from tests.support.factories import Clock
from tests.testapp import tasks

ALIAS = "default"
WORKER_ID = "memory-pipeline"


@task(name="tests.unit.pipeline_memory.fails_once", takes_context=True, max_attempts=3)
def fails_once(context) -> int:
    """A provider timeout on the first attempt; touches no database."""
    if context.attempt == 1:
        raise TransientError("provider timeout")
    return context.attempt


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def memory(clock):
    memory = MemoryStore(now=clock)
    with store.substitute(ALIAS, memory):
        yield memory


def enqueue(task, *args, max_attempts: int = 3, **kwargs) -> int:
    (inserted,) = store.insert_jobs(
        ALIAS,
        [
            {
                "task_name": task.name,
                "queue_name": task.queue_name or "default",
                "args": list(args),
                "kwargs": kwargs,
                "priority": 0,
                "max_attempts": max_attempts,
                "visibility_timeout": 30.0,
                "idempotency_key": None,
                "lock_key": "",
                "handler_version": "",
            }
        ],
    )
    return inserted[0]  # (id, run_after, enqueued_at)


def claim_one() -> Held:
    (job,) = store.claim(ALIAS, None, 1, WORKER_ID)
    now = time.monotonic()
    return Held(job=job, renewed_at=now, state=HeldState.RUNNING, started_at=now)


def runtime() -> pipeline.Runtime:
    return pipeline.Runtime(ALIAS, WORKER_ID, Completer(ALIAS, WORKER_ID))


def test_a_success_runs_the_handler_then_the_completer_acks_it(memory):
    job_id = enqueue(tasks.add, 2, b=3)
    held, rt = claim_one(), runtime()
    outcome = pipeline.run(held, rt)
    assert type(outcome) is Succeeded and outcome.result == 5
    rt.completer.settle(held, outcome)
    stored = memory.jobs[job_id]
    assert (stored.status, stored.result, stored.attempts) == ("succeeded", 5, 1)
    assert rt.completer.outcomes["succeeded"] == 1


def test_a_transient_failure_is_requeued_with_a_delay_and_runs_again_later(memory, clock):
    job_id = enqueue(fails_once)
    held, rt = claim_one(), runtime()
    outcome = pipeline.run(held, rt)
    assert type(outcome) is Retry and outcome.category == "transient" and outcome.delay > 0
    assert outcome.error_class == "django_jobguard.exceptions.TransientError"
    rt.completer.settle(held, outcome)
    stored = memory.jobs[job_id]
    assert (stored.status, stored.attempts) == ("queued", 1)
    assert store.claim(ALIAS, None, 1, WORKER_ID) == []  # not before its delay
    clock.advance(outcome.delay + 1)
    again = claim_one()
    rt.completer.settle(again, pipeline.run(again, rt))
    assert (stored.status, stored.attempts) == ("succeeded", 2)


def test_an_ack_with_a_lease_taken_over_is_stale_and_writes_nothing(memory, clock):
    job_id = enqueue(tasks.add, 1)
    held, rt = claim_one(), runtime()
    clock.advance(31)  # the lease expires; the reaper gives the job back and another worker claims it
    assert store.reap(ALIAS) == ([(job_id, "default")], [])
    other = claim_one()
    outcome = pipeline.run(held, rt)
    assert type(outcome) is Stale
    rt.completer.settle(held, outcome)
    stored = memory.jobs[job_id]
    assert (stored.status, stored.lease_token) == ("running", other.job.lease_token)
