"""The job list an operator can read: state badges, state filters, short columns, bounded queries."""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_jobguard.admin.jobs import JobAdmin
from django_jobguard.models import Job
from tests.support.factories import JOB_STATES, force_login, make_job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

URL = "/admin/jobguard/job/"


@pytest.fixture
def viewer(client):
    force_login(client, "viewer", "view_job")
    return client


def one_of_each():
    """A job in each state an operator tells apart; their ids by state."""
    made = {state: make_job(state) for state in JOB_STATES}
    Job.objects.filter(pk=made["retrying"].pk).update(last_error="Timeout: slow")
    Job.objects.filter(pk=made["dead"].pk).update(last_error="ValueError: order 7 has no lines\nTraceback...")
    return {state: job.pk for state, job in made.items()}


def listed_ids(html):
    return {int(n) for n in re.findall(r'<a href="/admin/jobguard/job/(\d+)/change/', html)}


def test_each_job_shows_its_state_badge(viewer):
    ids = one_of_each()
    html = viewer.get(URL).content.decode()
    for state, pk in ids.items():
        row = re.search(rf"<tr>.*?/admin/jobguard/job/{pk}/change/.*?</tr>", html, re.S).group(0)
        assert f"state-{state}" in row, state
    assert "lease expired (stuck)" in html and "waiting for retry" in html


@pytest.mark.parametrize(
    "state", ["due", "scheduled", "retrying", "running", "stuck", "succeeded", "dead", "cancelled"]
)
def test_the_state_filter_lists_the_jobs_of_that_state(viewer, state):
    ids = one_of_each()
    response = viewer.get(URL, {"state": state})
    assert response.status_code == 200
    expected = {ids[state]} | ({ids["retrying"]} if state == "scheduled" else set())
    assert listed_ids(response.content.decode()) == expected


def test_the_columns_an_operator_reads_without_the_payload(viewer):
    ids = one_of_each()
    html = viewer.get(URL).content.decode()
    headers = re.findall(r'<th scope="col"[^>]*>.*?<(?:a|span)[^>]*>([^<]+)<', html, re.S)
    assert [h.strip() for h in headers][1:] == [
        "Id",
        "State",
        "Task",
        "Queue",
        "Attempts",
        "Worker",
        "Started at",
        "Lease expires at",
    ]
    # An error message often echoes the payload: it needs view_payload, like the payload.
    assert "order 7 has no lines" not in html
    assert "host-a:4242:abcdef" in html
    Permission.objects.get(codename="view_payload").user_set.add(User.objects.get(username="viewer"))
    html = viewer.get(URL).content.decode()
    headers = re.findall(r'<th scope="col"[^>]*>.*?<(?:a|span)[^>]*>([^<]+)<', html, re.S)
    assert [h.strip() for h in headers][-1] == "Last error"
    assert (
        "ValueError: order 7 has no lines" in html
        and "Traceback..." not in html.split("<tbody>")[1].split('title="')[0]
    )
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", html)  # seconds and zone
    del ids


def test_the_list_costs_the_same_queries_for_few_or_many_jobs(viewer):
    one_of_each()
    viewer.get(URL)
    with CaptureQueriesContext(connection) as few:
        viewer.get(URL)
    for n in range(60):
        tasks.add.using(queue_name=f"q{n % 3}").enqueue(n)
    with CaptureQueriesContext(connection) as many:
        viewer.get(URL, {"state": "due"})
    assert len(many.captured_queries) == len(few.captured_queries)
    # Quoted the database's way ("..." or `...` on MariaDB/MySQL).
    job, id_, queue, task = (
        connection.ops.quote_name(name) for name in ("jobguard_job", "id", "queue_name", "task_name")
    )
    listing = [q["sql"] for q in many.captured_queries if f"ORDER BY {job}.{id_} DESC" in q["sql"]]
    assert listing, [q["sql"] for q in many.captured_queries]
    assert all("kwargs" not in sql for sql in listing)  # the payload is not read for the list
    assert JobAdmin.show_full_result_count is False
    # The queue and task filters list the configured names, not a DISTINCT over every row.
    assert not [q for q in many.captured_queries if f"DISTINCT {job}.{queue}" in q["sql"]]
    assert not [q for q in many.captured_queries if f"DISTINCT {job}.{task}" in q["sql"]]


def test_an_unknown_lookup_is_still_refused_and_the_lock_link_still_works(viewer):
    one_of_each()
    assert viewer.get(URL, {"kwargs__a": "1"}).status_code == 400
    assert viewer.get(URL, {"status__exact": "running", "worker_id": "host-a:4242:abcdef"}).status_code == 200
