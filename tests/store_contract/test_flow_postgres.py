"""The limited claim's reads on PostgreSQL: key by key beside a hot key, in claim order otherwise.

Each test runs the claim, then replays its candidates statement under ``EXPLAIN ANALYZE``
to see which of its two reads ran; the other databases read in claim order only.
"""

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_jobguard import store
from django_jobguard.models import Job
from django_jobguard.store import postgres
from tests.testapp import tasks_flow

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's limited claim only"),
]


def claim(limit=10):
    return store.claim("default", None, limit, "test-worker", flow=store.flow_plan())


def claim_reads(limit=10):
    """Claim, and return the jobs, which reads its last candidates statement ran, and how
    many candidates reads it made.

    The claim's writes are rolled back before the replay, so it reads what the claim read.
    """
    savepoint = transaction.savepoint()
    with CaptureQueriesContext(connection) as queries:
        jobs = claim(limit)
    transaction.savepoint_rollback(savepoint)
    executes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("EXECUTE jobguard_")]
    reads = sum(q["sql"].startswith(("EXECUTE jobguard_", "SELECT id,")) for q in queries.captured_queries)
    assert executes, "the claim did not read through the prepared statement"
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + executes[-1])
        (plan,) = cursor.fetchone()
    ran: set[str] = set()

    def walk(node, branch):
        branch = node.get("Alias") if node.get("Alias") in ("by_key", "in_order") else branch
        if branch and node.get("Index Name") and node.get("Actual Loops", 0) > 0:
            ran.add(branch)
        for child in node.get("Plans", []):
            walk(child, branch)

    walk(plan[0]["Plan"], None)
    return jobs, ran, reads


def test_beside_a_hot_key_the_claim_reads_key_by_key(flow_tasks):
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW + 10))
    assert len(claim(limit=2)) == 2
    cold = tasks_flow.per_account.enqueue(2, 0)
    jobs, ran, _ = claim_reads()
    assert [job.id for job in jobs] == [cold.id]
    assert ran == {"by_key"}


def test_a_full_key_with_few_queued_is_read_past_in_claim_order(flow_tasks):
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW // 2 - 10))
    assert len(claim(limit=2)) == 2
    cold = tasks_flow.per_account.enqueue(2, 0)
    jobs, ran, _ = claim_reads()
    assert [job.id for job in jobs] == [cold.id]
    assert ran == {"in_order"}


def test_with_more_keys_queued_than_it_walks_the_claim_reads_in_claim_order(flow_tasks):
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW + 10))
    assert len(claim(limit=2)) == 2
    tasks_flow.per_account.bulk_enqueue(
        ((account, 0), {}) for account in range(100, 101 + postgres.SKIP_SCAN_PAIRS)
    )
    jobs, ran, _ = claim_reads(limit=3)
    assert [job.args[0] for job in jobs] == [100, 101, 102]
    assert ran == {"in_order"}


def test_the_turn_is_three_round_trips_for_a_claim_that_leases(flow_tasks):
    tasks_flow.per_account.enqueue(1, 0)
    claim()  # the statement is prepared on first use
    tasks_flow.per_account.enqueue(2, 0)
    with CaptureQueriesContext(connection) as queries:
        assert len(claim()) == 1
    sent = [q["sql"].split()[0] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    # The turn with its reads (running jobs, rates, breakers), the candidates, and the lease
    # (with the COMMIT, outside a test's transaction).
    assert sent == ["SELECT", "SELECT", "WITH"]


def test_a_hot_key_with_room_is_read_around_from_the_first_read(flow_tasks):
    hot = tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW + 10))
    first = claim(limit=3)  # two slots: the key filled up within this claim, so it is remembered
    Job.objects.filter(pk=first[0].id).update(status="succeeded", lease_token=None, lease_expires_at=None)
    cold = tasks_flow.per_account.enqueue(2, 0)
    jobs, ran, reads = claim_reads(limit=5)
    assert [job.id for job in jobs] == [hot[2].id, cold.id]
    # One read, key by key: not the hot key's rows first and then a second read past them.
    assert (ran, reads) == ({"by_key"}, 1)


def transaction_status():
    import psycopg.pq

    return connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_begin_and_the_commit_travel_with_the_turn(unguarded_tasks):
    tasks_flow.per_account.enqueue(1, 0)
    claim()  # the statements are prepared on first use
    job = tasks_flow.per_account.enqueue(2, 0)
    with CaptureQueriesContext(connection) as queries:
        assert [claimed.id for claimed in claim()] == [job.id]
    sent = [q["sql"] for q in queries.captured_queries]
    assert len(sent) == 3
    assert sent[0].startswith("BEGIN; SELECT pg_advisory_xact_lock(")
    assert sent[-1].startswith("WITH picked AS") and sent[-1].endswith("; COMMIT")
    assert transaction_status()  # idle: nothing left open
    connection.close()  # anything uncommitted would be rolled back here
    assert Job.objects.get(pk=job.id).status == "running"


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_finds_nothing_ends_its_transaction(unguarded_tasks):
    with CaptureQueriesContext(connection) as queries:
        assert claim() == []
    assert queries.captured_queries[-1]["sql"] == "COMMIT"
    assert transaction_status()


@pytest.mark.django_db(transaction=True)
def test_an_error_within_the_turn_rolls_it_back_and_frees_the_turn(unguarded_tasks, monkeypatch):
    job = tasks_flow.per_account.enqueue(1, 0)

    def failing(*args, **kwargs):
        raise RuntimeError("the read failed")

    monkeypatch.setattr(postgres._FlowSQL, "candidates", failing)
    with pytest.raises(RuntimeError, match="the read failed"):
        claim()
    assert transaction_status()
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s), pg_advisory_unlock(%s)", [postgres.FLOW_LOCK_ID] * 2)
        assert cursor.fetchone() == (True, True)
    monkeypatch.undo()
    assert [claimed.id for claimed in claim()] == [job.id]


@pytest.mark.django_db(transaction=True)
def test_a_claim_under_a_breaker_keeps_its_atomic_block(flow_tasks):
    job = tasks_flow.call_dependency.enqueue(1)
    with CaptureQueriesContext(connection) as queries:
        assert [claimed.id for claimed in claim()] == [job.id]
    assert not queries.captured_queries[1]["sql"].startswith("BEGIN;")
    assert transaction_status()
    connection.close()
    assert Job.objects.get(pk=job.id).status == "running"
