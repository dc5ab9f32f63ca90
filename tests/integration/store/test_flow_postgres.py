"""The limited claim on PostgreSQL: its round trips, and its reads (key by key beside a hot
key, in claim order otherwise).

A claim outside a transaction and without breakers is one string (the turn's lock and one
statement); under a breaker, inside a transaction or behind a pooler it takes its turn over
three round trips. The reads are checked on both: each test runs the claim, then replays its
candidates statement under ``EXPLAIN ANALYZE`` to see which of its two reads ran. The other
databases read in claim order only.
"""

import threading
from datetime import timedelta

import pytest
from django.db import DataError, connection, connections, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from django_jobguard import store
from django_jobguard.flow import Throttle
from django_jobguard.models import FlowRate, Job
from django_jobguard.registry import registry
from django_jobguard.store import postgres
from tests.conftest import wait_for
from tests.testapp import tasks_flow

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's limited claim only"),
    pytest.mark.usefixtures("claims_start_from_the_head"),
]


def claim(batch_size=10, queues=None):
    return store.claim("default", queues, batch_size, "test-worker", flow=registry.flow_plan())


@pytest.fixture(params=["one string", "three round trips"])
def path(request, monkeypatch):
    """Each of the limited claim's two forms (a test's transaction would pick the second)."""
    one_string = request.param == "one string"
    monkeypatch.setattr(postgres, "_claims_in_one_string", lambda alias, plan: one_string)
    return request.param


def claim_reads(batch_size=10, queues=None):
    """Claim, and return the jobs, which reads its last candidates statement ran, and how
    many candidates reads it made.

    The claim's writes are rolled back before the replay, so it reads what the claim read.
    """
    savepoint = transaction.savepoint()
    with CaptureQueriesContext(connection) as queries:
        jobs = claim(batch_size, queues)
    transaction.savepoint_rollback(savepoint)
    sent = [q["sql"].split("; ")[-1] for q in queries.captured_queries]
    executes = [sql for sql in sent if sql.startswith("EXECUTE jobguard_")]
    reads = sum(sql.startswith(("EXECUTE jobguard_", "SELECT id,")) for sql in sent)
    assert executes, "the claim did not read through the prepared statement"
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + executes[-1])
        (plan,) = cursor.fetchone()
    ran: set[str] = set()

    def walk(node, branch):
        # A subquery (by_key, and in_order on the three round trips) or a CTE (in_order in
        # one string, whose plan hangs off the statement's top node).
        name = node.get("Alias") or (node.get("Subplan Name") or "").removeprefix("CTE ")
        branch = name if name in ("by_key", "in_order") else branch
        if branch and node.get("Index Name") and node.get("Actual Loops", 0) > 0:
            ran.add(branch)
        for child in node.get("Plans", []):
            walk(child, branch)

    walk(plan[0]["Plan"], None)
    return jobs, ran, reads


def test_beside_a_hot_key_the_claim_reads_key_by_key(flow_tasks, path):
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW + 10))
    assert len(claim(batch_size=2)) == 2
    cold = tasks_flow.per_account.enqueue(2, 0)
    jobs, ran, _ = claim_reads()
    assert [job.id for job in jobs] == [cold.id]
    assert ran == {"by_key"}


@pytest.mark.parametrize("queues", [["flow-keyed"], ["flow-global", "flow-keyed"]], ids=["one queue", "two"])
def test_beside_a_hot_key_a_claim_of_named_queues_reads_key_by_key(flow_tasks, path, queues):
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW + 10))
    assert len(claim(batch_size=2, queues=queues)) == 2
    cold = tasks_flow.per_account.enqueue(2, 0)
    jobs, ran, _ = claim_reads(queues=queues)
    assert [job.id for job in jobs] == [cold.id]
    assert ran == {"by_key"}


def test_a_full_key_with_few_queued_is_read_past_in_claim_order(flow_tasks, path):
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW // 2 - 10))
    assert len(claim(batch_size=2)) == 2
    cold = tasks_flow.per_account.enqueue(2, 0)
    jobs, ran, _ = claim_reads()
    assert [job.id for job in jobs] == [cold.id]
    assert ran == {"in_order"}


