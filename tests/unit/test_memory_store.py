"""The in-memory store (``store.memory.MemoryStore``): the store contract with no database.

Driven through ``store.*`` with the alias substituted, as a unit test of the pipeline or
the completer would: these tests have no database access at all.
"""

import datetime
import json

import pytest
from django.utils import timezone

from django_jobguard import store
from django_jobguard.store.memory import MemoryStore
from tests.support.factories import Clock


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def memory(clock):
    memory = MemoryStore(now=clock)
    with store.substitute("default", memory):
        yield memory


def row(**changes):
    values = {
        "task_name": "tests.testapp.tasks.add",
        "queue_name": "default",
        "args": [1],
        "kwargs": {},
        "priority": 0,
        "max_attempts": 3,
        "visibility_timeout": 30.0,
        "idempotency_key": None,
        "lock_key": "",
        "handler_version": "",
    }
    values.update(changes)
    return values


def claim(batch_size=10, queues=None, exclude=()):
    return store.claim("default", queues, batch_size, "w", exclude)


def test_substitute_routes_the_alias_and_puts_the_dialect_back(clock):
    memory = MemoryStore(now=clock)
    with store.substitute("default", memory):
        store.insert_jobs("default", [row()])
    assert len(memory.jobs) == 1
    with pytest.raises(RuntimeError, match="Database access not allowed"):
        store.insert_jobs("default", [row()])


def test_claims_follow_priority_then_run_after_and_skip_what_is_not_claimable(memory, clock):
    now = clock()
    ((later, _, _),) = store.insert_jobs("default", [row()], now - datetime.timedelta(seconds=5))
    ((earlier, _, _),) = store.insert_jobs("default", [row()], now - datetime.timedelta(seconds=50))
    ((high, _, _),) = store.insert_jobs("default", [row(priority=9)])
    store.insert_jobs("default", [row()], datetime.timedelta(minutes=1))  # not due
    store.insert_jobs("default", [row(queue_name="paused")])
    memory.paused.add("paused")
    assert [job.id for job in claim(batch_size=2)] == [high, earlier]
    assert [job.id for job in claim()] == [later]
    clock.advance(61)
    assert len(claim(queues=["default"])) == 1
    assert claim(queues=["paused"]) == []


def test_every_write_to_a_held_job_needs_its_current_token(memory):
    store.insert_jobs("default", [row(), row()])
    a, b = claim()
    stale = "0" * 32
    assert not store.complete("default", a.id, stale, "1")
    assert not store.requeue("default", a.id, stale, delay=0, error="x")
    assert not store.mark_dead("default", a.id, stale, "x")
    assert store.heartbeat("default", [(a.id, a.lease_token), (b.id, stale)]) == {a.id}
    assert store.complete("default", a.id, a.lease_token, "3")
    assert not store.complete("default", a.id, a.lease_token, "3")
    assert (memory.jobs[a.id].status, memory.jobs[a.id].result) == ("succeeded", 3)
    assert store.complete_many("default", [(b.id, stale, "1")]) == {}
    assert store.complete_many("default", [(b.id, b.lease_token, "1")]) == {b.id: False}


def test_requeue_keeps_the_attempt_and_a_refund_gives_it_back(memory, clock):
    store.insert_jobs("default", [row()])
    (job,) = claim()
    failure = ("builtins.ValueError", "boom", "tb")
    assert store.requeue("default", job.id, job.lease_token, delay=10, error="boom", attempt_error=failure)
    stored = memory.jobs[job.id]
    assert (stored.status, stored.attempts, stored.last_error) == ("queued", 1, "boom")
    assert stored.attempt_history[-1]["error_class"] == "builtins.ValueError"
    assert claim() == []
    clock.advance(10)
    (again,) = claim()
    assert store.requeue("default", again.id, again.lease_token, delay=0, error=None, refund_attempt=True)
    assert (stored.attempts, len(stored.attempt_history)) == (1, 1)


def test_the_reaper_requeues_expired_leases_and_reports_exhausted_ones(memory, clock):
    store.insert_jobs("default", [row(), row(max_attempts=1)])
    first, last = claim()
    assert store.reap("default") == ([], [])
    clock.advance(31)
    assert store.reap("default") == ([(first.id, "default")], [(last.id, last.lease_token)])
    assert memory.jobs[first.id].reappearances == 1
    assert not store.complete("default", first.id, first.lease_token, "1")
    assert store.mark_dead("default", last.id, last.lease_token, "expired", store.LEASE_EXPIRED_ERROR)
    assert store.reap("default") == ([], [])


def test_keys_are_inserted_once_and_marked_succeeded_by_their_job(memory):
    expires = timezone.now() + datetime.timedelta(hours=1)
    inserted = store.insert_keyed_job(
        "default", row(idempotency_key="k"), None, scope="s", fingerprint="f", expires_at=expires
    )
    assert inserted is not None
    again = store.insert_keyed_job(
        "default", row(idempotency_key="k"), None, scope="s", fingerprint="f", expires_at=expires
    )
    assert again is None and len(memory.jobs) == 1
    assert store.key_owner("default", "s", "k") == (inserted[0], "in_progress")
    assert not store.record_key_success("default", "s", "k", inserted[0] + 1, 1)
    assert store.record_key_success("default", "s", "k", inserted[0], {"x": 1})
    assert store.key_owner("default", "s", "k") == (inserted[0], "succeeded")


def test_reporting_reads_ages_and_durations(memory, clock):
    store.insert_jobs("default", [row(), row()])
    clock.advance(30)
    assert store.oldest_due_ages("default") == {"default": 30.0}
    a, b = claim()
    clock.advance(2)
    store.complete("default", a.id, a.lease_token, "1")
    clock.advance(2)
    store.complete("default", b.id, b.lease_token, "1")
    ((queue, task, count, percentiles, top),) = store.observed_durations("default", 60)
    assert (queue, task, count, top) == ("default", "tests.testapp.tasks.add", 2, 4.0)
    assert percentiles == pytest.approx([3.0, 3.9, 3.98])


@pytest.mark.parametrize("stored", [{"c": "k"}, "c:t|k", 7, None, ["c:t|k", 7]])
def test_a_limited_claim_leases_and_marks_a_job_whose_flow_keys_are_not_a_list_of_strings(memory, stored):
    from django_jobguard.flow import FlowPlan

    plan = FlowPlan({}, {}, {"t": ()}, {"t": 1}, {}, frozenset({"default"}))
    ids = [
        store.insert_jobs("default", [row(task_name="t", flow_keys=keys)])[0][0]
        for keys in (["c:t|a"], stored, ["c:t|b"])
    ]
    claimed = store.claim("default", None, 10, "w", flow=plan)
    assert [job.id for job in claimed] == ids
    assert [job.unreadable_flow_keys for job in claimed] == [None, json.dumps(stored), None]
    # Running, it still counts under none of its keys; a good job's key is full.
    (late,) = store.insert_jobs("default", [row(task_name="t", flow_keys=["c:t|a"]), row(task_name="t")])[1:]
    assert [job.id for job in store.claim("default", None, 10, "w", flow=plan)] == [late[0]]
