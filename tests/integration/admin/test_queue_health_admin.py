"""The admin's queue health page: figures, charts, pause/resume, permissions, bounded queries."""

import datetime
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobguard.models import Job, QueueEvent, QueueMinute, QueueState
from django_jobguard.monitoring import beats, health
from django_jobguard.operations import queues
from tests.support.factories import force_login, make_dead_letter
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

URL = "/admin/jobguard/queuestate/"


@pytest.fixture
def viewer(client):
    force_login(client, "viewer", "view_job")
    return client


@pytest.fixture
def operator(client):
    force_login(client, "operator", "view_job", "pause_queue")
    return client


def scenario():
    now = timezone.now()
    tasks.add.enqueue(1)
    tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(2)
    retrying = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(3)
    Job.objects.filter(pk=retrying.pk).update(first_failed_at=now, attempts=1, last_error="boom")
    done = tasks.add.using(queue_name="emails").enqueue(4)
    Job.objects.filter(pk=done.pk).update(status="succeeded", finished_at=now)
    QueueMinute.objects.create(
        queue_name="emails",
        minute=now.replace(second=0, microsecond=0),
        failed=3,
        retried=2,
        oldest_age_seconds=42,
    )
    make_dead_letter(queue_name="emails", replay_state="requested")


def row_of(html, queue):
    return re.search(rf'<tr id="queue-{queue}".*?</tr>', html, re.S).group(0)


def cells(html, queue):
    """The figures of a queue's row, as text (a non-zero count is a link: its text)."""
    found = re.findall(r'data-count="([a-z-]+)">(.*?)</(?:td|span)>', row_of(html, queue), re.S)
    return {name: re.sub(r"<[^>]+>", "", value).strip() for name, value in found}


def test_the_page_is_linked_from_the_admin_index_and_the_app_index(viewer):
    for page in ("/admin/", "/admin/jobguard/"):
        response = viewer.get(page)
        assert response.status_code == 200
        assert f'href="{URL}"' in response.content.decode(), page
        assert ">Queues<" in response.content.decode()


def test_the_page_shows_each_queues_figures_and_state(viewer):
    scenario()
    queues.pause("emails", actor="shell:ops", reason="provider down")
    response = viewer.get(URL)
    html = response.content.decode()
    assert response.status_code == 200
    assert cells(html, "default") == {
        "depth": "1",
        "scheduled": "2",
        "retrying": "1",
        "in-flight": "0",
        "stuck": "0",
        "oldest": "0",
        "dead": "0",
        "approvals": "0",
        "succeeded": "0",
        "failed": "0",
    }
    assert cells(html, "emails")["dead"] == "1" and cells(html, "emails")["approvals"] == "1"
    emails = re.search(r'<tr id="queue-emails".*?</tr>', html, re.S).group(0)
    assert "paused" in emails and "provider down" in emails and "shell:ops" in emails
    assert '<meta http-equiv="refresh" content="15">' in html
    assert html.count('<svg class="jobguard-chart') == len(health.SERIES)
    content = html[html.index('<div id="content-main" class="jobguard-health">') :]
    assert "<script" not in content.split("<!-- END Content -->")[0]  # the page needs no JavaScript
    # A viewer sees no buttons: pausing needs jobguard.pause_queue.
    assert 'name="pause"' not in html and 'name="resume"' not in html


def test_the_charts_plot_the_last_hours_outcomes(viewer):
    scenario()
    report = health.queue_health()
    assert len(report.minutes) == health.CHART_MINUTES
    assert report.series["succeeded"][-1] == 1.0
    assert report.series["failed"][-1] == 3.0 and report.series["retried"][-1] == 2.0
    assert report.series["oldest_age_seconds"][-1] == 42
    assert report.series["oldest_age_seconds"][0] is None
    only_default = health.queue_health(queue="default")
    assert only_default.series["failed"][-1] == 0.0 and only_default.series["succeeded"][-1] == 0.0
    html = viewer.get(URL).content.decode()
    assert ": 3 attempts</title>" in html  # a bar's tooltip


def test_the_page_costs_the_same_queries_empty_or_busy(viewer):
    viewer.get(URL)  # session and permission caches warm alike for both runs
    with CaptureQueriesContext(connection) as empty:
        viewer.get(URL)
    scenario()
    queues.pause("emails", actor="x", reason="why")
    for n in range(30):
        tasks.add.using(queue_name=f"q{n % 5}").enqueue(n)
    with CaptureQueriesContext(connection) as busy:
        viewer.get(URL)
    assert len(empty.captured_queries) == len(busy.captured_queries)
    ours = [q for q in busy.captured_queries if "jobguard_" in q["sql"]]
    # The health figures, the pause states, the one read for contended locks (none here, so
    # no lock rows are read; no limit is declared, so no flow reads) and the recent audit events.
    assert len(ours) == health.BASE_QUERIES + 1 + 1 + 1


