"""The plain claim on PostgreSQL starts where the worker's last claim stopped (issue 58, point 1).

Claimed rows leave dead entries in the claim index that nothing can remove while a transaction
holds the vacuum horizon; a claim from the head of the index walks them all. These tests show
that the bounded claim leaves no claimable job behind for good (jobs enqueued after the bound
moved, at higher and lower priorities, retries, other queue sets, a resumed queue) and that,
with a real second session holding the horizon, its read touches a few buffers where the full
claim's touches hundreds. No timing is asserted: buffers are counted by PostgreSQL.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F

from django_jobguard import store
from django_jobguard.models import Job
from django_jobguard.operations import queues as queues_service
from django_jobguard.store import postgres
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WORKER = "bound-test-worker"


@pytest.fixture(autouse=True)
def _fresh_bounds() -> Iterator[None]:
    postgres.forget_claim_bounds()
    yield
    postgres.forget_claim_bounds()


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """After its first (full) claim, each worker's claims stay bounded for the whole test."""
    monkeypatch.setattr(postgres, "FULL_CLAIM_COST_RATIO", 10**9)


def claim(batch_size: int = 10, queues: list[str] | None = None, worker: str = WORKER) -> list[int]:
    return [job.id for job in store.claim("default", queues, batch_size, worker)]


def next_claim_is_full(queues: list[str] | None = None, worker: str = WORKER) -> bool:
    return postgres.claim_statement("default", queues, 10, worker, ())[2]


def enqueue(priority: int = 0, queue: str = "default", **options: Any) -> int:
    return int(tasks.add.using(priority=priority, queue_name=queue, **options).enqueue(1).id)


def claimed_eventually(job_id: int, queues: list[str] | None = None) -> Callable[[], bool]:
    """A predicate for ``wait_for``: claim once more, then whether ``job_id`` is running."""

    def check() -> bool:
        claim(queues=queues)
        return Job.objects.get(pk=job_id).status == "running"

    return check


def test_the_first_claim_is_full_and_the_next_starts_where_it_stopped(bounded: None) -> None:
    first = enqueue()
    assert next_claim_is_full()
    assert claim() == [first]
    assert not next_claim_is_full()
    second = enqueue()
    assert claim() == [second]


def test_jobs_of_a_higher_the_same_and_a_lower_priority_enqueued_after_the_bound_moved_are_claimed_in_order(
    bounded: None,
) -> None:
    first = enqueue()
    assert claim() == [first]
    low, high, same = enqueue(priority=-5), enqueue(priority=10), enqueue()
    assert not next_claim_is_full()
    assert claim(batch_size=1) == [high]
    assert claim(batch_size=1) == [same]
    assert claim(batch_size=1) == [low]
    # The new priorities' positions are remembered too: more of each, then one claim of all.
    later = [enqueue(priority=-5), enqueue(priority=10), enqueue()]
    assert sorted(claim()) == sorted(later)


def test_a_job_made_due_behind_the_bound_waits_only_for_the_next_full_claim(bounded: None) -> None:
    first = enqueue()
    assert claim() == [first]
    earlier = Job.objects.get(pk=first).run_after - datetime.timedelta(hours=1)
    behind = enqueue(run_after=earlier)  # as a transaction that enqueued it an hour ago would commit it now
    assert claim() == []  # the bounded claim starts after ``first``
    postgres.forget_claim_bounds()
    assert next_claim_is_full()
    assert claim() == [behind]


def test_a_job_behind_the_bound_is_claimed_by_a_later_full_claim_without_help() -> None:
    first = enqueue()
    assert claim() == [first]
    behind = enqueue(run_after=Job.objects.get(pk=first).run_after - datetime.timedelta(hours=1))
    wait_for(claimed_eventually(behind), timeout=30, message="the job behind the bound was claimed")


