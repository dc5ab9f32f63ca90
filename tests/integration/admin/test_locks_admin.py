"""The database locks in the admin: who holds what, read-only, and the way to the holding job."""

import datetime

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_jobguard.locks import lock
from django_jobguard.models import Job, Lock
from tests.support.factories import make_superuser
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(client):
    client.force_login(make_superuser("ops"))
    return client


def held_and_expired() -> tuple[str, str]:
    held = lock("order:1", ttl=60, backend="database")
    assert held.acquire(blocking=False)
    stale = lock("order:2", ttl=60, backend="database")
    assert stale.acquire(blocking=False)
    Lock.objects.filter(key=stale.name).update(expires_at=timezone.now() - datetime.timedelta(minutes=5))
    return held.name, stale.name


def test_the_list_filters_held_locks_from_free_or_expired_ones(operator):
    held, stale = held_and_expired()
    url = reverse("admin:jobguard_lock_changelist")
    every = operator.get(url).content.decode()
    assert held in every and stale in every
    only_held = operator.get(url, {"held": "yes"}).content.decode()
    assert held in only_held and stale not in only_held
    only_free = operator.get(url, {"held": "no"}).content.decode()
    assert stale in only_free and held not in only_free


def test_a_lock_links_to_the_running_jobs_that_hold_its_key(operator):
    held, _ = held_and_expired()
    holder = tasks.locked_interval.enqueue(resource="x")
    other = tasks.locked_interval.enqueue(resource="y")
    Job.objects.filter(pk=holder.pk).update(
        lock_key="order:1",
        status="running",
        lease_token="t" * 32,
        lease_expires_at=timezone.now(),
        attempts=1,
    )
    page = operator.get(reverse("admin:jobguard_lock_change", args=[held])).content.decode()
    link = reverse("admin:jobguard_job_changelist") + "?lock_key=order%3A1&amp;status__exact=running"
    assert link in page
    jobs = operator.get(
        reverse("admin:jobguard_job_changelist"), {"lock_key": "order:1", "status__exact": "running"}
    )
    assert jobs.status_code == 200
    listed = [row.pk for row in jobs.context["cl"].result_list]
    assert listed == [holder.pk] and other.pk not in listed


def test_locks_cannot_be_added_changed_or_deleted_from_the_admin(operator):
    held, _ = held_and_expired()
    assert operator.get(reverse("admin:jobguard_lock_add")).status_code == 403
    assert (
        operator.post(reverse("admin:jobguard_lock_delete", args=[held]), {"post": "yes"}).status_code == 403
    )
    response = operator.post(reverse("admin:jobguard_lock_change", args=[held]), {"key": held, "token": ""})
    assert response.status_code == 403
    assert Lock.objects.get(key=held).token is not None


def test_lock_times_show_seconds_and_their_zone(operator):
    held, _ = held_and_expired()
    at = datetime.datetime(2026, 12, 1, 6, 52, 3, tzinfo=datetime.UTC)
    Lock.objects.filter(key=held).update(expires_at=at, acquired_at=at)
    with override_settings(TIME_ZONE="Asia/Jakarta"):
        for url in (
            reverse("admin:jobguard_lock_changelist"),
            reverse("admin:jobguard_lock_change", args=[held]),
        ):
            content = operator.get(url).content.decode()
            assert content.count("2026-12-01 13:52:03 WIB (UTC+07:00)") == 2, url  # expires, acquired
            assert "p.m." not in content
    content = operator.get(reverse("admin:jobguard_lock_changelist")).content.decode()
    assert "2026-12-01 06:52:03 UTC" in content


def test_with_the_redis_back_end_the_list_says_the_live_locks_are_in_redis(operator, settings):
    url = reverse("admin:jobguard_lock_changelist")
    locks = settings.JOBGUARD.get("LOCKS", {})
    settings.JOBGUARD = {**settings.JOBGUARD, "LOCKS": {**locks, "BACKEND": "database"}}
    assert "Locks are held in Redis" not in operator.get(url).content.decode()
    settings.JOBGUARD = {**settings.JOBGUARD, "LOCKS": {**locks, "BACKEND": "redis"}}
    assert "Locks are held in Redis" in operator.get(url).content.decode()
