"""The store contract, for jobs and keys: every operation of :class:`store.Dialect`, driven
through ``store.*`` on the database under test.

Written once against the protocol, not per database: it runs on SQLite under ``make test``,
and on PostgreSQL or MariaDB with ``JOBGUARD_TEST_DATABASE_URL``, each time against the
dialect that serves the ``default`` alias (``store.postgres``, ``store.mysql`` or
``store.sqlite``) and, in the same run, against the in-memory store (the ``rows`` fixture,
see conftest.py). A new dialect is done when this suite passes on it.
"""

import datetime
import threading

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_jobguard import store
from django_jobguard.exceptions import LeaseLost
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def claim(batch_size=10, queues=None):
    return store.claim("default", queues, batch_size, "test-worker")


def test_claim_leases_due_jobs_with_a_fresh_token_each(rows):
    first = tasks.add.enqueue(1)
    second = tasks.add.enqueue(2)
    claimed = claim()
    assert [job.id for job in claimed] == [first.id, second.id]
    assert len({job.lease_token for job in claimed}) == 2
    row = rows.job(first.pk)
    assert row.status == "running"
    assert row.attempts == 1
    assert row.worker_id == "test-worker"
    assert row.lease_token == claimed[0].lease_token
    assert row.lease_expires_at > timezone.now() + datetime.timedelta(seconds=25)


def test_claim_skips_jobs_not_yet_due_and_other_queues(rows):
    tasks.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1)
    other = tasks.add.using(queue_name="other").enqueue(2)
    assert claim(queues=["default"]) == []
    assert [job.id for job in claim(queues=["other"])] == [other.id]


def test_claim_takes_higher_priority_first_and_respects_the_limit(rows):
    low = tasks.add.using(priority=-5).enqueue(1)
    high = tasks.add.using(priority=50).enqueue(2)
    middle = tasks.add.enqueue(3)
    assert [job.id for job in claim(batch_size=2)] == [high.id, middle.id]
    assert [job.id for job in claim(batch_size=2)] == [low.id]


def test_claim_over_several_queues_keeps_priority_order_across_them(rows):
    a_low = tasks.add.using(queue_name="a", priority=1).enqueue(1)
    b_high = tasks.add.using(queue_name="b", priority=9).enqueue(2)
    a_high = tasks.add.using(queue_name="a", priority=5).enqueue(3)
    tasks.add.using(queue_name="c", priority=100).enqueue(4)
    assert [job.id for job in claim(batch_size=2, queues=["a", "b"])] == [b_high.id, a_high.id]
    assert [job.id for job in claim(batch_size=5, queues=["a", "b"])] == [a_low.id]


