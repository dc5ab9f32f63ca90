"""The store contract, for flow control: the limited claim on the database under test.

Runs on SQLite by default and on PostgreSQL or MariaDB with ``JOBGUARD_TEST_DATABASE_URL``, against
the dialect that serves the ``default`` alias, and in the same run against the in-memory store
(the ``rows`` fixture, see conftest.py). The fleet-wide proof (worker processes
killed while a sampler watches the running rows) is tests/processes/test_flow_processes.py.
"""

import json

import pytest
from django.test import override_settings
from django.utils import timezone

from django_jobguard import store
from django_jobguard.flow import Throttle
from django_jobguard.registry import registry
from tests.conftest import wait_for
from tests.testapp import tasks_flow

pytestmark = [
    # Outside a test's transaction, as a worker claims: on PostgreSQL that is the claim in
    # one string (inside a transaction it takes its turn over three round trips).
    pytest.mark.django_db(transaction=True),
]


def claim(batch_size=10, queues=None):
    return store.claim("default", queues, batch_size, "test-worker", flow=registry.flow_plan())


def finish(rows, job_id):
    rows.update(job_id, status="succeeded", lease_token=None, lease_expires_at=None)


def test_a_task_concurrency_admits_n_and_leaves_the_rest_queued_without_an_attempt(rows, flow_tasks):
    jobs = [tasks_flow.three_at_once.enqueue(0) for _ in range(5)]
    claimed = claim()
    assert [job.id for job in claimed] == [job.id for job in jobs[:3]]
    assert claim() == []
    left = [rows.job(job.id) for job in jobs[3:]]
    assert [(job.status, job.attempts) for job in left] == [("queued", 0), ("queued", 0)]
    finish(rows, claimed[0].id)
    assert [job.id for job in claim()] == [jobs[3].id]


def test_keyed_limits_count_each_key_apart(rows, flow_tasks):
    for account in (1, 2):
        for _ in range(3):
            tasks_flow.per_account.enqueue(account, 0)
    claimed = claim()
    assert sorted(job.kwargs.get("account_id", job.args[0]) for job in claimed) == [1, 1, 2, 2]
    assert claim() == []


def test_a_saturated_key_does_not_hold_back_the_others(rows, flow_tasks):
    hot = [tasks_flow.per_account.enqueue(1, 0) for _ in range(60)]
    cold = tasks_flow.per_account.enqueue(2, 0)
    first = claim(batch_size=2)
    assert [job.id for job in first] == [hot[0].id, hot[1].id]
    # Sixty due jobs of the full key stand before the cold one: it is claimed all the same.
    assert [job.id for job in claim(batch_size=1)] == [cold.id]


def test_a_key_that_fills_up_within_a_claim_does_not_hide_the_keys_behind_it(rows, flow_tasks):
    # The hot key has free slots, so the claim's first read is all its jobs; once they fill the
    # slots, the cold keys' jobs behind them are taken in the same claim, not the next one.
    hot = [tasks_flow.per_account.enqueue(1, 0) for _ in range(60)]
    cold = [tasks_flow.per_account.enqueue(account, 0) for account in (2, 3, 4)]
    claimed = claim(batch_size=5)
    assert [job.id for job in claimed] == [hot[0].id, hot[1].id, *(job.id for job in cold)]
    assert claim() == []  # every key is full now, the hot one included


def test_a_claim_of_several_limited_queues_keeps_each_limit_and_the_priority_order(rows, flow_tasks):
    urgent = tasks_flow.per_account.using(priority=10).enqueue(1, 0)
    unkeyed = [tasks_flow.three_at_once.enqueue(0) for _ in range(4)]
    keyed = [tasks_flow.per_account.enqueue(1, 0) for _ in range(3)]
    claimed = claim(batch_size=20, queues=["flow-global", "flow-keyed"])
    assert claimed[0].id == urgent.id
    assert sorted(job.id for job in claimed[1:]) == sorted([*(j.id for j in unkeyed[:3]), keyed[0].id])


def test_a_job_under_several_limits_counts_under_each(rows, flow_tasks):
    # flow-shared allows 2 at once over three tasks; shared_keyed also allows 1 per account.
    a = tasks_flow.shared_keyed.enqueue(7)
    b = tasks_flow.shared_keyed.enqueue(7)
    c = tasks_flow.shared_a.enqueue(1)
    d = tasks_flow.shared_b.enqueue(2)
    assert [job.id for job in claim()] == [a.id, c.id]  # b waits for account 7, d for the shared limit
    finish(rows, a.id)
    assert [job.id for job in claim()] == [b.id]
    finish(rows, c.id)
    assert [job.id for job in claim()] == [d.id]


