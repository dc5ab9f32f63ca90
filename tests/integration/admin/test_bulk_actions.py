"""Safe bulk actions: retry now, cancel (queued at once, running by request), replay with an estimate."""

import datetime

import pytest
from django.contrib.admin.models import LogEntry
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_jobguard import dlq
from django_jobguard.models import DeadLetter, IdempotencyKey, Job
from django_jobguard.operations import jobs
from tests.support.dlq import dead_charge
from tests.support.factories import force_login, make_job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:jobguard_job_changelist")


def test_retry_now_makes_only_waiting_jobs_due():
    waiting = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(1)
    due = tasks.add.enqueue(2)
    running = make_job("running", 3, run_after=timezone.now() + datetime.timedelta(hours=1))
    assert jobs.retry_now([waiting.pk, due.pk, running.pk]) == [waiting.pk]
    assert set(Job.objects.due().values_list("pk", flat=True)) == {waiting.pk, due.pk}
    waiting.refresh_from_db()
    assert waiting.attempts == 0


def test_request_cancel_flags_running_jobs_only():
    queued = tasks.add.enqueue(1)
    running = make_job("running", 2)
    assert jobs.request_cancel([queued.pk, running.pk]) == [running.pk]
    assert list(Job.objects.filter(cancel_requested=True).values_list("pk", flat=True)) == [running.pk]


def test_the_cancel_action_cancels_queued_jobs_and_asks_running_ones(client):
    force_login(client, "ops", "view_job", "cancel_job")
    queued = tasks.add.enqueue(1)
    running = make_job("running", 2)
    response = client.post(
        JOBS,
        {"action": "cancel_jobs", "_selected_action": [queued.pk, running.pk], "confirm": "yes"},
        follow=True,
    )
    html = response.content.decode()
    assert "1 job cancelled." in html
    assert "1 running job was asked to stop" in html and "nothing is killed" in html
    assert Job.objects.get(pk=queued.pk).status == "cancelled"
    running.refresh_from_db()
    assert (running.status, running.cancel_requested) == ("running", True)
    # The list shows the pending cancel beside the running badge, on that row only.
    listing = client.get(JOBS).content.decode()
    assert listing.count('class="jobguard-badge cancel-requested"') == 1


def test_the_retry_action_needs_its_permission(client):
    force_login(client, "ops", "view_job")
    waiting = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(1)
    assert "retry_jobs_now" not in client.get(JOBS).content.decode()
    client.post(JOBS, {"action": "retry_jobs_now", "_selected_action": [waiting.pk]})
    assert not Job.objects.due().exists()


def test_the_retry_action_makes_the_selection_due(client):
    force_login(client, "ops", "view_job", "retry_job")
    waiting = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(1)
    due = tasks.add.enqueue(2)
    response = client.post(
        JOBS, {"action": "retry_jobs_now", "_selected_action": [waiting.pk, due.pk]}, follow=True
    )
    html = response.content.decode()
    assert "1 job is due now." in html and "1 job was not waiting" in html
    assert Job.objects.due().count() == 2


@pytest.mark.django_db(transaction=True)  # dead_charge runs a worker in this process
@override_settings(JOBGUARD={"REPLAY": {"RATE_PER_MINUTE": 2}})
def test_the_bulk_replay_confirmation_says_how_many_and_how_long_the_throttle_takes(client):
    force_login(client, "ops", "view_deadletter", "request_replay")
    letters = [dead_charge(order_id=20 + i, amount=0) for i in range(3)]
    ahead = dead_charge(order_id=99, amount=0)
    DeadLetter.objects.filter(pk=ahead.pk).update(replay_state="approved")
    assert dlq.redrive_estimate(3).seconds == 120.0  # (1 ahead + 3) at 2 a minute
    url = reverse("admin:jobguard_deadletter_changelist")
    confirm = client.post(url, {"action": "request_replays", "_selected_action": [x.pk for x in letters]})
    html = confirm.content.decode()
    assert "3 dead letters selected" in html
    assert "these 3 replays are redriven at most 2 a minute" in html
    assert "after the 1 approved replay already waiting: about 2 minutes" in html
    # "Select all" of a filter sends select_across: every matching letter, not just the page.
    everything = client.post(
        url, {"action": "request_replays", "select_across": "1", "_selected_action": [letters[0].pk]}
    )
    assert "these 4 replays" in everything.content.decode()


