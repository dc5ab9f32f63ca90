"""Idempotency keys at enqueue and at execution (the worker runs in this process, burst mode)."""

import datetime
import re
import time

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from prometheus_client import REGISTRY

from django_jobguard import IdempotencyConflict, LeaseLost, dlq, store
from django_jobguard.context import JobContext
from django_jobguard.exceptions import IdempotencyScheduleConflict
from django_jobguard.idempotency import fingerprint
from django_jobguard.models import DeadLetter, IdempotencyKey, Job
from django_jobguard.worker import Worker
from tests.support.factories import make_dead_letter
from tests.testapp import tasks, tasks_idem
from tests.testapp.models import Execution, LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)


def duplicates_counted(task, where):
    value = REGISTRY.get_sample_value(
        "jobguard_idempotency_duplicates_total", {"task": task.name, "where": where}
    )
    return value or 0.0


def run_burst():
    return Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, concurrency=2).run()


def run_until(predicate, rounds=100):
    """Burst repeatedly (retries and waits come due after a short delay) until ``predicate()``."""
    for _ in range(rounds):
        assert run_burst() == 0
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail("the jobs did not reach the expected state")


def resend(task, key, *args, **kwargs):
    """A job carrying ``key`` that did not go through enqueue's dedupe (a relay's copy, a replay)."""
    return Job.objects.create(task_name=task.name, args=list(args), kwargs=kwargs, idempotency_key=key)


def refreshed(job):
    job.refresh_from_db()
    return job


def expire(key):
    IdempotencyKey.objects.filter(key=key).update(expires_at=timezone.now() - datetime.timedelta(seconds=1))


def finish(job, status="succeeded"):
    Job.objects.filter(pk=job.pk).update(status=status, finished_at=timezone.now())


# -- at enqueue ----------------------------------------------------------------------------


def test_the_same_key_and_arguments_return_the_first_job_and_count_each_duplicate():
    before = duplicates_counted(tasks.add, "enqueue")
    first = tasks.add.using(idempotency_key="sum:1").enqueue(1, b=2)
    # The same call spelled differently is the same action.
    again = tasks.add.using(idempotency_key="sum:1").enqueue(a=1, b=2)
    third = tasks.add.using(idempotency_key="sum:1").enqueue(1, 2)
    assert again.pk == third.pk == first.pk
    assert Job.objects.count() == 1
    key = IdempotencyKey.objects.get(key="sum:1")
    assert (key.scope, key.job_id, key.status, key.duplicates) == (tasks.add.name, first.pk, "in_progress", 2)
    assert key.expires_at > timezone.now() + datetime.timedelta(days=6)  # the default TTL is 7 days
    assert duplicates_counted(tasks.add, "enqueue") - before == 2


@pytest.mark.parametrize("delay", [None, datetime.timedelta(minutes=5), "datetime"])
def test_a_new_key_returns_the_job_as_stored_with_its_key_linked(delay):
    # A new key and its job are written together (one statement on PostgreSQL); the Job
    # returned must be the stored row, run_after included, and the key must point at it.
    at = timezone.now() + datetime.timedelta(hours=2)
    run_after = at if delay == "datetime" else delay
    before = timezone.now()
    job = tasks.add.using(idempotency_key=f"new:{delay}", run_after=run_after, priority=7).enqueue(1, b=2)
    stored = Job.objects.get(pk=job.pk)
    for field in (
        "task_name",
        "queue_name",
        "args",
        "kwargs",
        "priority",
        "run_after",
        "enqueued_at",
        "status",
    ):
        assert getattr(job, field) == getattr(stored, field), field
    assert (stored.idempotency_key, stored.priority, stored.args, stored.kwargs) == (
        f"new:{delay}",
        7,
        [1],
        {"b": 2},
    )
    if delay is None:
        assert stored.run_after == stored.enqueued_at
    elif delay == "datetime":
        assert stored.run_after == at
    else:
        assert before + delay - datetime.timedelta(seconds=5) < stored.run_after < timezone.now() + delay
    key = IdempotencyKey.objects.get(key=f"new:{delay}")
    assert (key.job_id, key.status, key.fingerprint) == (
        job.pk,
        "in_progress",
        fingerprint(tasks.add, [1], {"b": 2}),
    )