def test_retries_are_claimed_including_one_due_before_where_the_claims_stopped() -> None:
    retried, other = enqueue(), enqueue()
    assert sorted(claim(batch_size=2)) == sorted([retried, other])
    job = Job.objects.get(pk=retried)
    assert store.requeue(
        "default", retried, job.lease_token, delay=0, error="boom", refund_attempt=False, contention=False,
        attempt_error=None,
    )  # fmt: skip
    wait_for(claimed_eventually(retried), timeout=30, message="the retry was claimed")
    # A retry due before the bound (a job an operator moved back, say) is taken as well.
    job = Job.objects.get(pk=retried)
    assert store.requeue(
        "default", retried, job.lease_token, delay=0, error="boom", refund_attempt=False, contention=False,
        attempt_error=None,
    )  # fmt: skip
    Job.objects.filter(pk=retried).update(run_after=F("run_after") - datetime.timedelta(hours=1))
    wait_for(claimed_eventually(retried), timeout=30, message="the early retry was claimed")


def test_each_set_of_queues_has_its_own_bound_and_a_new_queue_is_read_from_its_start(bounded: None) -> None:
    a1 = enqueue(queue="a")
    assert claim(queues=["a"]) == [a1]
    assert not next_claim_is_full(queues=["a"])
    b1, a2 = enqueue(queue="b"), enqueue(queue="a")
    assert next_claim_is_full(queues=["a", "b"])  # a set of queues this worker never claimed
    assert sorted(claim(queues=["a", "b"])) == sorted([b1, a2])
    assert not next_claim_is_full(queues=["a", "b"])
    a3, b2, c1 = enqueue(queue="a"), enqueue(queue="b"), enqueue(queue="c")
    assert sorted(claim(queues=["a", "b"])) == sorted([a3, b2])
    # The set ["a", "c"] has no position in "c": its claim reads "c" from the start.
    assert claim(queues=["a", "c"], worker="second-worker") == [c1]
    assert not next_claim_is_full(queues=["a", "c"], worker="second-worker")
    c2 = enqueue(queue="c")
    assert claim(queues=["a", "c"], worker="second-worker") == [c2]


def test_a_resumed_queues_jobs_are_claimed_by_a_worker_of_every_queue() -> None:
    waiting = enqueue(queue="held")
    queues_service.pause("held", actor="test", reason="bound test")
    fresh = enqueue()
    assert claim() == [fresh]  # its claims moved past the paused queue's job
    queues_service.resume("held", actor="test")
    wait_for(claimed_eventually(waiting), timeout=30, message="the resumed queue's job was claimed")


def _read_buffers(sql: str, params: list[Any]) -> tuple[int, int]:
    """Shared buffers the claim's read touches, and the rows it returns (its locks rolled back)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"], top["Actual Rows"]


def test_with_the_horizon_held_the_bounded_claim_does_not_walk_the_rows_claimed_before(bounded: None) -> None:
    import psycopg

    settings = connection.settings_dict
    holder = psycopg.connect(
        host=settings["HOST"] or None, port=settings["PORT"] or None, user=settings["USER"] or None,
        password=settings["PASSWORD"] or None, dbname=settings["NAME"],
    )  # fmt: skip
    try:
        holder.execute("SELECT txid_current()")  # idle in transaction: no claimed row can be vacuumed
        tasks.add.bulk_enqueue(((i,), {}) for i in range(20000))
        while claim(batch_size=500):
            pass
        fresh = {enqueue() for _ in range(5)}
        sql, params, full = postgres.claim_statement("default", None, 10, WORKER, ())
        assert not full
        bounded_buffers, bounded_rows = _read_buffers(sql, params)
        postgres.forget_claim_bounds()
        sql, params, full = postgres.claim_statement("default", None, 10, WORKER, ())
        assert full
        full_buffers, full_rows = _read_buffers(sql, params)
        assert bounded_rows == full_rows == len(fresh)
        # The full read walks the 20,000 claimed rows' entries (a buffer for each heap page they are on).
        assert full_buffers > 200, full_buffers
        assert bounded_buffers * 10 < full_buffers, (bounded_buffers, full_buffers)
    finally:
        holder.close()
