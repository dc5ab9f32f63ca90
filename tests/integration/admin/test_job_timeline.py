"""A job's page tells its story: enqueued, each attempt, the retries' backoff, the dead letter and
its replay, from the stored attempt history; tracebacks and replay actors only for the users who
may see them; the same few queries however long the story."""

import datetime
import re
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobguard import dlq
from django_jobguard.models import DeadLetter, Job
from tests.support.dlq import run_burst
from tests.support.factories import make_user
from tests.testapp import tasks, tasks_dlq

# Transactional: the worker that writes the history runs in this process, with its own connections.
pytestmark = pytest.mark.django_db(transaction=True)

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def page(client, job_id):
    return client.get(f"/admin/jobguard/job/{job_id}/change/")


def steps(html):
    """(kind, the row's text) for each row of the timeline, in order."""
    table = re.search(r'<table class="jobguard-timeline".*?</table>', html, re.S).group(0)
    rows = re.findall(r'<tr class="step step-([a-z_]+)">(.*?)</tr>', table, re.S)
    return [(kind, " ".join(re.sub(r"<[^>]+>", " ", body).split())) for kind, body in rows]


def dead_after_three_failures(marker="t1"):
    """A job a worker ran three times, each failing, until it was dead-lettered."""
    job = tasks_dlq.always_transient.enqueue(marker=marker)
    for _ in range(200):
        assert run_burst() == 0
        job.refresh_from_db()
        if job.status == "dead":
            return job
        time.sleep(0.05)  # the next retry is due after a short backoff
    pytest.fail(f"job {job.pk} still {job.status}")


@pytest.fixture
def replayed():
    """The dead job, its dead letter requested by rita, approved by alex, redriven by a worker."""
    job = dead_after_three_failures()
    letter = DeadLetter.objects.get(job=job)
    dlq.request_replay(letter, make_user("rita", "view_deadletter", "request_replay"), "after the fix")
    dlq.approve_replay(letter, make_user("alex", "view_deadletter", "approve_replay"), "checked it")
    assert run_burst() == 0
    letter.refresh_from_db()
    assert letter.replay_state == "replayed"
    return job, letter


def test_a_dead_jobs_page_shows_each_attempt_its_backoff_the_dead_letter_and_the_replay(client, replayed):
    job, letter = replayed
    client.force_login(make_user("oncall", "view_job", "view_deadletter", "view_payload"))
    response = page(client, job.pk)
    assert response.status_code == 200
    shown = steps(response.content.decode())
    assert [kind for kind, _ in shown] == [
        "enqueued",
        "attempt",
        "backoff",
        "attempt",
        "backoff",
        "attempt",
        "dead_letter",
        "replay_requested",
        "replay_approved",
        "replay_replayed",
    ]
    history = job.attempt_history
    for number, (_kind, text) in enumerate([s for s in shown if s[0] == "attempt"], start=1):
        assert text.startswith(f"Attempt {number} of 3"), text
        assert len(re.findall(TIME, text)) == 2, text  # start and end, with seconds and zone
        assert history[number - 1]["worker_id"] in text
        assert "failed" in text
        assert f"t1: still failing on attempt {number}" in text
        assert "TransientError" in text
    for _, text in [s for s in shown if s[0] == "backoff"]:
        assert "waited" in text and "until the next attempt" in text and len(re.findall(TIME, text)) == 2
    dead_text = dict(shown)["dead_letter"]
    assert f"/admin/jobguard/deadletter/{letter.pk}/change/" in response.content.decode()
    assert "retries exhausted" in dead_text
    assert "rita" in dict(shown)["replay_requested"] and "after the fix" in dict(shown)["replay_requested"]
    assert "alex" in dict(shown)["replay_approved"] and "checked it" in dict(shown)["replay_approved"]
    assert f"job #{letter.replay_job_id}" in dict(shown)["replay_replayed"]
    assert f'href="/admin/jobguard/job/{letter.replay_job_id}/change/"' in response.content.decode()
    # The traceback is there, folded, for a user who may see payloads.
    assert response.content.decode().count("<summary>Traceback</summary>") == 3


def test_the_replay_job_names_its_dead_letter_and_who_let_it_run(client, replayed):
    _job, letter = replayed
    client.force_login(make_user("oncall", "view_job", "view_deadletter"))
    html = page(client, letter.replay_job_id).content.decode()
    kind, text = steps(html)[0]
    assert kind == "replay_of"
    assert "requested by rita, approved by alex" in text and re.search(TIME, text)
    assert f"/admin/jobguard/deadletter/{letter.pk}/change/" in html