def test_conflicting_arguments_raise_naming_the_key_and_write_nothing():
    first = tasks.add.using(idempotency_key="sum:2").enqueue(1)
    before = duplicates_counted(tasks.add, "enqueue")
    row = IdempotencyKey.objects.values().get(key="sum:2")
    with pytest.raises(IdempotencyConflict) as caught:
        tasks.add.using(idempotency_key="sum:2").enqueue(2)
    assert str(caught.value) == (
        "Idempotency key 'sum:2' (scope 'tests.testapp.tasks.add') was already used with different "
        "arguments; use a new key for a different business action."
    )
    assert (caught.value.key, caught.value.scope) == ("sum:2", tasks.add.name)
    assert list(Job.objects.values_list("pk", flat=True)) == [first.pk]
    assert IdempotencyKey.objects.values().get(key="sum:2") == row
    assert duplicates_counted(tasks.add, "enqueue") == before


def test_a_conflict_inside_the_callers_transaction_leaves_that_transaction_usable():
    tasks.add.using(idempotency_key="sum:3").enqueue(1)
    with transaction.atomic():
        mine = tasks.add.enqueue(10)
        with pytest.raises(IdempotencyConflict, match="'sum:3'"):
            tasks.add.using(idempotency_key="sum:3").enqueue(2)
        # No database error was raised, so the transaction goes on and commits.
        also_mine = tasks.add.using(idempotency_key="sum:4").enqueue(3)
    assert set(Job.objects.values_list("pk", flat=True)) >= {mine.pk, also_mine.pk}
    assert Job.objects.count() == 3
    assert IdempotencyKey.objects.count() == 2


def test_an_enqueue_rolled_back_with_the_callers_transaction_leaves_neither_key_nor_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.using(idempotency_key="sum:5").enqueue(1)
        raise RuntimeError("roll back")
    assert not Job.objects.exists()
    assert not IdempotencyKey.objects.exists()
    # The key is free again.
    job = tasks.add.using(idempotency_key="sum:5").enqueue(2)
    assert IdempotencyKey.objects.get(key="sum:5").job_id == job.pk


def test_keys_are_scoped_by_task_unless_tasks_share_a_scope():
    add = tasks.add.using(idempotency_key="k").enqueue(1)
    shared = tasks_idem.shared_a.using(idempotency_key="k").enqueue(1)
    assert add.pk != shared.pk
    assert sorted(IdempotencyKey.objects.values_list("scope", flat=True)) == ["shared", tasks.add.name]
    with pytest.raises(IdempotencyConflict) as caught:
        tasks_idem.shared_b.using(idempotency_key="k").enqueue(1)
    assert "Idempotency key 'k' (scope 'shared') was already used by task " in str(caught.value)
    assert "'tests.testapp.tasks_idem.shared_a'" in str(caught.value)
    assert Job.objects.count() == 2


def test_an_expired_key_whose_job_finished_starts_afresh_for_any_arguments():
    old = tasks.add.using(idempotency_key="sum:6").enqueue(1)
    tasks.add.using(idempotency_key="sum:6").enqueue(1)  # one duplicate on the old row
    finish(old)
    IdempotencyKey.objects.filter(key="sum:6").update(status="succeeded", result=1)
    expire("sum:6")
    new = tasks.add.using(idempotency_key="sum:6").enqueue(5)
    assert new.pk != old.pk
    key = IdempotencyKey.objects.get(key="sum:6")
    assert (key.job_id, key.status, key.result, key.duplicates) == (new.pk, "in_progress", None, 0)
    assert key.fingerprint == fingerprint(tasks.add, [5], {})
    assert key.expires_at > timezone.now()


def test_an_expired_key_whose_job_is_still_queued_keeps_deduplicating():
    job = tasks.add.using(idempotency_key="sum:7").enqueue(1)
    expire("sum:7")
    assert tasks.add.using(idempotency_key="sum:7").enqueue(1).pk == job.pk
    with pytest.raises(IdempotencyConflict, match="'sum:7'"):
        tasks.add.using(idempotency_key="sum:7").enqueue(2)
    assert Job.objects.count() == 1