def test_a_queue_concurrency_limits_every_task_of_the_queue(rows):
    with override_settings(
        JOBGUARD={"QUEUES": {"capped": {"concurrency": 2}}, "ALLOW_UNDECLARED_QUEUES": True}
    ):
        from tests.testapp import tasks

        jobs = [tasks.add.using(queue_name="capped").enqueue(n) for n in range(4)]
        other = tasks.add.using(queue_name="free").enqueue(9)
        plan = registry.flow_plan()
        assert plan is not None and plan.covers(["capped"], []) and not plan.covers(["free"], [])
        claimed = store.claim("default", None, 10, "w", flow=plan)
        assert sorted(job.id for job in claimed) == sorted([jobs[0].id, jobs[1].id, other.id])


def test_a_slot_frees_when_its_lease_is_reaped(rows, flow_tasks):
    jobs = [tasks_flow.three_at_once.enqueue(0) for _ in range(4)]
    held = claim()
    assert len(held) == 3
    # The worker holding the first job died: its lease runs out and the reaper takes it back.
    rows.update(held[0].id, lease_expires_at=timezone.now() - timezone.timedelta(seconds=5))
    assert claim() == []
    requeued, _ = store.reap("default")
    assert [job_id for job_id, _ in requeued] == [held[0].id]
    (freed,) = claim()  # one slot, for one of the two queued jobs
    assert freed.id in (held[0].id, jobs[3].id)
    assert claim() == []


def test_paused_queues_stay_paused_under_the_limited_claim(rows, flow_tasks):
    tasks_flow.three_at_once.enqueue(0)
    rows.pause("flow-global")
    assert claim() == []
    rows.resume("flow-global")
    assert len(claim()) == 1


def test_unlimited_jobs_of_a_limited_queue_are_claimed_as_usual(rows, flow_tasks):
    from tests.testapp import tasks

    jobs = [tasks.add.using(queue_name="flow-global").enqueue(n) for n in range(5)]
    assert sorted(job.id for job in claim()) == sorted(job.id for job in jobs)


def test_a_rate_admits_its_burst_then_one_start_per_interval(rows, flow_tasks):
    jobs = [tasks_flow.rated.enqueue(n) for n in range(12)]
    throttle = Throttle()
    first = store.claim("default", None, 20, "w", flow=registry.flow_plan(), throttle=throttle)
    assert [job.id for job in first] == [job.id for job in jobs[:5]]  # the burst
    # The worker may claim again when the next start is due: one interval (50 ms) from now.
    assert throttle.retry_after is not None and 0 < throttle.retry_after <= 0.05 + 1e-3
    assert "rate:task:tests.testapp.tasks_flow.rated" in rows.rate_keys()
    # 20/s: the next start is due 50 ms later, never a burst again while the key is busy.
    wait_for(lambda: len(claim(batch_size=20)) >= 1, timeout=30, interval=0.02, message="the next start")
    assert len([job for job in rows.jobs() if (job.status, job.attempts) == ("queued", 0)]) >= 5


def test_a_claim_held_back_by_concurrency_only_gives_no_rate_hint(rows, flow_tasks):
    for _ in range(4):
        tasks_flow.three_at_once.enqueue(0)
    throttle = Throttle(retry_after=1.0)
    assert len(store.claim("default", None, 10, "w", flow=registry.flow_plan(), throttle=throttle)) == 3
    assert throttle.retry_after is None  # a slot frees when a job ends, not at a time


def test_keyed_rates_throttle_each_key_apart(rows, flow_tasks):
    for partner in (1, 2):
        for _ in range(4):
            tasks_flow.per_partner.enqueue(partner)
    claimed = claim()
    assert sorted(job.args[0] for job in claimed) == [1, 1, 2, 2]
    assert claim() == []


def test_keys_that_differ_only_in_case_or_accents_are_different_keys(rows, flow_tasks):
    # As on PostgreSQL: a database whose default collation ignores case and accents (MariaDB's
    # and MySQL's do) must still keep "acme", "ACME" and "acmé" apart, for rates and slots alike.
    partners = ("acme", "ACME", "acmé")
    for partner in partners:
        for _ in range(3):
            tasks_flow.per_partner.enqueue(partner)
            tasks_flow.per_account.enqueue(partner, 0)
    claimed = claim(batch_size=30)
    rated = sorted(job.args[0] for job in claimed if job.task_name == tasks_flow.per_partner.name)
    keyed = sorted(job.args[0] for job in claimed if job.task_name == tasks_flow.per_account.name)
    assert rated == sorted(partners * 2)  # each key's own burst of 2
    assert keyed == sorted(partners * 2)  # each key's own 2 slots
    assert len([key for key in rows.rate_keys() if key.startswith("r:")]) == 3


def test_enqueue_stores_the_keyed_limits_with_the_job(rows, flow_tasks):
    job = tasks_flow.shared_keyed.enqueue(account_id=42)
    assert rows.job(job.pk).flow_keys == ["c:tests.testapp.tasks_flow.shared_keyed|account:42"]
    assert rows.job(tasks_flow.three_at_once.enqueue(0).pk).flow_keys == []