def test_without_view_payload_no_traceback_and_without_view_deadletter_no_replay_actors(client, replayed):
    job, letter = replayed
    client.force_login(make_user("support", "view_job"))
    html = page(client, job.pk).content.decode()
    assert "<summary>Traceback</summary>" not in html and "Traceback (most recent call last)" not in html
    assert "kwargs" not in html.split('id="job-timeline"')[1].split("</fieldset>")[0]
    kinds = [kind for kind, _ in steps(html)]
    assert "dead_letter" in kinds and not [k for k in kinds if k.startswith("replay")]
    assert "rita" not in html and "after the fix" not in html
    # The error class shows to everyone with view access; its message (it may echo the
    # payload) needs view_payload, as on the job list.
    assert "TransientError" in html and "still failing on attempt 3" not in html
    replay_page = page(client, letter.replay_job_id).content.decode()
    assert "rita" not in replay_page and steps(replay_page)[0][0] == "replay_of"


def test_a_staff_user_without_view_job_gets_no_page(client, replayed):
    job, _letter = replayed
    client.force_login(make_user("nobody", "view_deadletter"))
    response = page(client, job.pk)
    assert response.status_code == 403
    assert "jobguard-timeline" not in response.content.decode()


def craft(job, **fields):
    Job.objects.filter(pk=job.pk).update(**fields)
    return Job.objects.get(pk=job.pk)


def attempt(worker, started, finished=None, error=None):
    entry = {"worker_id": worker, "started_at": started.isoformat()}
    if finished is not None:
        entry.update(finished_at=finished.isoformat(), error_class=error[0], error=error[1], traceback="tb")
    return entry


@pytest.fixture
def viewer(client):
    client.force_login(make_user("viewer", "view_job"))
    return client


def test_a_job_waiting_for_its_retry_says_when_it_is_due(viewer):
    now = timezone.now()
    job = craft(
        tasks.add.enqueue(1),
        attempts=1,
        first_failed_at=now,
        last_error="Timeout: slow",
        run_after=now + datetime.timedelta(seconds=300),
        attempt_history=[
            attempt("w-1", now - datetime.timedelta(seconds=2), now, ("builtins.TimeoutError", "slow"))
        ],
    )
    shown = steps(page(viewer, job.pk).content.decode())
    assert [kind for kind, _ in shown] == ["enqueued", "attempt", "backoff"]
    backoff = shown[2][1]
    assert "waiting" in backoff and "next attempt due at" in backoff and "a 5 min 0 s backoff" in backoff
    assert "2.000 s" in shown[1][1]  # the attempt's duration


def test_running_succeeded_stuck_and_cancelled_jobs_end_their_timeline_from_the_row(viewer):
    now = timezone.now()
    hour = datetime.timedelta(hours=1)
    ran = [attempt("host-a:1:abc", now - datetime.timedelta(seconds=5))]
    running = craft(
        tasks.add.enqueue(1),
        status="running",
        lease_token="t" * 32,
        lease_expires_at=now + hour,
        started_at=now,
        worker_id="host-a:1:abc",
        attempts=1,
        cancel_requested=True,
        attempt_history=ran,
    )
    stuck = craft(
        tasks.add.enqueue(2),
        status="running",
        lease_token="t" * 32,
        lease_expires_at=now - hour,
        attempts=1,
        attempt_history=ran,
    )
    done = craft(tasks.add.enqueue(3), status="succeeded", finished_at=now, attempts=1, attempt_history=ran)
    cancelled = craft(tasks.add.enqueue(4), status="cancelled", finished_at=now)
    text = steps(page(viewer, running.pk).content.decode())[-1][1]
    assert "running" in text and "lease expires at" in text and "cancel requested" in text
    assert "host-a:1:abc" in text
    assert "lease expired (stuck)" in steps(page(viewer, stuck.pk).content.decode())[-1][1]
    last = steps(page(viewer, done.pk).content.decode())[-1][1]
    assert "succeeded" in last and "5.0" in last and len(re.findall(TIME, last)) == 2
    assert [kind for kind, _ in steps(page(viewer, cancelled.pk).content.decode())] == [
        "enqueued",
        "cancelled",
    ]


def test_the_page_costs_the_same_queries_for_a_short_or_a_long_story(client, replayed):
    """Attempts are one JSON field and the replay trail one query: nothing per attempt or step."""
    long_job, _letter = replayed
    client.force_login(make_user("oncall", "view_job", "view_deadletter", "view_payload"))
    short = dead_after_three_failures("t2")
    now = timezone.now()
    craft(short, attempt_history=short.attempt_history[:1], attempts=1, max_attempts=1)
    # The long story: 40 attempts, and the three replay steps.
    history = [attempt(f"w-{n}", now, now, ("builtins.ValueError", f"failure {n}")) for n in range(40)]
    craft(long_job, attempt_history=history, attempts=40, max_attempts=40)
    page(client, short.pk)  # session and permission caches warm alike for both
    with CaptureQueriesContext(connection) as few:
        assert page(client, short.pk).status_code == 200
    with CaptureQueriesContext(connection) as many:
        html = page(client, long_job.pk).content.decode()
    assert len(steps(html)) == 1 + 40 + 39 + 1 + 3
    assert len(many.captured_queries) == len(few.captured_queries)
    ours = [q["sql"] for q in many.captured_queries if "jobguard_" in q["sql"]]
    assert len(ours) == 2, ours  # the job with both dead letters (one join), the replay trail
