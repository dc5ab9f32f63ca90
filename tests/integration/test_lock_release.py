"""The locks page: holder, age, TTL, a gone holder flagged; a guarded force release that bumps the token."""

import datetime
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobguard.exceptions import LockReleaseError, LockReleasePermissionDenied
from django_jobguard.locks import lock, release
from django_jobguard.models import Job, Lock, LockRelease
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)  # locks commit outside the test's transaction

LIST = reverse("admin:jobguard_lock_changelist")


def staff(client, *perms):
    person = User.objects.create_user("ops", is_staff=True)
    for perm in ("view_lock", *perms):
        person.user_permissions.add(Permission.objects.get(codename=perm))
    client.force_login(person)
    return User.objects.get(pk=person.pk)


def held(name):
    handle = lock(name, ttl=600, backend="database")
    assert handle.acquire(blocking=False)
    return handle


def hold_by_running_job(resource_key, *, live=True):
    job = tasks.locked_interval.enqueue(resource="x")
    expires = timezone.now() + datetime.timedelta(minutes=5 if live else -5)
    Job.objects.filter(pk=job.pk).update(
        lock_key=resource_key,
        status="running",
        lease_token="t" * 32,
        lease_expires_at=expires,
        attempts=1,
        worker_id="host-b:99:abc",
        started_at=timezone.now(),
    )
    return job


def row_of(html, key):
    return re.search(rf"<tr>(?:(?!</tr>).)*{re.escape(key)}.*?</tr>", html, re.S).group(0)


def cell(row, field):
    return re.search(rf'<td class="field-{field}">(.*?)</td>', row, re.S).group(1)


def test_the_list_shows_holder_age_ttl_fencing_and_flags_a_gone_holder(client):
    staff(client)
    alive, gone = held("order:1"), held("order:2")
    job = hold_by_running_job("order:1")
    hold_by_running_job("order:2", live=False)  # its lease ran out: the worker is gone
    html = client.get(LIST).content.decode()
    alive_row, gone_row = row_of(html, alive.name), row_of(html, gone.name)
    assert f"#{job.pk}" in alive_row and "host-b:99:abc" in alive_row
    assert re.search(r"\d+\.\d s", alive_row)  # TTL left
    assert 'alt="False"' in cell(alive_row, "holder_gone")  # its holder's lease is live
    assert 'alt="True"' in cell(gone_row, "holder_gone")  # held, and its holder is gone
    assert cell(alive_row, "fencing_token") == str(alive.fencing_token)


def test_the_list_costs_the_same_queries_for_few_or_many_locks(client):
    staff(client)
    held("order:1")
    client.get(LIST)
    with CaptureQueriesContext(connection) as few:
        client.get(LIST)
    for n in range(10):
        held(f"order:{n + 10}")
        hold_by_running_job(f"order:{n + 10}")
    with CaptureQueriesContext(connection) as many:
        client.get(LIST)
    assert len(many.captured_queries) == len(few.captured_queries)


def test_force_release_needs_the_permission_and_says_so(client):
    staff(client)
    handle = held("order:1")
    page = client.get(reverse("admin:jobguard_lock_change", args=[handle.name])).content.decode()
    assert 'id="force-release"' not in page
    url = reverse("admin:jobguard_lock_force_release", args=[handle.name])
    response = client.post(url, {"reason": "stuck"})
    assert response.status_code == 403
    assert "needs the &#x27;jobguard.force_release_lock&#x27; permission" in response.content.decode()
    assert Lock.objects.get(key=handle.name).token is not None


def test_a_forced_release_needs_a_reason_frees_the_lock_bumps_the_token_and_is_audited(client):
    person = staff(client, "force_release_lock")
    handle = held("order:1")
    hold_by_running_job("order:1", live=False)
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
    assert (audit.key, audit.actor, audit.reason, audit.fencing_token) == (
        handle.name,
        person,
        "its worker died; TTL 10 minutes",
        before + 1,
    )
    # The old holder can neither renew nor release it; the next owner gets a larger token.
    assert handle.extend() is False
    successor = held("order:1")
    assert successor.fencing_token > before + 1


def test_the_service_refuses_a_free_lock_and_an_empty_reason():
    person = User.objects.create_superuser("root")
    handle = held("order:1")
    handle.release()
    with pytest.raises(LockReleaseError, match="is not held: there is nothing to release"):
        release.force_release(handle.name, user=person, reason="x")
    with pytest.raises(LockReleaseError, match="A reason is required"):
        release.force_release(handle.name, user=person, reason="")
    nobody = User.objects.create_user("nobody", is_staff=True)
    with pytest.raises(LockReleasePermissionDenied, match="force_release_lock"):
        release.force_release(handle.name, user=nobody, reason="x")
    assert not LockRelease.objects.exists()