def test_select_all_cancel_asks_first_with_the_count_and_carries_the_filter(client):
    force_login(client, "ops", "view_job", "cancel_job")
    for n in range(1_100):  # more than a request may carry fields for, one per row
        tasks.add.using(queue_name="bulk-cancel").enqueue(n)
    kept = tasks.add.using(queue_name="elsewhere").enqueue(0)
    url = JOBS + "?queue_name=bulk-cancel"
    first = Job.objects.filter(queue_name="bulk-cancel").order_by("pk").first()
    confirm = client.post(
        url, {"action": "cancel_jobs", "select_across": "1", "_selected_action": [first.pk]}
    )
    html = confirm.content.decode()
    assert "Cancel 1100 jobs?" in html and "1100 queued or waiting are cancelled at once" in html
    assert html.count('name="_selected_action"') == 1
    assert not Job.objects.filter(status="cancelled").exists()
    client.post(
        url, {"action": "cancel_jobs", "select_across": "1", "_selected_action": [first.pk], "confirm": "yes"}
    )
    assert Job.objects.filter(queue_name="bulk-cancel", status="cancelled").count() == 1_100
    assert Job.objects.get(pk=kept.pk).status == "queued"


@pytest.mark.django_db(transaction=True)  # dead_charge runs a worker in this process
def test_cancels_and_replays_reach_djangos_admin_log(client):
    person = force_login(
        client, "ops", "view_job", "cancel_job", "view_deadletter", "request_replay", "view_payload"
    )
    queued = [tasks.add.enqueue(n) for n in range(3)]
    running = make_job("running", 9)
    ids = [job.pk for job in [*queued, running]]
    client.post(JOBS, {"action": "cancel_jobs", "_selected_action": ids, "confirm": "yes"})
    # One entry for the three cancelled (with the count), one on the job asked to stop (its History).
    logged = sorted(
        LogEntry.objects.filter(user=person).values_list("object_id", "object_repr", "change_message"),
        key=str,
    )
    assert logged == sorted(
        [
            (
                None,
                "3 jobs: Cancelled in the admin.",
                "Cancelled in the admin. (3 jobs; rows ticked on the page)",
            ),
            (
                str(running.pk),
                str(Job.objects.get(pk=running.pk)),
                "Asked to stop (cancel requested) in the admin.",
            ),
        ],
        key=str,
    )
    letter = dead_charge(order_id=5, amount=0)
    url = reverse("admin:jobguard_deadletter_changelist")
    client.post(
        url,
        {"action": "request_replays", "_selected_action": [letter.pk], "confirm": "yes", "reason": "fixed"},
    )
    entry = LogEntry.objects.get(object_id=str(letter.pk), content_type__model="deadletter")
    assert entry.change_message == "Request replay (bulk): fixed"