def test_a_live_key_whose_job_was_deleted_gives_a_new_job_the_stored_result():
    first = tasks_idem.keyed_record.using(idempotency_key="rec:1").enqueue("rec-1")
    run_burst()
    stored = refreshed(first).result
    Job.objects.filter(pk=first.pk).delete()  # by hand; the key survives with its job unset
    again = tasks_idem.keyed_record.using(idempotency_key="rec:1").enqueue("rec-1")
    assert again.pk != first.pk
    assert IdempotencyKey.objects.get(key="rec:1").job_id == again.pk
    run_burst()
    assert (refreshed(again).status, again.result) == ("succeeded", stored)
    assert Execution.objects.filter(marker="rec-1").count() == 1  # the handler did not run again


# -- at execution --------------------------------------------------------------------------


def test_an_atomic_job_stores_its_result_on_its_key_in_the_ack():
    job = tasks_idem.keyed_record.using(idempotency_key="rec:2").enqueue("rec-2", amount=3)
    run_burst()
    job.refresh_from_db()
    key = IdempotencyKey.objects.get(key="rec:2")
    assert (job.status, job.result) == ("succeeded", f"rec-2:{job.pk}")
    assert (key.status, key.result, key.job_id, key.duplicates) == ("succeeded", job.result, job.pk, 0)


def test_a_job_whose_key_already_succeeded_is_acked_with_the_stored_result_and_not_run():
    first = tasks_idem.keyed_record.using(idempotency_key="rec:3").enqueue("rec-3")
    run_burst()
    before = duplicates_counted(tasks_idem.keyed_record, "execution")
    copy = resend(tasks_idem.keyed_record, "rec:3", "rec-3")
    run_burst()
    copy.refresh_from_db()
    assert (copy.status, copy.attempts, copy.result) == ("succeeded", 1, refreshed(first).result)
    assert Execution.objects.filter(marker="rec-3").count() == 1
    key = IdempotencyKey.objects.get(key="rec:3")
    assert (key.job_id, key.duplicates) == (first.pk, 1)
    assert duplicates_counted(tasks_idem.keyed_record, "execution") - before == 1


def test_a_resend_with_other_arguments_under_a_succeeded_key_is_dead_lettered_as_a_conflict():
    first = tasks_idem.keyed_record.using(idempotency_key="rec:4").enqueue("rec-4")
    run_burst()
    copy = resend(tasks_idem.keyed_record, "rec:4", "rec-4", amount=99)
    run_burst()
    assert refreshed(copy).status == "dead"
    letter = DeadLetter.objects.get(job=copy)
    assert (letter.reason, letter.category) == ("permanent_error", "permanent")
    assert letter.error_class == "django_jobguard.exceptions.IdempotencyConflict"
    assert "Idempotency key 'rec:4' (scope 'tests.testapp.tasks_idem.keyed_record')" in letter.error_message
    assert not Execution.objects.filter(job_id=copy.pk).exists()
    key = IdempotencyKey.objects.get(key="rec:4")
    assert (key.status, key.job_id) == ("succeeded", first.pk)


def test_a_replay_with_a_corrected_payload_under_a_succeeded_key_is_acked_as_a_duplicate():
    first = tasks_idem.keyed_record.using(idempotency_key="rec:7").enqueue("rec-7", amount=5)
    run_burst()
    replay = resend(tasks_idem.keyed_record, "rec:7", "rec-7", amount=6)
    make_dead_letter(
        replay_job=replay, task_name=replay.task_name, queue_name=replay.queue_name, kwargs={"amount": 6}
    )
    run_burst()
    assert (refreshed(replay).status, replay.result) == ("succeeded", refreshed(first).result)
    assert Execution.objects.filter(marker="rec-7").count() == 1
    assert IdempotencyKey.objects.get(key="rec:7").duplicates == 1


