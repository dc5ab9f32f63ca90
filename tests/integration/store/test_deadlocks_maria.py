"""InnoDB's deadlock classes, on a real MariaDB with real concurrent connections (threads).

Each class Solid Queue's users met on MySQL, reproduced against our statements:

- a lock-order inversion inside one of our transactions (a real deadlock, forced): InnoDB
  rolls our side back, the store runs it again and counts it; nothing reaches the caller;
- inserts (insert-intention locks) beside claims (``FOR UPDATE SKIP LOCKED``), which at
  REPEATABLE READ take gap locks the inserts wait on;
- concurrent inserts of one idempotency key (the duplicate check's shared lock upgraded to
  the update's exclusive one);
- bulk deletes of finished rows beside inserts and claims;
- the flow-control limited claim (its turn, its leases, its rate upserts) beside inserts,
  acks and the idle-rate pruner.

Run with ``JOBGUARD_TEST_DATABASE_URL=mysql://...``; skipped elsewhere.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_jobguard import events, store
from django_jobguard.maintenance import retention
from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True)]


def _row(**changes: object) -> dict[str, object]:
    return {
        "task_name": tasks.add.name,
        "queue_name": "default",
        "args": [1],
        "kwargs": {},
        "priority": 0,
        "max_attempts": 3,
        "visibility_timeout": 30.0,
        "idempotency_key": None,
        "lock_key": "",
        "handler_version": "",
        **changes,
    }


@pytest.fixture
def retried() -> Iterator[list[events.StatementRetried]]:
    seen: list[events.StatementRetried] = []

    def sink(event: object) -> None:
        if isinstance(event, events.StatementRetried):
            seen.append(event)

    events.add_sink(sink)
    yield seen
    events.remove_sink(sink)


def run_threads(*targets: Callable[[], None]) -> list[BaseException]:
    """Run each target in a thread of its own (its own connection); the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrapped(target: Callable[[], None]) -> None:
        try:
            start.wait(timeout=60)
            target()
        except BaseException as exc:  # reported by the test, in its own thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrapped, args=(target,)) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not any(thread.is_alive() for thread in threads), "a thread is still running"
    return errors


def lock_waits() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'")
        return int(cursor.fetchone()[0])


def test_a_deadlock_inside_a_batch_ack_is_run_again_counted_and_never_reaches_the_caller(retried):
    first, second = (row[0] for row in store.insert_jobs("default", [_row(), _row()]))
    claimed = {job.id: job.lease_token for job in store.claim("default", None, 2, "w")}
    result: dict[str, object] = {}
    blocker_done = threading.Event()
    holds_second = threading.Event()

    def blocker() -> None:
        # Holds the second row, then (once the ack waits on it) wants the first, which the
        # ack's locking read holds: a cycle, which InnoDB breaks by rolling one side back.
        try:
            with transaction.atomic():
                Job.objects.filter(pk=second).update(priority=1)
                holds_second.set()
                wait_for(lambda: lock_waits() >= 1, timeout=60, message="the ack to wait on the row")
                Job.objects.filter(pk=first).update(priority=1)
        finally:
            blocker_done.set()
            connections.close_all()

    thread = threading.Thread(target=blocker)
    thread.start()
    assert holds_second.wait(60), "the blocker did not take the second row"
    try:
        acks = [(first, claimed[first], "1"), (second, claimed[second], "2")]
        result["acked"] = store.complete_many("default", acks)
    finally:
        thread.join(120)
    assert blocker_done.is_set()
    # The ack went through (the blocker's rows kept their tokens), after one deadlock at least.
    assert result["acked"].keys() == {first, second}
    assert set(Job.objects.filter(pk__in=[first, second]).values_list("status", flat=True)) == {"succeeded"}
    assert [(event.operation, event.reason) for event in retried][:1] == [("complete_many", "deadlock")]


