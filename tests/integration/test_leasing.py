"""The leasing primitives, driven directly: claim, heartbeat, complete, requeue, reap."""

import datetime

import pytest
from django.utils import timezone

from django_jobguard import leasing
from django_jobguard.models import DeadLetter, Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def claim(limit=10, queues=None):
    return leasing.claim("default", queues, limit, "test-worker")


def test_claim_leases_due_jobs_with_a_fresh_token_each():
    first = tasks.add.enqueue(1)
    second = tasks.add.enqueue(2)
    claimed = claim()
    assert [job.id for job in claimed] == [first.id, second.id]
    assert len({job.lease_token for job in claimed}) == 2
    row = Job.objects.get(pk=first.pk)
    assert row.status == "running"
    assert row.attempts == 1
    assert row.worker_id == "test-worker"
    assert row.lease_token == claimed[0].lease_token
    assert row.lease_expires_at > timezone.now() + datetime.timedelta(seconds=25)


def test_claim_skips_jobs_not_yet_due_and_other_queues():
    tasks.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1)
    other = tasks.add.using(queue_name="other").enqueue(2)
    assert claim(queues=["default"]) == []
    assert [job.id for job in claim(queues=["other"])] == [other.id]


def test_claim_takes_higher_priority_first_and_respects_the_limit():
    low = tasks.add.using(priority=-5).enqueue(1)
    high = tasks.add.using(priority=50).enqueue(2)
    middle = tasks.add.enqueue(3)
    assert [job.id for job in claim(limit=2)] == [high.id, middle.id]
    assert [job.id for job in claim(limit=2)] == [low.id]


def test_claim_over_several_queues_keeps_priority_order_across_them():
    a_low = tasks.add.using(queue_name="a", priority=1).enqueue(1)
    b_high = tasks.add.using(queue_name="b", priority=9).enqueue(2)
    a_high = tasks.add.using(queue_name="a", priority=5).enqueue(3)
    tasks.add.using(queue_name="c", priority=100).enqueue(4)
    assert [job.id for job in claim(limit=2, queues=["a", "b"])] == [b_high.id, a_high.id]
    assert [job.id for job in claim(limit=5, queues=["a", "b"])] == [a_low.id]


def test_complete_needs_the_current_token():
    tasks.add.enqueue(1)
    (job,) = claim()
    assert not leasing.complete("default", job.id, "0" * 32, "1")
    assert leasing.complete("default", job.id, job.lease_token, "3")
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.result, row.lease_token) == ("succeeded", 3, None)
    # A second ack with the same token finds nothing: the token was cleared.
    assert not leasing.complete("default", job.id, job.lease_token, "3")


def test_heartbeat_extends_only_leases_still_held():
    tasks.add.enqueue(1)
    tasks.add.enqueue(2)
    a, b = claim()
    Job.objects.filter(pk=a.id).update(lease_expires_at=timezone.now() + datetime.timedelta(seconds=1))
    renewed = leasing.heartbeat("default", [(a.id, a.lease_token), (b.id, "f" * 32)])
    assert renewed == {a.id}
    assert Job.objects.get(pk=a.id).lease_expires_at > timezone.now() + datetime.timedelta(seconds=25)


def test_requeue_schedules_a_retry_and_keeps_the_attempt():
    tasks.add.enqueue(1)
    (job,) = claim()
    assert leasing.requeue("default", job.id, job.lease_token, delay=60, error="ValueError: boom")
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.attempts, row.lease_token) == ("queued", 1, None)
    assert row.last_error == "ValueError: boom"
    assert row.first_failed_at is not None
    assert row.run_after > timezone.now() + datetime.timedelta(seconds=55)
    assert claim() == []


def test_lock_contention_requeue_refunds_the_attempt():
    tasks.add.enqueue(1)
    (job,) = claim()
    assert leasing.requeue(
        "default", job.id, job.lease_token, delay=0, error=None, refund_attempt=True, contention=True
    )
    row = Job.objects.get(pk=job.id)
    assert (row.attempts, row.lock_contentions, row.first_failed_at) == (0, 1, None)


def test_reaper_returns_expired_leases_and_counts_the_reappearance():
    tasks.add.enqueue(1)
    (job,) = claim()
    Job.objects.filter(pk=job.id).update(lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    requeued, exhausted = leasing.reap("default")
    assert requeued == [(job.id, "default")] and exhausted == []
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.reappearances, row.attempts, row.lease_token) == ("queued", 1, 1, None)
    # The old holder's ack is refused, and the next claim gets a new token.
    assert not leasing.complete("default", job.id, job.lease_token, "null")
    (again,) = claim()
    assert again.lease_token != job.lease_token and again.attempts == 2


def test_reaper_reports_expired_jobs_out_of_attempts_for_dead_lettering():
    from django_jobguard import dlq

    tasks.add.enqueue(1)
    Job.objects.update(max_attempts=1)
    (job,) = claim()
    Job.objects.filter(pk=job.id).update(lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    requeued, exhausted = leasing.reap("default")
    assert requeued == [] and exhausted == [(job.id, job.lease_token)]
    letter = dlq.dead_letter("default", job.id, job.lease_token, reason="lease_expired", category="transient")
    assert Job.objects.get(pk=job.id).status == "dead"
    assert DeadLetter.objects.get().pk == letter.pk


def test_live_leases_are_not_reaped():
    tasks.add.enqueue(1)
    claim()
    assert leasing.reap("default") == ([], [])


def test_no_claim_can_push_attempts_past_the_maximum():
    tasks.add.enqueue(1)
    Job.objects.update(max_attempts=1, attempts=1)
    assert claim() == []