def test_an_operator_pauses_and_resumes_with_the_buttons(operator):
    html = operator.get(URL).content.decode()
    assert 'name="pause"' in html
    response = operator.post(
        reverse("admin:jobguard_queuestate_pause"), {"queue": "default", "reason": "db slow"}
    )
    assert response.status_code == 302
    assert queues.paused_queues() == {"default"}
    event = QueueEvent.objects.get()
    assert (event.action, event.actor_name, event.reason) == ("paused", "operator", "db slow")
    html = operator.get(URL).content.decode()
    assert "Queue &#x27;default&#x27; paused." in html and 'name="resume"' in html
    operator.post(reverse("admin:jobguard_queuestate_resume"), {"queue": "default"})
    assert queues.paused_queues() == set()
    # Django's own admin log has both, for the queue's History and Recent actions.
    entries = LogEntry.objects.filter(object_id="default").order_by("pk")
    assert [e.change_message for e in entries] == ["Paused: db slow", "Resumed."]
    assert {e.user.get_username() for e in entries} == {"operator"}


def test_a_pause_without_a_reason_says_so_and_writes_nothing(operator):
    response = operator.post(
        reverse("admin:jobguard_queuestate_pause"), {"queue": "default", "reason": ""}, follow=True
    )
    assert "A reason is required to pause a queue" in response.content.decode()
    assert not QueueState.objects.exists()


def test_pausing_without_the_permission_is_refused_server_side(viewer):
    response = viewer.post(reverse("admin:jobguard_queuestate_pause"), {"queue": "default", "reason": "x"})
    assert response.status_code == 403
    assert "needs the &#x27;jobguard.pause_queue&#x27; permission" in response.content.decode()
    assert not QueueState.objects.exists()
    assert viewer.get(reverse("admin:jobguard_queuestate_pause")).status_code == 405


def test_a_staff_user_without_job_permissions_cannot_see_the_page(client):
    force_login(client, "nobody")
    response = client.get(URL)
    assert response.status_code == 403


def test_a_beat_writes_the_per_minute_counts_the_charts_read():
    beats._take_pending()  # counts left by earlier tests in this process
    beats.count("default", "failed")
    beats.count("default", "failed")
    beats.count("default", "retried")
    beat = beats.Beat(worker_id="w1", alias="default", queues=None, concurrency=2, pid=123)
    beat.beat(jobs_in_hand=1)
    beats.count("default", "failed")
    beat.flush()
    row = QueueMinute.objects.get(queue_name="default")
    assert (row.failed, row.retried, row.succeeded) == (3, 1, 0)
    tasks.add.enqueue(1)
    beat.sample_oldest_ages()
    row.refresh_from_db()
    assert row.oldest_age_seconds is not None and row.oldest_age_seconds >= 0


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("truncated_after")  # committed, then truncated: no million dead rows left
def test_a_million_finished_rows_cost_the_same_queries_and_the_buckets_use_the_finished_index(viewer):
    scenario()
    viewer.get(URL)
    with CaptureQueriesContext(connection) as small:
        viewer.get(URL)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, attempts, "
            "max_attempts, visibility_timeout, worker_id, started_at, finished_at, last_error, "
            "reappearances, lock_contentions, lock_key, handler_version, checkpoints) "
            "SELECT 'tests.testapp.tasks.add', 'default', '[]', '{}', 0, "
            "CASE WHEN n % 10 = 0 THEN 'dead' ELSE 'succeeded' END, 1, 5, 60, 'w', "
            "now() - (n || ' seconds')::interval, now() - (n || ' seconds')::interval, "
            "'', 0, 0, '', '', '{}' "
            "FROM generate_series(1, 1000000) AS n"
        )
        cursor.execute("ANALYZE jobguard_job")
    with CaptureQueriesContext(connection) as big:
        response = viewer.get(URL)
    assert response.status_code == 200
    assert len(big.captured_queries) == len(small.captured_queries)
    buckets = next(q["sql"] for q in big.captured_queries if "DATE_TRUNC" in q["sql"].upper())
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + buckets)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "jobguard_job_finished_idx" in plan, plan
    report = health.queue_health()
    assert sum(report.series["succeeded"]) >= 3000  # one job a second for the last hour, 9 in 10


def test_with_every_worker_dead_the_page_says_so_and_shows_the_stuck_jobs(viewer):
    from django_jobguard.models import WorkerBeat

    job = tasks.add.enqueue(1)
    # Claimed by a worker that then died: its lease ran out and nobody reaped it.
    Job.objects.filter(pk=job.pk).update(
        status="running",
        worker_id="gone",
        lease_token="0" * 32,
        lease_expires_at=timezone.now() - datetime.timedelta(minutes=5),
    )
    WorkerBeat.objects.create(
        worker_id="gone",
        host="h",
        pid=1,
        queues="default",
        concurrency=1,
        started_at=timezone.now() - datetime.timedelta(hours=1),
        last_beat_at=timezone.now() - datetime.timedelta(minutes=10),
    )
    html = viewer.get(URL).content.decode()
    row = re.search(r'<tr id="queue-default".*?</tr>', html, re.S).group(0)
    assert "no live worker" in row
    assert re.search(
        r'class="num stuck minor alarm" data-count="stuck"><a href="[^"]*state=stuck">1</a><', row
    ), row
    assert "accepting" in row and ">running<" not in row
    # A live worker serving every queue ("*") counts for this one.
    WorkerBeat.objects.create(
        worker_id="alive",
        host="h",
        pid=2,
        queues="*",
        concurrency=1,
        started_at=timezone.now(),
        last_beat_at=timezone.now(),
    )
    row = re.search(r'<tr id="queue-default".*?</tr>', viewer.get(URL).content.decode(), re.S).group(0)
    assert "no live worker" not in row and re.search(r'class="num workers minor">1<', row), row
