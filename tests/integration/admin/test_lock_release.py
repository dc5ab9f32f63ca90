"""The locks page: holder, age, TTL, a gone holder flagged; a guarded force release that bumps the token."""

import datetime
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobguard.exceptions import LockReleaseError, LockReleasePermissionDenied
from django_jobguard.locks import holders, lock, release
from django_jobguard.locks.holders import job_owner
from django_jobguard.models import Job, Lock, LockRelease, WorkerBeat
from tests.support.factories import force_login, make_superuser, make_user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)  # locks commit outside the test's transaction

LIST = reverse("admin:jobguard_lock_changelist")


def held(name, owner=""):
    handle = lock(name, ttl=600, backend="database", owner=owner)
    assert handle.acquire(blocking=False)
    return handle


def running_job(resource_key, *, live=True, worker="host-b:99:abc", lease="t" * 32):
    """A job of ``resource_key`` running on ``worker`` under lease ``lease`` (expired unless ``live``)."""
    job = tasks.locked_interval.enqueue(resource="x")
    expires = timezone.now() + datetime.timedelta(minutes=5 if live else -5)
    Job.objects.filter(pk=job.pk).update(
        lock_key=resource_key,
        status="running",
        lease_token=lease,
        lease_expires_at=expires,
        attempts=1,
        worker_id=worker,
        started_at=timezone.now(),
    )
    return job


def hold_by_running_job(resource_key, *, live=True, worker="host-b:99:abc", lease="t" * 32):
    """A running job that took its lock as a worker does: the claim is the lock's owner."""
    job = running_job(resource_key, live=live, worker=worker, lease=lease)
    return job, held(resource_key, owner=job_owner(job.pk, lease))


def row_of(html, key):
    return re.search(rf"<tr>(?:(?!</tr>).)*{re.escape(key)}.*?</tr>", html, re.S).group(0)


def cell(row, field):
    return re.search(rf'<td class="field-{field}">(.*?)</td>', row, re.S).group(1)


def test_the_list_shows_holder_age_ttl_fencing_and_flags_a_gone_holder(client):
    force_login(client, "ops", "view_lock")
    job, alive = hold_by_running_job("order:1")
    _, gone = hold_by_running_job("order:2", live=False)  # its lease ran out: the worker is gone
    html = client.get(LIST).content.decode()
    alive_row, gone_row = row_of(html, alive.name), row_of(html, gone.name)
    assert f"#{job.pk}" in alive_row and "host-b:99:abc" in alive_row
    assert re.search(r"\d+\.\d s", alive_row)  # TTL left
    assert 'alt="False"' in cell(alive_row, "holder_gone")  # its holder's lease is live
    assert 'alt="True"' in cell(gone_row, "holder_gone")  # held, and its holder is gone
    assert cell(alive_row, "fencing_token") == str(alive.fencing_token)


def test_the_list_costs_the_same_queries_for_few_or_many_locks(client):
    force_login(client, "ops", "view_lock")
    hold_by_running_job("order:1")
    client.get(LIST)
    with CaptureQueriesContext(connection) as few:
        client.get(LIST)
    for n in range(10):
        hold_by_running_job(f"order:{n + 10}", lease=f"{n:032d}")
        running_job(f"order:{n + 10}", lease=f"w{n:031d}")  # a contender
    with CaptureQueriesContext(connection) as many:
        client.get(LIST)
    assert len(many.captured_queries) == len(few.captured_queries)


def test_force_release_needs_the_permission_and_says_so(client):
    force_login(client, "ops", "view_lock")
    handle = held("order:1")
    page = client.get(reverse("admin:jobguard_lock_change", args=[handle.name])).content.decode()
    assert 'id="force-release"' not in page
    url = reverse("admin:jobguard_lock_force_release", args=[handle.name])
    response = client.post(url, {"reason": "stuck"})
    assert response.status_code == 403
    assert "needs the &#x27;jobguard.force_release_lock&#x27; permission" in response.content.decode()
    assert Lock.objects.get(key=handle.name).token is not None


def test_a_forced_release_needs_a_reason_frees_the_lock_bumps_the_token_and_is_audited(client):
    person = force_login(client, "ops", "view_lock", "force_release_lock")
    job, handle = hold_by_running_job("order:1", live=False)
    before = Lock.objects.get(key=handle.name).fencing_token
    page = client.get(reverse("admin:jobguard_lock_change", args=[handle.name])).content.decode()
    assert 'id="force-release"' in page
    url = reverse("admin:jobguard_lock_force_release", args=[handle.name])
    confirm = client.get(url).content.decode()
    assert 'id="holder-gone"' in confirm
    assert "This field is required" in client.post(url, {"reason": " "}).content.decode()
    assert Lock.objects.get(key=handle.name).token is not None
    response = client.post(url, {"reason": "its worker died; TTL 10 minutes"}, follow=True)
    assert f"its fencing token is now {before + 1}" in response.content.decode()
    row = Lock.objects.get(key=handle.name)
    assert (row.token, row.expires_at, row.fencing_token) == (None, None, before + 1)
    audit = LockRelease.objects.get()
    assert (audit.key, audit.actor, audit.reason, audit.fencing_token, audit.holder_job_id) == (
        handle.name,
        person,
        "its worker died; TTL 10 minutes",
        before + 1,
        job.pk,
    )
    # The old holder can neither renew nor release it; the next owner gets a larger token.
    assert handle.extend() is False
    successor = held("order:1")
    assert successor.fencing_token > before + 1


