"""InnoDB's deadlock classes, on a real MariaDB with real concurrent connections (threads).

Each class Solid Queue's users met on MySQL, reproduced against our statements:

- a lock-order inversion inside one of our transactions (a real deadlock, forced): InnoDB
  rolls our side back, the store runs it again and counts it; nothing reaches the caller;
- inserts (insert-intention locks) beside claims (``FOR UPDATE SKIP LOCKED``), which at
  REPEATABLE READ take gap locks the inserts wait on;
- concurrent inserts of one idempotency key (the duplicate check's shared lock upgraded to
  the update's exclusive one);
- bulk deletes of finished rows beside inserts and claims.

Run with ``JOBGUARD_TEST_DATABASE_URL=mysql://...``; skipped elsewhere.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from django_jobguard import events, retention, store
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
    assert result["acked"] == {first, second}
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


def test_flow_control_limits_on_a_mariadb_job_store_fail_the_checks():
    from django_jobguard.checks import check_flow_control_database
    from django_jobguard.registry import registry
    from tests.testapp import tasks_flow

    for task in tasks_flow.ALL:
        registry.register(task)
    try:
        [error] = check_flow_control_database()
    finally:
        for task in tasks_flow.ALL:
            registry.unregister(task.name)
    assert error.id == "jobguard.E032" and "MariaDB/MySQL" in error.msg


def test_workflows_on_a_mariadb_job_store_are_refused_before_anything_is_written():
    from django.db import NotSupportedError

    from django_jobguard import chain
    from django_jobguard.models import Job
    from tests.testapp import tasks

    before = Job.objects.count()
    with pytest.raises(NotSupportedError, match="PostgreSQL or SQLite"):
        chain(tasks.add.s(1, 2), tasks.add.s(3, 4)).enqueue()
    assert Job.objects.count() == before
