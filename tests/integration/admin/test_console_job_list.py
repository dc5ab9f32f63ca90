"""The job list's "enqueued" filter: recent windows read off an index, where the date hierarchy
it replaced listed its years and days with a DISTINCT over every row on each page load."""

import datetime
import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard.admin.base import format_time
from django_jobguard.admin.jobs import JobAdmin
from django_jobguard.models import Job
from tests.support.factories import force_login
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

URL = "/admin/jobguard/job/"


@pytest.fixture
def viewer(client):
    force_login(client, "viewer", "view_job")
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
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("truncated_after")  # committed, then truncated: no million dead rows left
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


def _facet(html, label):
    """The count *Show counts* puts after a filter option, as shown ("2", "3+")."""
    found = re.search(re.escape(label) + r" \(([\d,]+\+?)\)</a>", html)
    return found.group(1) if found else None


def test_show_counts_are_exact_below_the_cap(viewer):
    for n in range(2):
        tasks.add.enqueue(n)
    dead = tasks.add.using(queue_name="slow").enqueue(9)
    Job.objects.filter(pk=dead.pk).update(status="dead")
    html = viewer.get(URL, {"_facets": ""}).content.decode()
    assert (_facet(html, "due"), _facet(html, "dead"), _facet(html, "running")) == ("2", "1", "0")
    assert _facet(html, "slow") == "1" and _facet(html, "in the last hour") == "3"
    assert 'id="facets-capped"' not in html
    # Each filter counts what the others match.
    html = viewer.get(URL, {"_facets": "", "queue_name": "slow"}).content.decode()
    assert (_facet(html, "due"), _facet(html, "dead")) == ("0", "1")


def test_show_counts_stop_at_the_cap_like_the_count(viewer, monkeypatch):
    from django_jobguard.admin import jobs as job_admin

    monkeypatch.setattr(job_admin, "COUNT_CAP", 3)
    made = [tasks.add.enqueue(n) for n in range(6)]
    Job.objects.filter(pk=made[-1].pk).update(status="dead")
    with CaptureQueriesContext(connection) as queries:
        html = viewer.get(URL, {"_facets": ""}).content.decode()
    # Among the 3 newest jobs: 2 due and the dead one; "+" says there may be more.
    assert (_facet(html, "due"), _facet(html, "dead"), _facet(html, "cancelled")) == ("2+", "1+", "0+")
    assert 'id="facets-capped"' in html and "Counts marked + are counted among the newest 3 jobs" in html
    # Every count over the jobs is bounded: by the cap's LIMIT or by the id of its last row.
    jobs_sql = [
        q["sql"]
        for q in queries.captured_queries
        if "COUNT(" in q["sql"].upper() and ('"jobguard_job"' in q["sql"] or "`jobguard_job`" in q["sql"])
    ]
    assert len(jobs_sql) == 1 + 4  # the list's count, and one per filter
    unbounded = [
        sql for sql in jobs_sql if "LIMIT" not in sql.upper() and '"id" >' not in sql and "`id` >" not in sql
    ]
    assert not unbounded, unbounded