def test_complete_needs_the_current_token(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    assert not store.complete("default", job.id, "0" * 32, "1")
    assert store.complete("default", job.id, job.lease_token, "3")
    row = rows.job(job.id)
    assert (row.status, row.result, row.lease_token) == ("succeeded", 3, None)
    # A second ack with the same token finds nothing: the token was cleared.
    assert not store.complete("default", job.id, job.lease_token, "3")


def test_heartbeat_extends_only_leases_still_held(rows):
    tasks.add.enqueue(1)
    tasks.add.enqueue(2)
    a, b = claim()
    rows.update(a.id, lease_expires_at=timezone.now() + datetime.timedelta(seconds=1))
    renewed = store.heartbeat("default", [(a.id, a.lease_token), (b.id, "f" * 32)])
    assert renewed == {a.id}
    assert rows.job(a.id).lease_expires_at > timezone.now() + datetime.timedelta(seconds=25)


def test_requeue_schedules_a_retry_and_keeps_the_attempt(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    assert store.requeue("default", job.id, job.lease_token, delay=60, error="ValueError: boom")
    row = rows.job(job.id)
    assert (row.status, row.attempts, row.lease_token) == ("queued", 1, None)
    assert row.last_error == "ValueError: boom"
    assert row.first_failed_at is not None
    assert row.run_after > timezone.now() + datetime.timedelta(seconds=55)
    assert claim() == []


def test_lock_contention_requeue_refunds_the_attempt(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    assert store.requeue(
        "default", job.id, job.lease_token, delay=0, error=None, refund_attempt=True, contention=True
    )
    row = rows.job(job.id)
    assert (row.attempts, row.lock_contentions, row.first_failed_at) == (0, 1, None)
    # No attempt counted: no start either (the job list shows '-').
    assert row.started_at is None


def test_a_refunded_claim_gives_the_job_back_its_last_counted_attempts_start(rows):
    tasks.add.enqueue(1)
    (first,) = claim()
    failure = ("builtins.ValueError", "boom", "Traceback ...")
    assert store.requeue(
        "default", first.id, first.lease_token, delay=0, error="ValueError: boom", attempt_error=failure
    )
    started = rows.job(first.id).started_at
    # The next claim's clock must read a later time than the first claim's.
    wait_for(
        lambda: store.database_now("default") > started,
        timeout=10,
        interval=0.005,
        message="the clock to move",
    )
    (contended,) = claim()
    assert rows.job(first.id).started_at > started
    assert store.requeue(
        "default",
        contended.id,
        contended.lease_token,
        delay=0,
        error=None,
        refund_attempt=True,
        contention=True,
    )
    row = rows.job(first.id)
    assert (row.attempts, len(row.attempt_history)) == (1, 1)
    assert row.started_at == started


def test_reaper_returns_expired_leases_and_counts_the_reappearance(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    rows.update(job.id, lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    requeued, exhausted = store.reap("default")
    assert requeued == [(job.id, "default")] and exhausted == []
    row = rows.job(job.id)
    assert (row.status, row.reappearances, row.attempts, row.lease_token) == ("queued", 1, 1, None)
    # The old holder's ack is refused, and the next claim gets a new token.
    assert not store.complete("default", job.id, job.lease_token, "null")
    (again,) = claim()
    assert again.lease_token != job.lease_token and again.attempts == 2


def test_reaper_reports_expired_jobs_out_of_attempts_for_dead_lettering(rows):
    from django_jobguard import dlq

    tasks.add.enqueue(1)
    rows.update(max_attempts=1)
    (job,) = claim()
    rows.update(job.id, lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    requeued, exhausted = store.reap("default")
    assert requeued == [] and exhausted == [(job.id, job.lease_token)]
    letter = dlq.dead_letter("default", job.id, job.lease_token, reason="lease_expired", category="transient")
    assert rows.job(job.id).status == "dead"
    (stored,) = rows.dead_letters()
    assert (stored.pk, stored.job_id, stored.reason) == (letter.pk, job.id, "lease_expired")
    assert stored.attempts == 1
    # Fenced: the same token cannot file a second letter.
    with pytest.raises(LeaseLost):
        dlq.dead_letter("default", job.id, job.lease_token, reason="lease_expired", category="transient")
    assert len(rows.dead_letters()) == 1


def test_live_leases_are_not_reaped(rows):
    tasks.add.enqueue(1)
    claim()
    assert store.reap("default") == ([], [])


def test_no_claim_can_push_attempts_past_the_maximum(rows):
    tasks.add.enqueue(1)
    rows.update(max_attempts=1, attempts=1)
    assert claim() == []


# -- the boundary itself ----------------------------------------------------------------------


def test_database_now_is_the_database_clock_and_aware(rows):
    now = store.database_now("default")
    assert now.tzinfo is not None
    assert abs((now - timezone.now()).total_seconds()) < 60


# -- inserts ------------------------------------------------------------------------------------


def _row(**changes):
    row = {
        "task_name": tasks.add.name,
        "queue_name": "default",
        "args": [1],
        "kwargs": {"b": 2},
        "priority": 0,
        "max_attempts": 3,
        "visibility_timeout": 30.0,
        "idempotency_key": None,
        "lock_key": "",
        "handler_version": "",
    }
    row.update(changes)
    return row


def test_insert_jobs_returns_ids_and_times_in_order(rows):
    inserted = store.insert_jobs("default", [_row(args=[n]) for n in range(3)])
    assert [job_id for job_id, _, _ in inserted] == sorted(job_id for job_id, _, _ in inserted)
    stored = [(job.args, job.kwargs, job.status, job.attempt_history) for job in rows.jobs()]
    assert stored == [([n], {"b": 2}, "queued", []) for n in range(3)]
    for _, run_after, enqueued_at in inserted:
        assert run_after == enqueued_at and run_after.tzinfo is not None


def test_build_job_builds_the_saved_job_of_an_inserted_row(rows):
    fields = [_row(args=[n]) for n in range(3)]
    inserted = store.insert_jobs("default", fields)
    job = store.build_job("default", fields[1], inserted[1])
    assert (job.pk, job.args, job.status, job._state.adding) == (inserted[1][0], [1], "queued", False)
    row = rows.job(inserted[1][0])
    assert (job.run_after, job.enqueued_at, job.kwargs) == (row.run_after, row.enqueued_at, row.kwargs)
    loaded = store.load_job("default", job.pk)
    assert (loaded.pk, loaded.args, loaded.status, loaded.run_after) == (job.pk, [1], "queued", job.run_after)


def test_insert_jobs_with_a_delay_counts_from_the_database_clock(rows):
    before = store.database_now("default")
    ((job_id, run_after, enqueued_at),) = store.insert_jobs(
        "default", [_row()], datetime.timedelta(seconds=90)
    )
    assert run_after - enqueued_at == datetime.timedelta(seconds=90)
    assert run_after >= before + datetime.timedelta(seconds=90)
    assert rows.job(job_id).run_after == run_after
    at = timezone.now() + datetime.timedelta(days=1)
    ((_, run_after, _),) = store.insert_jobs("default", [_row()], at)
    assert abs((run_after - at).total_seconds()) < 0.001


def test_insert_jobs_of_many_rows_crosses_the_sqlite_chunk(rows):
    count = store.SQLITE_INSERT_CHUNK + 3
    inserted = store.insert_jobs("default", [_row(args=[n]) for n in range(count)])
    assert len(inserted) == count == len(rows.jobs())
    assert store.insert_jobs("default", []) == []


def test_insert_keyed_job_inserts_the_job_and_its_key_once(rows):
    expires = timezone.now() + datetime.timedelta(hours=1)
    row = _row(idempotency_key="order:1")
    first = store.insert_keyed_job("default", row, None, scope="s", fingerprint="f" * 64, expires_at=expires)
    assert first is not None
    (key,) = rows.keys()
    assert (key.key, key.scope, key.job_id, key.status) == ("order:1", "s", first[0], "in_progress")
    assert [job.idempotency_key for job in rows.jobs()] == ["order:1"]
    again = store.insert_keyed_job("default", row, None, scope="s", fingerprint="f" * 64, expires_at=expires)
    assert again is None
    assert (len(rows.jobs()), len(rows.keys())) == (1, 1)


def test_insert_key_yields_to_an_existing_key_and_key_owner_reads_it(rows):
    expires = timezone.now() + datetime.timedelta(hours=1)
    assert store.key_owner("default", "s", "k") is None
    key_id = store.insert_key("default", "s", "k", "a" * 64, expires_at=expires)
    assert [key.pk for key in rows.keys()] == [key_id]
    assert store.insert_key("default", "s", "k", "b" * 64, expires_at=expires) is None
    assert store.key_owner("default", "s", "k") == (None, "in_progress")


def test_record_key_success_needs_the_owner_job(rows):
    (job,) = [tasks.add.enqueue(1)]
    expires = timezone.now() + datetime.timedelta(hours=1)
    store.insert_key("default", "s", "k", "a" * 64, job.pk, expires_at=expires)
    assert not store.record_key_success("default", "s", "k", job.pk + 1, {"x": 1})
    assert store.record_key_success("default", "s", "k", job.pk, {"x": 1})
    (key,) = rows.keys()
    assert (key.status, key.result) == ("succeeded", {"x": 1})
    assert store.key_owner("default", "s", "k") == (job.pk, "succeeded")


# -- settling -------------------------------------------------------------------------------


def test_claim_leaves_excluded_queues_alone(rows):
    tasks.add.using(queue_name="paused").enqueue(1)
    kept = tasks.add.enqueue(2)
    assert [job.id for job in store.claim("default", None, 5, "w", exclude=["paused"])] == [kept.id]
    assert store.claim("default", ["paused"], 5, "w", exclude=["paused"]) == []
    assert store.claim("default", None, 0, "w") == []


def test_claim_starts_an_attempt_in_the_history(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    (entry,) = rows.job(job.id).attempt_history
    assert entry["worker_id"] == "test-worker" and entry["started_at"]


def test_heartbeat_reports_cancel_requests_of_renewed_leases(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    rows.update(job.id, cancel_requested=True)
    asked: set[int] = set()
    assert store.heartbeat("default", [(job.id, job.lease_token)], cancel_requested=asked) == {job.id}
    assert asked == {job.id}
    assert store.heartbeat("default", []) == set()


def test_a_failed_attempt_is_recorded_in_the_history_and_a_refund_drops_it(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    failure = ("builtins.ValueError", "boom", "Traceback ...")
    assert store.requeue(
        "default", job.id, job.lease_token, delay=0, error="ValueError: boom", attempt_error=failure
    )
    (entry,) = rows.job(job.id).attempt_history
    assert (entry["error_class"], entry["error"], entry["traceback"]) == failure
    assert entry["finished_at"]
    (again,) = claim()
    assert len(rows.job(job.id).attempt_history) == 2
    assert store.requeue("default", again.id, again.lease_token, delay=0, error=None, refund_attempt=True)
    row = rows.job(job.id)
    assert (row.attempts, len(row.attempt_history)) == (1, 1)
    assert not store.requeue("default", again.id, again.lease_token, delay=0, error=None)


def test_mark_dead_is_fenced_and_completes_the_history_entry(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    failure = ("builtins.KeyError", "'x'", "")
    assert not store.mark_dead("default", job.id, "0" * 32, "KeyError: 'x'", failure)
    assert store.mark_dead("default", job.id, job.lease_token, "KeyError: 'x'", failure)
    row = rows.job(job.id)
    assert (row.status, row.lease_token, row.last_error) == ("dead", None, "KeyError: 'x'")
    assert row.finished_at is not None and row.first_failed_at is not None
    assert row.attempt_history[-1]["error_class"] == "builtins.KeyError"


def test_the_reaper_records_the_expired_attempt_in_the_history(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    rows.update(job.id, lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    store.reap("default")
    row = rows.job(job.id)
    assert row.last_error.startswith("lease expired")
    assert row.attempt_history[-1]["error_class"] == store.LEASE_EXPIRED_ERROR[0]


def test_discard_queued_deletes_only_a_queued_job(rows):
    running = tasks.add.enqueue(2)
    (claimed,) = claim()
    queued = tasks.add.enqueue(1)
    with transaction.atomic():
        store.discard_queued("default", queued.pk)
    store.discard_queued("default", running.pk)
    assert list(rows.statuses()) == [running.pk] == [claimed.id]


# -- checkpoints ------------------------------------------------------------------------------


def test_checkpoints_are_written_under_the_lease_and_read_back(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    assert store.read_checkpoints("default", job.id) == {}
    assert store.write_checkpoints("default", job.id, job.lease_token, {"charged": {"id": 7}})
    assert store.read_checkpoints("default", job.id) == {"charged": {"id": 7}}
    assert not store.write_checkpoints("default", job.id, "0" * 32, {"other": True})
    assert store.read_checkpoints("default", job.id) == {"charged": {"id": 7}}
    assert store.read_checkpoints("default", job.id + 1000) == {}
    # A finished job's checkpoints take no more writes, even with its last token.
    assert store.complete("default", job.id, job.lease_token, "1")
    assert not store.write_checkpoints("default", job.id, job.lease_token, {"a": 1})


# -- claims: due time, pauses, concurrency ----------------------------------------------------


def test_claim_takes_a_job_once_its_run_after_has_passed(rows):
    past = store.insert_jobs("default", [_row()], timezone.now() - datetime.timedelta(minutes=5))
    future = store.insert_jobs("default", [_row()], datetime.timedelta(minutes=5))
    assert [job.id for job in claim()] == [past[0][0]]
    rows.update(future[0][0], run_after=timezone.now() - datetime.timedelta(seconds=1))
    assert [job.id for job in claim()] == [future[0][0]]


def test_claim_picks_equal_priorities_by_run_after_then_id(rows):
    # The batch comes back in (priority, id) order; which jobs are in it follows run_after.
    now = timezone.now()
    later = store.insert_jobs("default", [_row()], now - datetime.timedelta(seconds=10))
    earlier = store.insert_jobs("default", [_row(), _row()], now - datetime.timedelta(seconds=60))
    assert [job.id for job in claim(batch_size=1)] == [earlier[0][0]]
    assert [job.id for job in claim(batch_size=1)] == [earlier[1][0]]
    assert [job.id for job in claim(batch_size=1)] == [later[0][0]]


def test_claim_returns_what_running_the_job_needs(rows):
    store.insert_jobs(
        "default",
        [
            _row(
                args=[4],
                kwargs={"b": 5},
                priority=3,
                visibility_timeout=45.0,
                lock_key="k:1",
                handler_version="v2",
            )
        ],
    )
    (job,) = claim()
    assert (job.task_name, job.queue_name, job.args, job.kwargs) == (tasks.add.name, "default", [4], {"b": 5})
    assert (job.priority, job.attempts, job.max_attempts, job.visibility_timeout) == (3, 1, 3, 45.0)
    assert (job.lock_key, job.handler_version, job.idempotency_key) == ("k:1", "v2", None)
    assert len(job.lease_token) == 32


@pytest.mark.parametrize("queues", [None, ["paused"], ["paused", "default"]], ids=["all", "one", "several"])
def test_claim_never_takes_jobs_of_a_paused_queue(queues, rows):
    held = tasks.add.using(queue_name="paused").enqueue(1)
    other = tasks.add.enqueue(2)
    rows.pause("paused")
    claimed = [job.id for job in store.claim("default", queues, 5, "w")]
    assert held.pk not in claimed
    assert claimed == ([] if queues == ["paused"] else [other.pk])
    rows.resume("paused")
    # On PostgreSQL the resumed job, behind where the worker's last claim stopped, is taken by
    # the worker's next full claim (within 20 times a full claim's duration), not at once.
    taken: list[int] = []

    def resumed_job_taken() -> bool:
        taken.extend(job.id for job in store.claim("default", queues, 5, "w"))
        return bool(taken)

    wait_for(resumed_job_taken, timeout=30, message="the resumed queue's job was claimed")
    assert taken == [held.pk]


def test_queue_names_that_differ_only_in_case_are_different_queues(rows):
    # MariaDB's and MySQL's default collations ignore case: the names must still be exact.
    upper = tasks.add.using(queue_name="Mail").enqueue(1)
    lower = tasks.add.using(queue_name="mail").enqueue(2)
    rows.pause("mail")
    assert [job.id for job in store.claim("default", None, 5, "w")] == [upper.pk]
    rows.resume("mail")
    assert [job.id for job in store.claim("default", ["MAIL", "mail"], 5, "w")] == [lower.pk]


def test_a_job_out_of_attempts_is_not_claimed_even_when_due(rows):
    tasks.add.enqueue(1)
    rows.update(attempts=3, max_attempts=3)
    assert claim() == []


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_take_the_same_job(rows):
    store.insert_jobs("default", [_row(args=[n]) for n in range(40)])
    start = threading.Barrier(4)
    taken: list[list[int]] = []
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            start.wait()
            mine: list[int] = []
            while batch := store.claim("default", None, 3, name):
                mine += [job.id for job in batch]
            taken.append(mine)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    every = [job_id for mine in taken for job_id in mine]
    assert len(every) == len(set(every)) == 40


# -- fencing: a token that is not the current one changes nothing ------------------------------


def test_requeue_with_a_stale_token_leaves_the_job_with_its_holder(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    assert not store.requeue("default", job.id, "0" * 32, delay=0, error="late")
    row = rows.job(job.id)
    assert (row.status, row.lease_token, row.last_error) == ("running", job.lease_token, "")


def test_a_finished_job_takes_no_more_heartbeats_acks_or_failures(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    assert store.complete("default", job.id, job.lease_token, "1")
    lease = (job.id, job.lease_token)
    assert store.heartbeat("default", [lease]) == set()
    assert not store.requeue("default", job.id, job.lease_token, delay=0, error="x")
    assert not store.mark_dead("default", job.id, job.lease_token, "x")
    assert rows.job(job.id).status == "succeeded"


def test_complete_many_acks_only_the_leases_still_held(rows):
    for n in range(3):
        tasks.add.enqueue(n)
    a, b, c = claim()
    with transaction.atomic():
        done = store.complete_many(
            "default", [(a.id, a.lease_token, "1"), (b.id, "0" * 32, "2"), (c.id, c.lease_token, "null")]
        )
    assert done == {a.id: False, c.id: False}  # acked, and nobody waits for either
    statuses = rows.statuses()
    assert statuses == {a.id: "succeeded", b.id: "running", c.id: "succeeded"}
    assert rows.job(a.id).result == 1
    assert store.complete_many("default", []) == {}


def test_complete_with_commit_inside_the_outermost_block_commits_the_ack(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    with transaction.atomic():
        assert store.complete("default", job.id, job.lease_token, "7", commit=True)
    row = rows.job(job.id)
    assert (row.status, row.result) == ("succeeded", 7)


def test_a_reaped_job_can_no_longer_be_dead_lettered_by_its_old_holder(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    rows.update(job.id, lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    store.reap("default")
    assert not store.mark_dead("default", job.id, job.lease_token, "late")
    assert rows.job(job.id).status == "queued"


# -- the reaper ----------------------------------------------------------------------------------


def test_the_reaper_takes_at_most_its_limit_per_call(rows):
    for n in range(3):
        tasks.add.enqueue(n)
    claim()
    rows.update(lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    first, _ = store.reap("default", batch_size=2)
    second, _ = store.reap("default", batch_size=2)
    assert (len(first), len(second)) == (2, 1)
    assert store.reap("default", batch_size=2) == ([], [])


def test_the_reaper_leaves_exhausted_jobs_running_for_the_dead_letter_path(rows):
    tasks.add.enqueue(1)
    rows.update(max_attempts=1)
    (job,) = claim()
    rows.update(job.id, lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    assert store.reap("default") == ([], [(job.id, job.lease_token)])
    assert rows.job(job.id).status == "running"
    assert store.mark_dead("default", job.id, job.lease_token, "lease expired", store.LEASE_EXPIRED_ERROR)
    assert store.reap("default") == ([], [])


# -- reporting -----------------------------------------------------------------------------------


def test_oldest_due_ages_reports_only_queues_with_due_jobs(rows):
    store.insert_jobs("default", [_row()], timezone.now() - datetime.timedelta(seconds=30))
    store.insert_jobs("default", [_row(queue_name="later")], datetime.timedelta(hours=1))
    ages = store.oldest_due_ages("default")
    assert set(ages) == {"default"}
    assert 29 <= ages["default"] < 120


def test_observed_durations_reports_each_queue_and_task(rows):
    tasks.add.enqueue(1)
    (job,) = claim()
    store.complete("default", job.id, job.lease_token, "1")
    rows.update(job.id, started_at=rows.job(job.id).finished_at - datetime.timedelta(seconds=2))
    ((queue_name, task_name, count, percentiles, top),) = store.observed_durations("default", 3600)
    assert (queue_name, task_name, count) == ("default", tasks.add.name, 1)
    assert percentiles == pytest.approx([2.0, 2.0, 2.0], abs=0.01)
    assert top == pytest.approx(2.0, abs=0.01)
    assert store.observed_durations("default", 3600, queue="other") == []


def test_cursor_lock_is_a_lock_exactly_where_writes_wait_for_jobs(rows):
    lock = store.cursor_lock("default")
    assert (lock is None) is store.writes_while_busy("default")