def test_a_limited_job_sent_to_a_queue_without_limits_is_refused(rows, flow_tasks):
    from django_jobguard.exceptions import InvalidArgumentsError

    with pytest.raises(InvalidArgumentsError, match="'elsewhere' is neither, so its job would run unlimited"):
        tasks_flow.three_at_once.using(queue_name="elsewhere").enqueue(0)
    assert rows.jobs() == []


def test_a_claim_attempt_count_is_unchanged_for_waiting_jobs(rows, flow_tasks):
    jobs = [tasks_flow.per_account.enqueue(5, 0) for _ in range(4)]
    for _ in range(3):
        claim()
    assert [rows.job(job.id).attempts for job in jobs[2:]] == [0, 0]
    assert [job.pk for job in rows.jobs() if job.attempts > job.max_attempts] == []


def ordered(rows, jobs):
    """Jobs in claim order: priority first, then the time they became due, then id."""
    stored = sorted(
        (rows.job(job.id) for job in jobs), key=lambda job: (-job.priority, job.run_after, job.pk)
    )
    return [job.pk for job in stored]


def test_a_full_key_with_hundreds_queued_leaves_the_others_in_claim_order(rows, flow_tasks):
    # On PostgreSQL the claim looks for the other keys key by key here (a full key with this many
    # queued); every database must give the same jobs in the same order.
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(200))
    assert len(claim(batch_size=2)) == 2  # the hot key is full now, 198 of its jobs queued
    low = tasks_flow.per_account.enqueue(2, 0)
    high = tasks_flow.per_account.using(priority=5).enqueue(3, 0)
    third = [tasks_flow.per_account.enqueue(4, 0) for _ in range(3)]
    claimed = claim(batch_size=10)
    # Account 4 has two slots, so its third job waits; the rest come in claim order.
    assert [job.id for job in claimed] == ordered(rows, [high, low, *third[:2]])
    assert claim() == []


def test_beside_a_hot_key_many_other_keys_are_all_reached(rows, flow_tasks):
    # More keys with queued jobs than the claim walks key by key: it reads in claim order.
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(100))
    assert len(claim(batch_size=2)) == 2
    cold = [tasks_flow.per_account.enqueue(account, 0) for account in range(100, 180)]
    taken = []
    for _ in range(10):
        taken += [job.id for job in claim(batch_size=10)]
    assert taken == ordered(rows, cold)


def test_a_key_with_room_again_after_filling_up_is_served_beside_the_others(rows, flow_tasks):
    # On the SQL stores the first claim remembers the full key as hot, which changes how the
    # second one reads (tests/integration/store/test_flow_claims.py); the jobs are the same.
    hot = tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(200))
    first = claim(batch_size=3)  # two slots: the third job read finds the key full
    assert [job.id for job in first] == [job.id for job in hot[:2]]
    finish(rows, first[0].id)  # one slot of the hot key is free again
    cold = [tasks_flow.per_account.enqueue(account, 0) for account in (2, 3)]
    claimed = claim(batch_size=5)
    assert [job.id for job in claimed] == [hot[2].id, *(job.id for job in cold)]


#: ``flow_keys`` values enqueue never writes (a hand-written row, an older release): none is a
#: list of strings. JSON null and a breaker's shared limit: tests/integration/store/test_stored_keys.py.
UNREADABLE_FLOW_KEYS = {
    "object": {"r": "k"},
    "string": "c:tests.testapp.tasks_flow.per_account|account:2",
    "number": 7,
    "array with a number": ["c:tests.testapp.tasks_flow.per_account|account:2", 7],
    "nested array": [["c:tests.testapp.tasks_flow.per_account|account:2"]],
}


@pytest.mark.parametrize("stored", UNREADABLE_FLOW_KEYS.values(), ids=UNREADABLE_FLOW_KEYS.keys())
def test_a_job_whose_flow_keys_are_not_a_list_of_strings_is_leased_marked_and_counted_under_none(
    rows, flow_tasks, stored
):
    before, bad, after = (tasks_flow.per_account.enqueue(account, 0) for account in (1, 2, 3))
    rows.update(bad.id, flow_keys=stored)
    claimed = claim()
    assert sorted(job.id for job in claimed) == [before.id, bad.id, after.id]
    marked = {job.id: job.unreadable_flow_keys for job in claimed}
    assert marked[before.id] is None and marked[after.id] is None
    assert json.loads(marked[bad.id]) == stored  # the worker dead-letters it with this
    # Running, it counts under none of its keys: account 2 still has both of its slots.
    later = [tasks_flow.per_account.enqueue(2, 0) for _ in range(3)]
    assert [job.id for job in claim()] == [job.id for job in later[:2]]