def test_with_more_keys_queued_than_it_walks_the_claim_reads_in_claim_order(flow_tasks, path):
    tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW + 10))
    assert len(claim(batch_size=2)) == 2
    tasks_flow.per_account.bulk_enqueue(
        ((account, 0), {}) for account in range(100, 101 + postgres.SKIP_SCAN_PAIRS)
    )
    jobs, ran, _ = claim_reads(batch_size=3)
    assert [job.args[0] for job in jobs] == [100, 101, 102]
    assert ran == {"in_order"}


def test_inside_a_transaction_the_turn_is_three_round_trips_for_a_claim_that_leases(flow_tasks):
    tasks_flow.per_account.enqueue(1, 0)
    claim()  # the statement is prepared on first use
    tasks_flow.per_account.enqueue(2, 0)
    with CaptureQueriesContext(connection) as queries:
        assert len(claim()) == 1
    sent = [q["sql"].split()[0] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    # The turn with its reads (running jobs, rates, breakers), the candidates, and the lease
    # (with the COMMIT, outside a test's transaction).
    assert sent == ["SELECT", "SELECT", "WITH"]


def test_a_hot_key_with_room_is_read_around_from_the_first_read(flow_tasks, path):
    hot = tasks_flow.per_account.bulk_enqueue(((1, 0), {}) for _ in range(postgres.HOT_WINDOW + 10))
    first = claim(batch_size=3)  # two slots: the key filled up within this claim, so it is remembered
    Job.objects.filter(pk=first[0].id).update(status="succeeded", lease_token=None, lease_expires_at=None)
    cold = tasks_flow.per_account.enqueue(2, 0)
    jobs, ran, reads = claim_reads(batch_size=5)
    assert [job.id for job in jobs] == [hot[2].id, cold.id]
    # One read, key by key: not the hot key's rows first and then a second read past them.
    assert (ran, reads) == ({"by_key"}, 1)


def transaction_status():
    import psycopg.pq

    return connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_a_claim_is_one_string_its_lock_and_one_statement(unguarded_tasks):
    tasks_flow.per_account.enqueue(1, 0)
    claim()  # the statement is prepared on first use
    jobs = [tasks_flow.per_account.enqueue(account, 0) for account in (2, 2, 2, 3)]  # two per account
    with CaptureQueriesContext(connection) as queries:
        assert [claimed.id for claimed in claim()] == [jobs[0].id, jobs[1].id, jobs[3].id]
    (sent,) = [q["sql"] for q in queries.captured_queries]
    lock, statement = sent.split("; ")
    assert lock == f"SELECT pg_advisory_xact_lock({postgres.FLOW_LOCK_ID})"
    assert statement.startswith("EXECUTE jobguard_")
    assert transaction_status()  # idle: the string's own transaction ended with it
    connection.close()  # anything uncommitted would be rolled back here
    assert Job.objects.get(pk=jobs[0].id).status == "running"
    assert Job.objects.get(pk=jobs[2].id).status == "queued"


@pytest.mark.django_db(transaction=True)
def test_a_one_string_claim_writes_its_rate_keys_with_its_leases(unguarded_tasks):
    jobs = [tasks_flow.rated.enqueue(i) for i in range(8)]
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        (before,) = cursor.fetchone()
    throttle = Throttle()
    claimed = store.claim("default", None, 10, "test-worker", flow=registry.flow_plan(), throttle=throttle)
    rate = registry.flow_plan().rates[f"rate:task:{tasks_flow.rated.name}"]
    assert [job.id for job in claimed] == [job.id for job in jobs[: rate.burst]]
    assert throttle.held_back == {"rate"}
    assert 0 < throttle.retry_after <= rate.interval
    connection.close()
    (tat,) = FlowRate.objects.filter(key="rate:task:tests.testapp.tasks_flow.rated").values_list(
        "tat", flat=True
    )
    # The burst is spent, as the claim wrote it: the key's arrival time is past the tolerance
    # from the claim's clock. Measured from a clock read before the claim, not after it, so
    # a slow machine between the claim and the read cannot make it look unspent.
    assert tat - before > rate.tolerance


@pytest.mark.django_db(transaction=True)
def test_an_error_in_the_one_string_claim_frees_the_turn(unguarded_tasks, monkeypatch):
    job = tasks_flow.per_account.enqueue(1, 0)

    def failing(*args):
        # Fails at the end of the statement, once the lock is held and the lease is written.
        sql = postgres._one_string_sql(*args)
        failing_sql = sql.replace("coalesce(l.n = 1, true)", "coalesce(1 / (l.id - l.id) = 1, true)")
        assert failing_sql != sql
        return postgres.Statement(failing_sql)

    monkeypatch.setattr(postgres, "_one_string_statement", failing)
    with pytest.raises(DataError):
        claim()
    assert transaction_status()
    assert Job.objects.get(pk=job.id).status == "queued"  # the lease was rolled back with it
    assert turn_is_free()
    monkeypatch.undo()
    assert [claimed.id for claimed in claim()] == [job.id]


@pytest.mark.django_db(transaction=True)
def test_behind_a_pooler_the_begin_and_the_commit_travel_with_the_turn(unguarded_tasks, monkeypatch):
    monkeypatch.setattr(postgres, "_claims_in_one_string", lambda alias, plan: False)
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
def test_a_claim_that_finds_nothing_ends_its_transaction(unguarded_tasks, path):
    with CaptureQueriesContext(connection) as queries:
        assert claim() == []
    if path == "three round trips":
        assert queries.captured_queries[-1]["sql"] == "COMMIT"
    assert transaction_status()


@pytest.mark.django_db(transaction=True)
def test_an_error_within_the_turn_rolls_it_back_and_frees_the_turn(unguarded_tasks, monkeypatch):
    monkeypatch.setattr(postgres, "_claims_in_one_string", lambda alias, plan: False)
    job = tasks_flow.per_account.enqueue(1, 0)

    def failing(*args, **kwargs):
        raise RuntimeError("the read failed")

    monkeypatch.setattr(postgres._FlowSQL, "candidates", failing)
    with pytest.raises(RuntimeError, match="the read failed"):
        claim()
    assert transaction_status()
    assert turn_is_free()
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


@pytest.mark.django_db(transaction=True)
def test_a_one_string_claim_reads_what_the_turn_before_it_committed(unguarded_tasks):
    # Two jobs of account 1 start within another claim's turn, out of this claim's sight
    # (not due, so never its candidates); a third is due. The claim waits for that turn,
    # then must count the two: account 1 (two at once) has no room left.
    held = [tasks_flow.per_account.enqueue(1, 0) for _ in range(2)]
    due = tasks_flow.per_account.enqueue(1, 0)
    Job.objects.filter(pk__in=[job.id for job in held]).update(run_after=F("run_after") + timedelta(hours=1))
    result: list = []
    with connections["default"].cursor() as other:
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(%s)", [postgres.FLOW_LOCK_ID])
        other.execute(
            "UPDATE jobguard_job SET status = 'running', attempts = attempts + 1, lease_token = 'other', "
            "lease_expires_at = now() + interval '1 minute' WHERE id = ANY(%s)",
            [[job.id for job in held]],
        )
        claimer = threading.Thread(target=lambda: result.append(claim()) or connections.close_all())
        claimer.start()
        wait_for(lambda: waiting_on_the_turn(other), message="the claim to wait for the turn")
        other.execute("COMMIT")
    claimer.join(60)
    assert result == [[]]
    assert Job.objects.get(pk=due.id).status == "queued"


def turn_is_free():
    """Whether another session can take the limited claims' turn now."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s), pg_advisory_unlock(%s)", [postgres.FLOW_LOCK_ID] * 2)
        return cursor.fetchone() == (True, True)


def waiting_on_the_turn(cursor):
    cursor.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        [postgres.FLOW_LOCK_ID & 0xFFFFFFFF],
    )
    return cursor.fetchone()[0] > 0