def test_cancelled_jobs_are_requeued_unless_their_key_moved_on(client):
    person = force_login(client, "ops", "view_job", "retry_job")
    plain = tasks.add.enqueue(1)
    keyed = tasks.add.using(idempotency_key="sum:requeue").enqueue(2)
    taken = tasks.add.using(idempotency_key="sum:taken").enqueue(3)
    finished = tasks.add.enqueue(4)
    Job.objects.filter(pk=finished.pk).update(status="succeeded", finished_at=timezone.now())
    assert sorted(jobs.cancel([plain.pk, keyed.pk, taken.pk], reason="test")) == sorted(
        [plain.pk, keyed.pk, taken.pk]
    )
    # Once cancelled, the key "sum:taken" is free: another job takes it.
    newer = tasks.add.using(idempotency_key="sum:taken").enqueue(3)
    assert newer.pk != taken.pk

    ids = [plain.pk, keyed.pk, taken.pk, finished.pk]
    client.post(JOBS, {"action": "requeue_cancelled_jobs", "_selected_action": ids, "confirm": "yes"})
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert states == {plain.pk: "queued", keyed.pk: "queued", taken.pk: "cancelled", finished.pk: "succeeded"}
    key = IdempotencyKey.objects.get(key="sum:requeue")
    assert (key.job_id, key.status) == (keyed.pk, "in_progress") and key.expires_at > timezone.now()
    assert IdempotencyKey.objects.get(key="sum:taken").job_id == newer.pk
    assert set(Job.objects.due().values_list("pk", flat=True)) >= {plain.pk, keyed.pk}
    entry = LogEntry.objects.get(user=person)
    assert (entry.object_id, entry.object_repr) == (None, "2 jobs: Re-queued after a cancel in the admin.")


def test_select_all_requeue_asks_first_with_the_count_and_carries_the_filter(client):
    force_login(client, "ops", "view_job", "retry_job")
    for n in range(1_100):  # more than a request may carry fields for, one per row
        tasks.add.using(queue_name="bulk-requeue").enqueue(n)
    jobs.cancel(list(Job.objects.filter(queue_name="bulk-requeue").values_list("pk", flat=True)[:1_050]))
    elsewhere = tasks.add.using(queue_name="elsewhere").enqueue(0)
    jobs.cancel([elsewhere.pk])
    url = JOBS + "?queue_name=bulk-requeue"
    first = Job.objects.filter(queue_name="bulk-requeue").order_by("pk").first()
    selection = {"action": "requeue_cancelled_jobs", "select_across": "1", "_selected_action": [first.pk]}
    html = client.post(url, selection).content.decode()
    assert "Re-queue 1050 cancelled jobs?" in html
    assert "50 selected jobs are not cancelled and are left alone." in html
    assert html.count('name="_selected_action"') == 1 and 'name="select_across" value="1"' in html
    assert not Job.objects.filter(queue_name="bulk-requeue", status="queued").count() > 50
    response = client.post(url, {**selection, "confirm": "yes"}, follow=True)
    assert "1050 cancelled jobs are queued again." in response.content.decode()
    assert Job.objects.filter(queue_name="bulk-requeue", status="queued").count() == 1_100
    assert Job.objects.get(pk=elsewhere.pk).status == "cancelled"
    # One admin-log entry for the action, with the count and the filter it ran on.
    entry = LogEntry.objects.get()
    assert entry.object_repr == "1,050 jobs: Re-queued after a cancel in the admin."
    assert entry.change_message.endswith("(1,050 jobs; select all matching queue_name=bulk-requeue)")
    # Recent actions on the admin index shows it as one line, with no link to a single object.
    index = client.get(reverse("admin:index")).content.decode()
    assert index.count("1,050 jobs: Re-queued after a cancel in the admin.") == 1


def test_a_requeue_of_nothing_cancelled_cannot_be_confirmed(client):
    force_login(client, "ops", "view_job", "retry_job")
    job = tasks.add.enqueue(1)
    html = client.post(
        JOBS, {"action": "requeue_cancelled_jobs", "_selected_action": [job.pk]}
    ).content.decode()
    assert "Re-queue 0 cancelled jobs?" in html and 'Yes, re-queue them" disabled' in html


def test_requeue_needs_the_retry_permission(client):
    force_login(client, "ops", "view_job")
    job = tasks.add.enqueue(1)
    jobs.cancel([job.pk])
    assert "requeue_cancelled_jobs" not in client.get(JOBS).content.decode()
    client.post(JOBS, {"action": "requeue_cancelled_jobs", "_selected_action": [job.pk]})
    assert Job.objects.get(pk=job.pk).status == "cancelled"
