"""The Redis back end's live locks in the admin: read from Redis, holders by owner token, a
bounded SCAN per page, and a forced release that bumps the fencing counter and is audited."""

from __future__ import annotations

import datetime
import re

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone

from django_jobguard.exceptions import LockReleaseError
from django_jobguard.locks import holders, lock, release
from django_jobguard.locks.holders import job_owner
from django_jobguard.models import Job, LockRelease, WorkerBeat
from tests.support import locking
from tests.support.factories import force_login, make_superuser
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.redis]

LIST = reverse("admin:jobguard_lock_changelist")


@pytest.fixture(autouse=True)
def redis_locks(settings):
    """The Redis lock back end through the suite's "redis" alias, its keys cleared around each test."""
    locks = settings.JOBGUARD.get("LOCKS", {})
    settings.JOBGUARD = {**settings.JOBGUARD, "LOCKS": {**locks, "BACKEND": "redis", "CACHE_ALIAS": "redis"}}
    locking.clear_redis_locks()
    yield
    locking.clear_redis_locks()


def redis():
    from django_redis import get_redis_connection

    return get_redis_connection("redis")


def beat(worker, seconds_ago):
    at = timezone.now() - datetime.timedelta(seconds=seconds_ago)
    WorkerBeat.objects.create(
        worker_id=worker, host="h", pid=1, queues="*", concurrency=1, started_at=at, last_beat_at=at
    )


def running_job(resource_key, *, worker, lease):
    job = tasks.locked_interval.enqueue(resource="x")
    Job.objects.filter(pk=job.pk).update(
        lock_key=resource_key,
        status="running",
        lease_token=lease,
        lease_expires_at=timezone.now() + datetime.timedelta(minutes=5),
        attempts=1,
        worker_id=worker,
        started_at=timezone.now(),
    )
    return job


def held(key, owner="", ttl=600):
    handle = lock(key, ttl=ttl, owner=owner)
    assert handle.acquire(blocking=False)
    return handle


def row_of(html, name):
    return re.search(rf'<tr[^>]*data-key="{re.escape(name)}".*?</tr>', html, re.S).group(0)


def cell(row, field):
    return re.search(rf'class="field-{field}">(.*?)</t[dh]>', row, re.S).group(1)


def test_the_page_reads_redis_and_names_the_dead_holder_not_the_contender(client):
    force_login(client, "ops", "view_lock")
    beat("dead-worker", seconds_ago=600)
    beat("live-worker", seconds_ago=1)
    holder = running_job("order:1", worker="dead-worker", lease="h" * 32)
    handle = held("order:1", owner=job_owner(holder.pk, "h" * 32))
    contender = running_job("order:1", worker="live-worker", lease="c" * 32)
    Job.objects.filter(pk=contender.pk).update(lock_contentions=3)
    free_owner = held("order:2")  # taken in code: no job named

    html = client.get(LIST).content.decode()
    assert "this page reads them live" in html
    row = row_of(html, handle.name)
    assert f"#{holder.pk}</a> dead-worker" in cell(row, "holder")
    assert f"#{contender.pk}" not in row
    assert cell(row, "holder_gone") == "yes"
    assert "stuck" in cell(row, "stuck")
    assert cell(row, "fencing_token") == str(handle.fencing_token)
    assert cell(row, "contention") == "1 (3)"
    assert "Its worker dead-worker has not beaten for" in cell(row, "holder_why")
    assert re.fullmatch(r"\d+\.\d s", cell(row, "ttl"))
    other = row_of(html, free_owner.name)
    assert cell(other, "holder_gone") == "unknown" and "not a job" in cell(other, "holder")
    # Stuck locks come first.
    assert html.index(handle.name) < html.index(free_owner.name)
    assert "Force release" not in html  # without the permission


def test_a_lock_without_a_ttl_is_stuck():
    holder_key = lock("order:9").redis_key
    redis().set(holder_key, "set-by-hand")
    (live,) = holders.redis_page().locks
    assert live.ttl_left is None and live.stuck


def test_pages_follow_the_scan_cursor_until_every_lock_is_listed():
    names = {held(f"order:{n}").name for n in range(300)}
    seen: set[str] = set()
    cursor, pages = 0, 0
    while True:
        page = holders.redis_page(cursor, page_size=50)
        seen.update(live.name for live in page.locks)
        pages += 1
        cursor = page.next_cursor
        if not cursor:
            break
    assert seen == names and pages > 1  # fencing counters are never listed as locks


def test_a_page_stops_at_the_scan_cap_and_says_so(client, monkeypatch):
    force_login(client, "ops", "view_lock")
    for n in range(50):
        held(f"order:{n}")
    for n in range(5_000):  # idle fencing counters under the prefix: scanned, never listed
        redis().set(f"jobguard:lock:{{idle:{n}}}:fencing", 1)
    page = holders.redis_page(cap=holders.SCAN_COUNT, page_size=1_000)
    assert page.capped and page.next_cursor and page.examined == holders.SCAN_COUNT
    monkeypatch.setattr(holders, "SCAN_CAP", holders.SCAN_COUNT)
    html = client.get(LIST).content.decode()
    assert 'id="scan-capped"' in html and 'id="next-page"' in html


def test_a_bad_cursor_is_a_400_naming_it(client):
    force_login(client, "ops", "view_lock")
    response = client.get(LIST, {"cursor": "-1"})
    assert response.status_code == 400 and "cursor must be a SCAN cursor" in response.content.decode()


def test_a_forced_release_deletes_the_lock_bumps_the_fencing_counter_and_is_audited(client):
    person = force_login(client, "ops", "view_lock", "force_release_lock")
    beat("dead-worker", seconds_ago=600)
    holder = running_job("order:1", worker="dead-worker", lease="h" * 32)
    handle = held("order:1", owner=job_owner(holder.pk, "h" * 32))
    html = client.get(LIST).content.decode()
    url = reverse("admin:jobguard_lock_force_release", args=[quote(handle.name)])
    assert url in html
    confirm = client.get(url).content.decode()
    assert 'id="holder-gone"' in confirm and f"#{holder.pk}</a> dead-worker" in confirm
    assert f'name="token" value="{handle.token}"' in confirm
    response = client.post(url, {"reason": "its worker was SIGKILLed", "token": handle.token}, follow=True)
    fencing = int(redis().get(f"{handle.redis_key}:fencing"))
    assert fencing > handle.fencing_token
    assert f"its fencing token is now {fencing}" in response.content.decode()
    assert not redis().exists(handle.redis_key)
    audit = LockRelease.objects.get()
    assert (audit.key, audit.actor, audit.fencing_token, audit.holder_job_id) == (
        handle.name,
        person,
        fencing,
        holder.pk,
    )
    assert handle.extend() is False  # the old holder cannot take it back
    assert held("order:1").fencing_token > fencing


def test_a_forced_release_refuses_a_lock_that_changed_hands_or_is_free():
    person = make_superuser()
    first = held("order:1")
    seen = first.token
    first.release()
    with pytest.raises(LockReleaseError, match="is not held"):
        release.force_release(first.name, user=person, reason="stuck", token=seen)
    second = held("order:1")
    with pytest.raises(LockReleaseError, match="changed hands since you looked"):
        release.force_release(second.name, user=person, reason="stuck", token=seen)
    assert second.extend() is True and not LockRelease.objects.exists()
    # Without a token (the service called directly) it frees whoever holds it, and says whom.
    release.force_release(second.name, user=person, reason="stuck")
    assert not second.locked()