def test_enqueues_beside_claims_and_acks_meet_no_deadlock(retried):
    per_producer, producers = 150, 4
    total = per_producer * producers
    done: list[int] = []
    done_lock = threading.Lock()

    def produce() -> None:
        for n in range(per_producer):
            tasks.add.enqueue(n)

    def consume() -> None:
        idle_rounds = 0
        while idle_rounds < 50:
            with done_lock:
                if len(done) >= total:
                    return
            batch = store.claim("default", None, 5, "consumer")
            if not batch:
                idle_rounds += 1
                wait_for(lambda: Job.objects.filter(status="queued").exists() or len(done) >= total, 30)
                continue
            idle_rounds = 0
            acked = store.complete_many("default", [(job.id, job.lease_token, "null") for job in batch])
            with done_lock:
                done.extend(acked)

    errors = run_threads(*[produce] * producers, *[consume] * 4)
    assert errors == []
    assert len(done) == len(set(done)) == total
    assert Job.objects.filter(status="succeeded").count() == total
    # Whatever InnoDB did, it stayed inside the store: every retry is of our own statements.
    assert {event.reason for event in retried} <= {"deadlock", "lock_wait_timeout"}


def test_concurrent_enqueues_of_one_key_make_one_job_and_no_error(retried):
    made: list[int | None] = []
    expires = timezone.now() + datetime.timedelta(hours=1)

    def enqueue() -> None:
        for n in range(20):
            inserted = store.insert_keyed_job(
                "default",
                _row(idempotency_key=f"charge:{n}"),
                None,
                scope="charge",
                fingerprint="f" * 64,
                expires_at=expires,
            )
            made.append(None if inserted is None else inserted[0])

    errors = run_threads(*[enqueue] * 8)
    assert errors == []
    created = [job_id for job_id in made if job_id is not None]
    assert len(created) == len(set(created)) == 20  # one job per key, whoever won it
    assert Job.objects.count() == 20


def test_bulk_deletes_of_finished_rows_beside_enqueues_and_claims_meet_no_deadlock(retried):
    old = timezone.now() - datetime.timedelta(days=30)
    store.insert_jobs("default", [_row() for _ in range(1500)])
    Job.objects.update(status="succeeded", finished_at=old, started_at=old)
    deleted: list[int] = []

    def prune() -> None:
        deleted.append(
            retention.prune_finished_jobs("default", older_than=datetime.timedelta(days=1), batch_size=100)
        )

    def produce() -> None:
        store.insert_jobs("default", [_row() for _ in range(10)])
        for n in range(200):
            tasks.add.enqueue(n)

    def consume() -> None:
        for _ in range(200):
            batch = store.claim("default", None, 5, "consumer")
            if batch:
                store.complete_many("default", [(job.id, job.lease_token, "null") for job in batch])

    errors = run_threads(prune, produce, produce, consume, consume)
    assert errors == []
    assert deleted == [1500]
    assert not Job.objects.filter(finished_at=old).exists()
    assert Job.objects.count() == 2 * 210  # every new job kept, claimed or not


def test_limited_claims_beside_enqueues_acks_and_rate_pruning_meet_no_deadlock_and_keep_their_limits(
    retried,
):
    """The limited claim (its turn row, locking reads, leases and rate upserts) beside
    enqueues of limited jobs, batched acks and the idle-rate pruner: nothing reaches a
    caller, and a sampler never sees a key over its limit."""
    from collections import Counter

    from django_jobguard.registry import registry
    from tests.testapp import tasks_flow

    for task in tasks_flow.ALL:
        registry.register(task)
    plan = registry.flow_plan()
    assert plan is not None
    accounts, per_producer, producers = 3, 60, 3
    total = per_producer * producers
    done: list[int] = []
    finished = threading.Event()
    most: Counter[str] = Counter()
    limits = {f"c:{tasks_flow.per_account.name}|account:{a}": 2 for a in range(accounts)} | {
        "three_at_once": 3
    }

    def produce() -> None:
        for n in range(per_producer):
            if n % 2:
                tasks_flow.per_account.enqueue(n % accounts, 0)
            else:
                tasks_flow.three_at_once.enqueue(0)

    def consume() -> None:
        while len(done) < total:
            batch = store.claim("default", ["flow-keyed", "flow-global"], 3, "consumer", flow=plan)
            if not batch:
                wait_for(lambda: Job.objects.filter(status="queued").exists() or len(done) >= total, 60)
                continue
            done.extend(store.complete_many("default", [(job.id, job.lease_token, "null") for job in batch]))
        finished.set()

    def rate_and_prune() -> None:
        while not finished.is_set():
            tasks_flow.rated.enqueue(0)
            store.claim("default", ["flow-rate"], 5, "rater", flow=plan)
            retention.prune_idle_flow_rates("default")

    def sample() -> None:
        while not finished.is_set():
            rows = Job.objects.filter(status="running", queue_name__in=["flow-keyed", "flow-global"])
            counts: Counter[str] = Counter()
            for queue_name, flow_keys in rows.values_list("queue_name", "flow_keys"):
                counts.update(["three_at_once"] if queue_name == "flow-global" else flow_keys)
            for key, count in counts.items():
                most[key] = max(most[key], count)

    try:
        errors = run_threads(*[produce] * producers, *[consume] * 3, rate_and_prune, sample)
    finally:
        for task in tasks_flow.ALL:
            registry.unregister(task.name)
    assert errors == []
    assert len(done) == len(set(done)) == total
    print(f"most_at_once={dict(most)} retried={len(retried)}")
    assert all(most[key] <= limit for key, limit in limits.items()), dict(most)
    assert {(event.operation, event.reason) for event in retried} <= {
        (operation, reason)
        for operation in ("claim_limited", "claim", "complete_many", "enqueue_keyed")
        for reason in ("deadlock", "lock_wait_timeout")
    }