def test_the_search_bar_says_more_than_the_cap_not_the_capped_count(viewer, monkeypatch):
    from django_jobguard.admin import jobs as job_admin

    monkeypatch.setattr(job_admin, "COUNT_CAP", 3)
    for n in range(5):
        tasks.add.enqueue(n)
    Job.objects.update(lock_key="shared")
    html = viewer.get(URL, {"q": "shared"}).content.decode()
    counted = re.search(r'id="search-result-count">([^(]*)\(', html).group(1).strip()
    assert counted == "more than 3 results"
    html = viewer.get(URL, {"q": "nothing-like-it"}).content.decode()
    assert re.search(r'id="search-result-count">([^(]*)\(', html).group(1).strip() == "0 results"


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("truncated_after")  # committed, then truncated: no million dead rows left
def test_show_counts_at_a_million_jobs_read_no_more_than_the_cap(viewer):
    tasks.add.enqueue(1)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, attempts, "
            "max_attempts, visibility_timeout, worker_id, enqueued_at, started_at, finished_at, "
            "last_error, reappearances, lock_contentions, lock_key, handler_version, checkpoints) "
            "SELECT 'tests.testapp.tasks.add', 'default', '[]', '{}', 0, "
            "CASE WHEN n % 10 = 0 THEN 'dead' ELSE 'succeeded' END, 1, 5, 60, 'w', "
            "now() - (n || ' seconds')::interval, now() - (n || ' seconds')::interval, "
            "now() - (n || ' seconds')::interval, '', 0, 0, '', '', '{}' "
            "FROM generate_series(1, 1000000) AS n"
        )
        cursor.execute("ANALYZE jobguard_job")
    with CaptureQueriesContext(connection) as page:
        response = viewer.get(URL, {"_facets": ""})
    html = response.content.decode()
    assert 'id="facets-capped"' in html and _facet(html, "dead").endswith("+")
    counts = [
        q["sql"] for q in page.captured_queries if "COUNT(" in q["sql"].upper() and "jobguard_job" in q["sql"]
    ]
    plans = []
    with connection.cursor() as cursor:
        for sql in counts:
            cursor.execute("EXPLAIN " + sql)
            plans.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
    assert not [plan for plan in plans if "Seq Scan on jobguard_job" in plan[1]], plans


# -- the job's page and the list say what happened, once -------------------------------------------


def test_a_claim_handed_back_for_its_lock_shows_no_start_beside_zero_attempts(viewer):
    from django_jobguard import store

    job = tasks.add.enqueue(1)
    [claimed] = store.claim("default", None, 1, "w-1")
    assert store.requeue(
        "default", claimed.id, claimed.lease_token, delay=0, error=None, refund_attempt=True, contention=True
    )
    row = Job.objects.get(pk=job.pk)
    # The store gives the refunded claim's start back: none, before a first attempt.
    assert (row.attempts, row.lock_contentions, row.started_at) == (0, 1, None)
    listing = viewer.get(URL).content.decode()
    cell = re.search(r'<td class="field-attempt_started_at[^"]*">(.*?)</td>', listing).group(1)
    assert cell.endswith(">-</span>") and "handed back without an attempt: its lock was held" in cell
    page = viewer.get(f"{URL}{job.pk}/change/").content.decode()
    assert "handed back without an attempt" in page
    # Claimed again and run: the start is the attempt's.
    assert len(store.claim("default", None, 1, "w-1")) == 1
    row = Job.objects.get(pk=job.pk)
    listing = viewer.get(URL).content.decode()
    cell = re.search(r'<td class="field-attempt_started_at[^"]*">(.*?)</td>', listing).group(1)
    assert row.attempts == 1 and cell == format_time(row.started_at)


def test_the_jobs_page_shows_its_state_once(viewer):
    job = tasks.add.enqueue(1)
    page = viewer.get(f"{URL}{job.pk}/change/").content.decode()
    assert page.count("<label>State:</label>") == 1
    assert "<label>Status:</label>" not in page


def test_an_action_that_changed_nothing_says_so_in_a_warning_not_a_success(client):
    force_login(client, "ops", "view_job", "retry_job", "cancel_job")
    due = tasks.add.enqueue(1)  # due already: "retry now" has nothing to do
    for action in ("retry_jobs_now", "requeue_cancelled_jobs"):
        response = client.post(
            URL, {"action": action, "_selected_action": [due.pk], "confirm": "yes"}, follow=True
        )
        boxes = re.findall(r'<li class="(\w+)">([^<]*)</li>', response.content.decode())
        assert boxes and all(level == "warning" for level, _text in boxes), (action, boxes)
    done = client.post(
        URL, {"action": "cancel_jobs", "_selected_action": [due.pk], "confirm": "yes"}, follow=True
    )
    assert '<li class="success">1 job cancelled.</li>' in done.content.decode()
