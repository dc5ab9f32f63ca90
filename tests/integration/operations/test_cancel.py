"""Cancelling queued jobs (the service and the admin action), and running queued jobs now."""

import datetime

import pytest
from django.urls import reverse
from django.utils import timezone

from django_jobguard import store
from django_jobguard.models import IdempotencyKey, Job
from django_jobguard.operations import jobs
from tests.support.factories import make_user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_cancel_touches_only_queued_jobs():
    queued = tasks.add.enqueue(1)
    running = tasks.add.enqueue(2)
    Job.objects.filter(pk=queued.pk).update(priority=-1)  # claim `running` first
    (claimed,) = store.claim("default", None, 1, "w")
    assert claimed.id == running.pk
    assert jobs.cancel([queued.pk, running.pk], reason="order withdrawn") == [queued.pk]
    queued.refresh_from_db()
    running.refresh_from_db()
    assert (queued.status, queued.last_error) == ("cancelled", "cancelled: order withdrawn")
    assert queued.finished_at is not None
    assert running.status == "running"
    assert store.claim("default", None, 5, "w") == []


def test_a_stuck_job_is_cancelled_outright_and_its_late_ack_is_refused(client):
    # Its worker died (or froze) and the reaper has not come by: no heartbeat would carry a
    # stop request, so a cancel does not promise one.
    stuck = tasks.add.using(idempotency_key="sum:stuck").enqueue(1)
    live = tasks.add.enqueue(2)
    held = {job.id: job for job in store.claim("default", None, 2, "w")}
    Job.objects.filter(pk=stuck.pk).update(lease_expires_at=timezone.now() - datetime.timedelta(minutes=5))
    operator = make_user("operator", "view_job", "cancel_job")
    client.force_login(operator)
    url = reverse("admin:jobguard_job_changelist")
    confirm = client.post(url, {"action": "cancel_jobs", "_selected_action": [stuck.pk, live.pk]})
    page = confirm.content.decode()
    assert "1 running are asked to stop" in page and "1 stuck job (running, its lease expired" in page
    response = client.post(
        url, {"action": "cancel_jobs", "_selected_action": [stuck.pk, live.pk], "confirm": "yes"}, follow=True
    )
    text = [str(message) for message in response.context["messages"]]
    assert "1 job cancelled." in text
    assert any(line.startswith("1 running job was asked to stop") for line in text), text
    stuck.refresh_from_db()
    live.refresh_from_db()
    assert (stuck.status, stuck.lease_token, stuck.cancel_requested) == ("cancelled", None, False)
    assert stuck.last_error == "cancelled with its lease expired: by operator in the admin"
    assert (live.status, live.cancel_requested) == ("running", True)
    assert IdempotencyKey.objects.get(key="sum:stuck").status == "failed"
    # The frozen worker wakes up: its ack is fenced off, the cancel stands.
    assert not store.complete("default", stuck.pk, held[stuck.pk].lease_token, "1")
    assert Job.objects.get(pk=stuck.pk).status == "cancelled"
    # Asked directly, a stuck job is not flagged with a request no heartbeat would carry.
    again = tasks.add.enqueue(3)
    (claimed,) = store.claim("default", None, 1, "w")
    Job.objects.filter(pk=claimed.id).update(lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    assert jobs.request_cancel([again.pk]) == []


def test_a_cancelled_jobs_key_can_be_used_again():
    first = tasks.add.using(idempotency_key="sum:1").enqueue(1)
    assert tasks.add.using(idempotency_key="sum:1").enqueue(1).pk == first.pk
    jobs.cancel([first.pk])
    assert IdempotencyKey.objects.get(key="sum:1").status == "failed"
    again = tasks.add.using(idempotency_key="sum:1").enqueue(1)
    assert again.pk != first.pk
    assert again.status == "queued"


def test_the_admin_action_needs_the_cancel_permission(client):
    job = tasks.add.enqueue(1)
    url = reverse("admin:jobguard_job_changelist")
    viewer = make_user("viewer", "view_job")
    client.force_login(viewer)
    page = client.get(url)
    assert b"cancel_jobs" not in page.content
    response = client.post(url, {"action": "cancel_jobs", "_selected_action": [job.pk]})
    job.refresh_from_db()
    assert job.status == "queued"
    assert response.status_code in (200, 302)  # Django refuses the unknown action; nothing changes

    operator = make_user("operator", "view_job", "cancel_job")
    client.force_login(operator)
    assert b"cancel_jobs" in client.get(url).content
    # First a confirmation with the count; nothing changes until it is confirmed.
    confirm = client.post(url, {"action": "cancel_jobs", "_selected_action": [job.pk]})
    assert "Cancel 1 job?" in confirm.content.decode()
    job.refresh_from_db()
    assert job.status == "queued"
    response = client.post(
        url, {"action": "cancel_jobs", "_selected_action": [job.pk], "confirm": "yes"}, follow=True
    )
    job.refresh_from_db()
    assert job.status == "cancelled"
    assert "by operator in the admin" in job.last_error
    assert b"1 job cancelled." in response.content


def test_run_now_makes_waiting_queued_jobs_due_and_leaves_the_others_alone():
    import datetime

    from django.utils import timezone

    later = timezone.now() + datetime.timedelta(hours=1)
    waiting = tasks.add.using(run_after=later).enqueue(1)
    due = tasks.add.enqueue(2)
    finished = tasks.add.enqueue(3)
    Job.objects.filter(pk=finished.pk).update(status="succeeded", finished_at=timezone.now())
    Job.objects.filter(pk=waiting.pk).update(attempts=2)  # a retry in its backoff
    assert sorted(jobs.run_now([waiting.pk, due.pk, finished.pk, 10**9])) == sorted([waiting.pk, due.pk])
    waiting.refresh_from_db()
    assert waiting.run_after <= timezone.now() and waiting.attempts == 2
    assert Job.objects.due().filter(pk=waiting.pk).exists()
    finished.refresh_from_db()
    assert finished.status == "succeeded"
    assert jobs.run_now([]) == []