def test_two_members_emptying_their_shards_at_once_finish_the_batch_once_with_no_deadlock(retried):
    # An upsert (INSERT ... ON DUPLICATE KEY UPDATE) of a counter row that exists still checks
    # its workflow foreign key: a shared lock on the workflow row. Two members that each empty
    # a shard then both hold it and both want it exclusively, to see whether the batch is
    # done: a deadlock, rolled back into the caller's transaction (a job's own, for an atomic
    # task). The counters are written without that lock; one completion finishes the batch.
    from django_jobguard import Batch, workflows
    from django_jobguard.models import Workflow, WorkflowCallback

    batch = Batch(on_success=tasks.add.s(99)).enqueue([tasks.add.s(1), tasks.add.s(2)])
    first, second = Job.objects.filter(workflow_id=batch.id).order_by("pk").values_list("pk", flat=True)
    assert first % 256 != second % 256, "the members share a shard: the test would prove nothing"
    Job.objects.filter(pk__in=[first, second]).update(status="succeeded")
    errors: list[BaseException] = []

    def settle_second() -> None:
        try:
            with transaction.atomic():
                workflows.job_settled("default", second, batch.id, "succeeded", "3")
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=settle_second)
    try:
        with transaction.atomic():
            # The first member's shard is emptied (its row locked), the batch not yet checked...
            store.add_workflow_counts("default", [(batch.id, first % 256, -1, 1, 0)])
            thread.start()
            # ...while the second member settles in full: done, or waiting for a lock of ours.
            wait_for(
                lambda: not thread.is_alive() or lock_waits() >= 1,
                timeout=60,
                message="the second member to settle or to wait",
            )
            workflows.finish_if_settled("default", batch.id)
    finally:
        thread.join(120)
    assert errors == []
    assert Workflow.objects.get(pk=batch.id).state == "finished"
    assert list(WorkflowCallback.objects.filter(workflow_id=batch.id).values_list("when", flat=True)) == [
        "success"
    ]
    assert not [event for event in retried if event.operation == "add_workflow_counts"]


def test_concurrent_adds_to_one_open_batch_meet_no_deadlock(retried):
    # Each add() inserts the counter rows of shards its members are the first in (the foreign
    # key's check: a shared lock on the batch's row), then locks that row to check the batch
    # is still open. Two adds holding it shared and both wanting it exclusively deadlocked;
    # the missing rows are now inserted under the row's exclusive lock, taken last.
    from django_jobguard import Batch
    from django_jobguard.workflows import progress

    batch = Batch(on_success=tasks.add.s(99)).open()
    assert batch.id is not None
    adds, members = 10, 40

    def add(n: int) -> None:
        for round_ in range(adds):
            with transaction.atomic():
                Batch.get(batch.id).add([tasks.add.s(n * 10_000 + round_ * 100 + i) for i in range(members)])

    errors = run_threads(*[lambda n=n: add(n) for n in range(4)])
    assert errors == []
    assert progress(batch.id).total == 4 * adds * members
    assert Job.objects.filter(workflow_id=batch.id).count() == 4 * adds * members