def test_a_job_whose_key_is_owned_by_another_waiting_job_waits_for_its_result():
    owner = tasks_idem.keyed_record.using(
        idempotency_key="rec:5", run_after=datetime.timedelta(hours=1)
    ).enqueue("rec-5")
    copy = resend(tasks_idem.keyed_record, "rec:5", "rec-5")
    run_burst()
    copy.refresh_from_db()
    # Back in the queue without using an attempt, and without running.
    assert (copy.status, copy.attempts, copy.lock_contentions) == ("queued", 0, 0)
    assert not Execution.objects.exists()
    Job.objects.filter(pk=owner.pk).update(run_after=timezone.now())
    run_until(lambda: refreshed(copy).status == "succeeded")
    assert (refreshed(owner).status, copy.result) == ("succeeded", owner.result)
    assert Execution.objects.filter(marker="rec-5").count() == 1
    assert IdempotencyKey.objects.get(key="rec:5").duplicates == 1


def test_a_dead_lettered_key_is_marked_failed_and_a_replay_takes_it_over():
    dead = tasks_idem.failing_record.using(idempotency_key="fail:1").enqueue("fail-1")
    run_burst()
    assert refreshed(dead).status == "dead"
    assert not LedgerEntry.objects.exists()  # the atomic attempt's write rolled back
    key = IdempotencyKey.objects.get(key="fail:1")
    assert (key.status, key.job_id) == ("failed", dead.pk)
    # A resend through enqueue does not re-run a failed action: replaying the dead letter does.
    assert tasks_idem.failing_record.using(idempotency_key="fail:1").enqueue("fail-1").pk == dead.pk
    replay = resend(tasks_idem.failing_record, "fail:1", "fail-1", fail=False)  # corrected payload
    run_burst()
    assert refreshed(replay).status == "succeeded"
    key.refresh_from_db()
    assert (key.status, key.job_id, key.result) == ("succeeded", replay.pk, "fail-1")
    assert key.fingerprint == fingerprint(tasks_idem.failing_record, ["fail-1"], {"fail": False})
    assert LedgerEntry.objects.get().job_id == replay.pk


def test_a_job_with_a_key_nobody_recorded_creates_and_owns_it():
    job = resend(tasks_idem.keyed_record, "rec:6", "rec-6")
    run_burst()
    key = IdempotencyKey.objects.get(key="rec:6")
    assert (key.scope, key.status, key.job_id, key.result) == (
        tasks_idem.keyed_record.name,
        "succeeded",
        job.pk,
        refreshed(job).result,
    )


# -- checkpoints ---------------------------------------------------------------------------


def test_a_retried_non_atomic_handler_resumes_after_its_last_checkpoint():
    job = tasks_idem.phased.enqueue("p", fail_after="charge")
    run_until(lambda: refreshed(job).status == "succeeded")
    assert (job.attempts, job.result) == (2, ["notify"])
    assert job.checkpoints == {"reserve": 1, "charge": 1, "notify": 2}
    runs = sorted(Execution.objects.values_list("marker", "attempt"))
    assert runs == [("p:charge", 1), ("p:notify", 2), ("p:reserve", 1)]


def test_a_checkpoint_from_a_stale_lease_is_refused():
    job = tasks_idem.phased.enqueue("q")
    Job.objects.filter(pk=job.pk).update(checkpoints={"reserve": 1})
    stale = "not-the-lease"
    context = JobContext(
        task=tasks_idem.phased,
        job_id=job.pk,
        attempt=2,
        max_attempts=3,
        queue_name="default",
        _lease_token=stale,
        _alias=connection.alias,
    )
    assert context.get_checkpoint("reserve") == 1
    with pytest.raises(LeaseLost, match=f"job {job.pk}: lease lost before checkpoint 'charge'"):
        context.checkpoint("charge", 2)
    assert context.lease_lost
    assert refreshed(job).checkpoints == {"reserve": 1}


def test_checkpoints_are_refused_in_atomic_tasks():
    job = tasks_idem.atomic_checkpoint.enqueue()
    run_burst()
    letter = DeadLetter.objects.get(job=job)
    assert letter.error_class == "django_jobguard.exceptions.InvalidTaskError"
    assert "is atomic=True: a checkpoint would roll back" in letter.error_message


