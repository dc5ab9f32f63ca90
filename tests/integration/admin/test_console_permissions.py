"""Every page and action of the operator's console checks permissions on the server: a staff
user without jobguard permissions reaches none of them, whatever URL or form they post."""

import datetime

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from django_jobguard.models import DeadLetter, Job, Lock, QueueState
from django_jobguard.monitoring import beats
from tests.support.factories import make_dead_letter, make_user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

HOLDER = "holder-" + "a" * 8  # a lock's owner token


@pytest.fixture
def rows():
    """One row of each model whose pages have a detail view."""
    now = timezone.now()
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(status="dead", finished_at=now, attempts=1)
    letter = make_dead_letter(job)
    lock = Lock.objects.create(
        key="order:1", token=HOLDER, expires_at=now + datetime.timedelta(minutes=5), fencing_token=3
    )
    beats.Beat(worker_id="w1", alias="default", queues=None, concurrency=1, pid=1).beat(jobs_in_hand=0)
    return {"job": job, "deadletter": letter, "lock": lock}


def jobguard_admins():
    return [model for model in admin.site._registry if model._meta.app_label == "jobguard"]


def test_a_staff_user_without_permissions_reaches_no_list_or_detail_page(client, rows):
    client.force_login(make_user("nobody"))
    models = jobguard_admins()
    assert {"job", "deadletter", "lock", "queuestate", "workerbeat"} <= {m._meta.model_name for m in models}
    for model in models:
        name = model._meta.model_name
        response = client.get(reverse(f"admin:jobguard_{name}_changelist"))
        assert response.status_code == 403, name
        first = model._default_manager.first()
        if first is not None:
            response = client.get(reverse(f"admin:jobguard_{name}_change", args=[first.pk]))
            # A 302 to the admin index is Django's answer for a row one may not view.
            assert response.status_code in (302, 403), (name, response.status_code)
            assert str(first.pk) not in response.headers.get("Location", ""), name
    assert "/admin/jobguard/" not in client.get("/admin/").content.decode()  # nor a link to one


def test_the_console_actions_refuse_a_user_without_their_permission(client, rows):
    """Each action posted by a user who may view the rows but not act on them."""
    client.force_login(
        make_user("viewer", "view_job", "view_deadletter", "view_lock", "view_queuestate", "view_workerbeat")
    )
    job, letter, lock = rows["job"], rows["deadletter"], rows["lock"]
    queued = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(2)
    refused = [
        client.post(reverse("admin:jobguard_queuestate_pause"), {"queue": "default", "reason": "x"}),
        client.post(reverse("admin:jobguard_queuestate_resume"), {"queue": "default"}),
        client.post(reverse("admin:jobguard_lock_force_release", args=[lock.pk]), {"reason": "stuck"}),
        client.get(reverse("admin:jobguard_lock_force_release", args=["no-such-key"])),  # 403, not 404
        client.post(
            reverse("admin:jobguard_deadletter_replay", args=[letter.pk, "request"]), {"reason": "x"}
        ),
    ]
    assert [response.status_code for response in refused] == [403] * len(refused)
    for action in ("retry_jobs_now", "cancel_jobs"):
        response = client.post(
            reverse("admin:jobguard_job_changelist"),
            {"action": action, "_selected_action": [queued.pk, job.pk], "index": 0},
        )
        # Django leaves an action the user lacks out of the form and answers "No action selected".
        assert response.status_code in (200, 302), action
    for action in ("request_replays", "approve_replays"):
        client.post(
            reverse("admin:jobguard_deadletter_changelist"),
            {"action": action, "_selected_action": [letter.pk], "confirm": "1", "reason": "x", "index": 0},
        )
    assert not QueueState.objects.exists()
    assert Lock.objects.get(pk=lock.pk).token == HOLDER
    assert Job.objects.get(pk=queued.pk).run_after > timezone.now()  # not retried now
    assert Job.objects.get(pk=queued.pk).status == "queued"  # not cancelled
    assert DeadLetter.objects.get(pk=letter.pk).replay_state == "none"
