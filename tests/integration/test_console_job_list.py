"""The job list's "enqueued" filter: recent windows read off an index, where the date hierarchy
it replaced listed its years and days with a DISTINCT over every row on each page load."""

import datetime
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard.admin.jobs import JobAdmin
from django_jobguard.models import Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

URL = "/admin/jobguard/job/"


@pytest.fixture
def viewer(client):
    person = User.objects.create_user("viewer", is_staff=True)
    person.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(person)
    return client


def listed_ids(html):
    return {int(n) for n in re.findall(r'<a href="/admin/jobguard/job/(\d+)/change/', html)}


def test_the_enqueued_filter_lists_the_jobs_of_its_window(viewer):
    recent = tasks.add.enqueue(1)
    old = tasks.add.enqueue(2)
    # enqueued_at is not editable in forms, but an UPDATE may set it: two hours ago.
    Job.objects.filter(pk=old.pk).update(enqueued_at=recent.enqueued_at - datetime.timedelta(hours=2))
    assert JobAdmin.date_hierarchy is None
    html = viewer.get(URL).content.decode()
    assert "in the last 15 minutes" in html and "?enqueued=24h" in html
    assert listed_ids(viewer.get(URL, {"enqueued": "1h"}).content.decode()) == {recent.pk}
    assert listed_ids(viewer.get(URL, {"enqueued": "24h"}).content.decode()) == {recent.pk, old.pk}
    # The date hierarchy's lookups are gone from what the list accepts.
    assert viewer.get(URL, {"enqueued_at__year": "2026"}).status_code == 400


def test_the_count_stops_at_its_cap_and_the_page_says_so(viewer, monkeypatch):
    from django_jobguard.admin import jobs as job_admin

    # Someone who may act on the selection, so the list offers "Select all".
    person = User.objects.get(username="viewer")
    person.user_permissions.add(Permission.objects.get(codename="retry_job"))

    monkeypatch.setattr(job_admin, "COUNT_CAP", 3)
    for n in range(5):
        tasks.add.enqueue(n)
    response = viewer.get(URL)
    html = response.content.decode()
    assert response.context["cl"].result_count == 4  # the cap, plus one to know it was passed
    assert len(listed_ids(html)) == 5  # the page itself lists every job it shows
    assert "More than 3 jobs match" in html
    assert "Select all matching jobs (more than 3)" in html and "Select all 4 jobs" not in html
    assert "More than" not in viewer.get(URL, {"state": "due", "queue_name": "nowhere"}).content.decode()
    assert "more than 3 jobs" in html and "4 jobs" not in html.split('class="paginator"')[1]


def test_older_jobs_past_the_count_cap_are_reached_by_keyset(viewer, monkeypatch):
    from django_jobguard.admin import jobs as job_admin

    monkeypatch.setattr(job_admin, "COUNT_CAP", 3)
    monkeypatch.setattr(job_admin.JobAdmin, "list_per_page", 2)
    made = [tasks.add.enqueue(n).pk for n in range(7)]
    seen: list[int] = []
    url = URL
    for _ in range(10):
        response = viewer.get(url)
        html = response.content.decode()
        older = re.search(r'<a href="(\?[^"]*)" id="older-jobs">', html)
        if older is None:
            # Past the last capped page the count is exact again: page numbers reach the rest.
            cl = response.context["cl"]
            for number in range(cl.paginator.num_pages):
                page = viewer.get(url + ("&" if "?" in url else "?") + f"p={number + 1}")
                seen += sorted(listed_ids(page.content.decode()), reverse=True)
            break
        seen += sorted(listed_ids(html), reverse=True)
        url = URL + older.group(1).replace("&amp;", "&")
    assert seen == sorted(made, reverse=True)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_million_jobs_cost_the_same_queries_and_the_window_reads_the_enqueued_index(viewer):
    tasks.add.enqueue(1)
    viewer.get(URL)
    with CaptureQueriesContext(connection) as small:
        viewer.get(URL, {"enqueued": "1h"})
    with connection.cursor() as cursor:
        # A million finished jobs, one enqueued a second for the last 11.6 days.
        cursor.execute(
            "INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, attempts, "
            "max_attempts, visibility_timeout, worker_id, enqueued_at, started_at, finished_at, "
            "last_error, reappearances, lock_contentions, lock_key, handler_version, checkpoints) "
            "SELECT 'tests.testapp.tasks.add', 'default', '[]', '{}', 0, 'succeeded', 1, 5, 60, 'w', "
            "now() - (n || ' seconds')::interval, now() - (n || ' seconds')::interval, "
            "now() - (n || ' seconds')::interval, '', 0, 0, '', '', '{}' "
            "FROM generate_series(1, 1000000) AS n"
        )
        cursor.execute("ANALYZE jobguard_job")
    plans = []
    for query in ({}, {"enqueued": "1h"}):
        with CaptureQueriesContext(connection) as big:
            response = viewer.get(URL, query)
        assert response.status_code == 200
        assert len(big.captured_queries) == len(small.captured_queries), query
        ours = [q["sql"] for q in big.captured_queries if "jobguard_job" in q["sql"]]
        assert not [sql for sql in ours if "DISTINCT" in sql.upper()], ours  # no date hierarchy lists
        with connection.cursor() as cursor:
            for sql in ours:
                cursor.execute("EXPLAIN " + sql)
                plans.append((query, sql, "\n".join(row[0] for row in cursor.fetchall())))
    assert not [plan for plan in plans if "Seq Scan on jobguard_job" in plan[2]], plans
    assert [plan for plan in plans if plan[0] and "jobguard_job_enqueued_idx" in plan[2]], plans
    # One job a second for the hour before the insert (which was a while ago), and ours.
    assert 3000 < response.context["cl"].result_count <= 3601
    assert "More than 10,000 jobs match" in viewer.get(URL).content.decode()  # not a count of a million