def test_the_service_refuses_a_free_lock_and_an_empty_reason():
    person = make_superuser()
    handle = held("order:1")
    handle.release()
    with pytest.raises(LockReleaseError, match="is not held: there is nothing to release"):
        release.force_release(handle.name, user=person, reason="x")
    with pytest.raises(LockReleaseError, match="A reason is required"):
        release.force_release(handle.name, user=person, reason="")
    nobody = make_user("nobody")
    with pytest.raises(LockReleasePermissionDenied, match="force_release_lock"):
        release.force_release(handle.name, user=nobody, reason="x")
    assert not LockRelease.objects.exists()


def beat(worker, seconds_ago):
    at = timezone.now() - datetime.timedelta(seconds=seconds_ago)
    WorkerBeat.objects.update_or_create(
        worker_id=worker,
        defaults={
            "host": "host",
            "pid": 1,
            "queues": "*",
            "concurrency": 1,
            "started_at": at,
            "last_beat_at": at,
        },
    )


def test_the_holder_is_the_claim_in_the_locks_token_not_a_contender_with_the_same_key(client):
    """The incident: a dead worker's job holds the lock, a live job of the same key waits for it.

    Before, the list named the most recently started running job of the key (the contender,
    whose lease is live) and said the holder was not gone.
    """
    force_login(client, "ops", "view_lock")
    beat("dead-worker", seconds_ago=600)  # missed many beats: SIGKILLed
    beat("live-worker", seconds_ago=1)
    holder, handle = hold_by_running_job("order:1", worker="dead-worker")  # lease still live
    contender = running_job("order:1", worker="live-worker", lease="c" * 32)
    Job.objects.filter(pk=contender.pk).update(lock_contentions=7)
    row = row_of(client.get(LIST).content.decode(), handle.name)
    assert f"#{holder.pk}</a> dead-worker" in cell(row, "holder")
    assert f"#{contender.pk}" not in row
    assert 'alt="True"' in cell(row, "holder_gone")
    assert 'alt="True"' in cell(row, "stuck")
    assert cell(row, "contention") == "1 (7)"  # one job waits, put back 7 times
    page = client.get(reverse("admin:jobguard_lock_change", args=[handle.name])).content.decode()
    assert "Its worker dead-worker has not beaten for" in page


def test_a_holder_on_a_beating_worker_with_a_live_lease_is_not_gone(client):
    force_login(client, "ops", "view_lock")
    beat("live-worker", seconds_ago=1)
    _, handle = hold_by_running_job("order:1", worker="live-worker")
    row = row_of(client.get(LIST).content.decode(), handle.name)
    assert 'alt="False"' in cell(row, "holder_gone") and 'alt="False"' in cell(row, "stuck")


def test_a_claim_that_lost_its_job_to_a_new_claim_is_gone(client):
    force_login(client, "ops", "view_lock")
    job, handle = hold_by_running_job("order:1", worker="old-worker")
    # The job's lease ran out and another worker claimed it: a new lease token, the same job.
    Job.objects.filter(pk=job.pk).update(lease_token="n" * 32, worker_id="new-worker")
    live = holders.database_lock(handle.name)
    assert live.holder.job_id == job.pk and live.holder.gone
    assert "claimed again since" in live.holder.why
    Job.objects.filter(pk=job.pk).update(status="succeeded", lease_token=None, lease_expires_at=None)
    assert "is succeeded now" in holders.database_lock(handle.name).holder.why
    Job.objects.filter(pk=job.pk).delete()
    assert holders.database_lock(handle.name).holder.why == f"Job #{job.pk} no longer exists."


def test_a_lock_taken_in_code_names_no_job_and_its_holder_is_unknown(client):
    force_login(client, "ops", "view_lock")
    handle = held("order:1")
    running_job("order:1")  # a running job of the key: not the holder
    row = row_of(client.get(LIST).content.decode(), handle.name)
    assert "not a job&#x27;s claim" in cell(row, "holder")
    assert 'alt="None"' in cell(row, "holder_gone")


def test_a_forced_release_refuses_a_lock_that_changed_hands_since_the_operator_looked():
    person = make_superuser()
    first = held("order:1")
    seen = first.token
    first.release()
    second = held("order:1")
    with pytest.raises(LockReleaseError, match="changed hands since you looked"):
        release.force_release(second.name, user=person, reason="stuck", token=seen)
    assert second.extend() is True and not LockRelease.objects.exists()


def test_an_owner_token_fits_the_token_column_and_bad_owners_are_refused():
    owner = job_owner(2**63 - 1, "x" * 32)
    handle = held("order:1", owner=owner)
    assert len(handle.token) <= Lock._meta.get_field("token").max_length
    assert holders.parse_owner(handle.token) == (2**63 - 1, owner.split(".")[2])
    for bad in ("x" * 48, "a b", "a\nb"):
        with pytest.raises(ValueError, match="a lock owner is at most 47"):
            lock("order:2", owner=bad)