def test_checkpoints_live_in_memory_when_a_task_is_called_directly():
    assert tasks_idem.phased.call("direct") == ["reserve", "charge", "notify"]
    assert not Job.objects.exists()


def test_a_scoped_key_is_marked_failed_when_the_reaper_dead_letters_its_job():
    job = tasks_idem.charge.using(idempotency_key="charge:order:9").enqueue(order_id=9, amount=1)
    (claimed,) = store.claim(connection.alias, None, 1, "gone")
    # The reaper dead-letters an expired last attempt without loading the task or its scope.
    dlq.dead_letter(
        connection.alias, claimed.id, claimed.lease_token, reason="lease_expired", category="transient"
    )
    key = IdempotencyKey.objects.get(key="charge:order:9")
    assert (key.scope, key.status, key.job_id) == ("payments", "failed", job.pk)


def test_a_repeat_onto_a_job_due_far_later_than_asked_is_a_schedule_conflict():
    later = timezone.now() + datetime.timedelta(days=30)
    first = tasks.add.using(idempotency_key="far:1", run_after=later).enqueue(1)
    with pytest.raises(IdempotencyScheduleConflict) as caught:
        tasks.add.using(idempotency_key="far:1").enqueue(1)  # asks for now
    assert isinstance(caught.value, IdempotencyConflict)  # caught by existing handlers too
    assert "'far:1'" in str(caught.value)
    assert re.search(r"has not run and is due 259\d{4}s later than this enqueue asks", str(caught.value))
    assert "SCHEDULE_TOLERANCE'] = 300s" in str(caught.value)
    with pytest.raises(IdempotencyScheduleConflict):  # a timedelta counts from now
        tasks.add.using(idempotency_key="far:1", run_after=datetime.timedelta(days=1)).enqueue(1)
    # Nothing written: no second job, no duplicate counted.
    assert list(Job.objects.values_list("pk", flat=True)) == [first.pk]
    assert IdempotencyKey.objects.get(key="far:1").duplicates == 0
    # Asking for the job's own time, or a later one, is a duplicate.
    assert tasks.add.using(idempotency_key="far:1", run_after=later).enqueue(1).pk == first.pk
    later_still = later + datetime.timedelta(days=1)
    assert tasks.add.using(idempotency_key="far:1", run_after=later_still).enqueue(1).pk == first.pk


def test_a_job_due_within_the_tolerance_or_already_run_is_a_duplicate():
    soon = tasks.add.using(idempotency_key="soon:1", run_after=datetime.timedelta(seconds=120)).enqueue(1)
    assert tasks.add.using(idempotency_key="soon:1").enqueue(1).pk == soon.pk  # 2 minutes < 5
    # A retry's run_after is the backoff's, not what anyone asked for: no conflict.
    retried = tasks.add.using(idempotency_key="retried:1").enqueue(1)
    Job.objects.filter(pk=retried.pk).update(
        attempts=1, run_after=timezone.now() + datetime.timedelta(days=2)
    )
    assert tasks.add.using(idempotency_key="retried:1").enqueue(1).pk == retried.pk


def test_the_schedule_tolerance_is_a_setting():
    tasks.add.using(idempotency_key="tol:1", run_after=datetime.timedelta(seconds=120)).enqueue(1)
    with override_settings(JOBGUARD={**settings.JOBGUARD, "IDEMPOTENCY": {"SCHEDULE_TOLERANCE": 60}}):
        with pytest.raises(IdempotencyScheduleConflict, match="= 60s"):
            tasks.add.using(idempotency_key="tol:1").enqueue(1)
    with override_settings(JOBGUARD={**settings.JOBGUARD, "IDEMPOTENCY": {"SCHEDULE_TOLERANCE": -1}}):
        with pytest.raises(ImproperlyConfigured, match="SCHEDULE_TOLERANCE"):
            tasks.add.using(idempotency_key="tol:1").enqueue(1)
