"""A lease that expires on the last attempt: the dead letter keeps the handler's own error."""

import datetime

import pytest
from django.utils import timezone

from django_jobguard import store
from django_jobguard.maintenance.reaper import LEASE_EXPIRED_MESSAGE, LEASE_LOST, Reaper
from django_jobguard.models import DeadLetter, Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

ALIAS = "default"


def claim_one():
    (job,) = store.claim(ALIAS, None, 1, "test-worker")
    return job


def expire(job_id):
    Job.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - datetime.timedelta(hours=1))


def test_a_crash_on_the_last_attempt_files_the_handlers_error_and_names_the_lost_lease():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(max_attempts=2)
    first = claim_one()
    failure = ("builtins.ValueError", "the ledger is locked", "Traceback (most recent call last): ...")
    assert store.requeue(
        ALIAS, first.id, first.lease_token, delay=0, error="ValueError: x", attempt_error=failure
    )
    claim_one()  # the last attempt, whose worker dies
    expire(job.pk)
    assert Reaper(ALIAS).run_once().dead_lettered == 1

    letter = DeadLetter.objects.get(job_id=job.pk)
    # Grouped with the handler's other ValueErrors, not apart as LeaseExpired...
    assert (letter.reason, letter.error_class) == ("lease_expired", "ValueError")
    assert letter.traceback == failure[2]
    # ...and the lost lease is still there: the reason, the message, the last attempt's entry.
    assert letter.error_message.startswith("the ledger is locked")
    assert (
        "attempt 1; then LeaseExpired" in letter.error_message
        and LEASE_EXPIRED_MESSAGE in letter.error_message
    )
    history = Job.objects.get(pk=job.pk).attempt_history
    assert [entry.get("error_class") for entry in history] == ["builtins.ValueError", LEASE_LOST]


def test_a_job_whose_every_attempt_lost_its_lease_is_filed_as_lease_expired():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(max_attempts=2)
    claim_one()
    expire(job.pk)
    assert Reaper(ALIAS).run_once().reappeared == 1
    claim_one()
    expire(job.pk)
    assert Reaper(ALIAS).run_once().dead_lettered == 1
    letter = DeadLetter.objects.get(job_id=job.pk)
    assert (letter.error_class, letter.error_message, letter.traceback) == (
        "LeaseExpired",
        LEASE_EXPIRED_MESSAGE,
        "",
    )
    history = Job.objects.get(pk=job.pk).attempt_history
    assert [entry.get("error_class") for entry in history] == [LEASE_LOST, LEASE_LOST]
