"""jobs/, jobs/{id}/, cancel/, retry/ and queues/: allowed and denied users; nothing changes when denied."""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobguard.models import Job
from tests.api.support import BASE, as_user, client_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def snapshot() -> list[tuple]:
    return list(Job.objects.order_by("id").values_list("id", "status", "run_after", "last_error"))


def test_the_list_is_newest_first_with_cursor_links_and_filters():
    client, _ = as_user("reader", "view_job")
    made = [tasks.api_add.enqueue(n) for n in range(5)]
    tasks.api_add.using(idempotency_key="k-1").enqueue(9)
    page = client.get(BASE + "jobs/", {"page_size": 2}).json()
    assert [job["id"] for job in page["results"]] == [made[-1].pk + 1, made[-1].pk]
    assert "cursor=" in page["next"] and page["previous"] is None
    second = client.get(page["next"]).json()
    assert [job["id"] for job in second["results"]] == [made[3].pk, made[2].pk]
    assert "cursor=" in second["previous"]

    # Keys are made of arguments: neither shown nor filtered by without view_payload.
    assert "idempotency_key" not in page["results"][0]
    assert client.get(BASE + "jobs/", {"idempotency_key": "k-1"}).status_code == 403
    payload_reader, _ = as_user("payload-reader", "view_job", "view_payload")
    only_keyed = payload_reader.get(BASE + "jobs/", {"idempotency_key": "k-1"}).json()["results"]
    assert [job["idempotency_key"] for job in only_keyed] == ["k-1"]
    tasks.add.enqueue(1)
    by_task = client.get(BASE + "jobs/", {"task_name": "tests.testapp.tasks.add"}).json()["results"]
    assert len(by_task) == 1
    Job.objects.filter(pk=made[0].pk).update(status="cancelled")
    cancelled = client.get(BASE + "jobs/", {"status": "cancelled"}).json()["results"]
    assert [job["id"] for job in cancelled] == [made[0].pk]
    assert client.get(BASE + "jobs/", {"queue_name": "nope"}).json()["results"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [({"status": "lost"}, "status"), ({"page_size": "0"}, "page_size"), ({"cursor": "zz"}, "cursor")],
)
def test_a_bad_filter_is_400_naming_it(params, field):
    client, _ = as_user("reader", "view_job")
    response = client.get(BASE + "jobs/", params)
    assert response.status_code == 400
    assert field in response.json()["errors"]


def test_payloads_show_only_with_view_payload_in_list_and_detail():
    job = tasks.api_add.enqueue(3, b=4)
    Job.objects.filter(pk=job.pk).update(result=7)
    plain, _ = as_user("reader", "view_job")
    full, _ = as_user("auditor", "view_job", "view_payload")
    for client, shown in ((plain, False), (full, True)):
        listed = client.get(BASE + "jobs/").json()["results"][0]
        detail = client.get(f"{BASE}jobs/{job.pk}/").json()
        for body in (listed, detail):
            assert body["task_name"] == tasks.api_add.name
            assert ("args" in body, "kwargs" in body, "result" in body) == (shown, shown, shown)
        if shown:
            assert (detail["args"], detail["kwargs"], detail["result"]) == ([3], {"b": 4}, 7)


@pytest.mark.parametrize("codenames", [(), ("view_deadletter",)])
def test_reading_jobs_without_view_job_is_403(codenames):
    job = tasks.api_add.enqueue(1)
    client, _ = as_user("nobody", *codenames)
    for url in ("jobs/", f"jobs/{job.pk}/", "queues/"):
        assert client.get(BASE + url).status_code == 403, url
    anonymous = client_for(None)
    assert anonymous.get(BASE + "jobs/").status_code in (401, 403)


def test_a_missing_job_is_404():
    client, _ = as_user("reader", "view_job")
    response = client.get(BASE + "jobs/999999/")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize("page_size", [5, 40])
def test_a_list_page_costs_the_same_queries_whatever_its_size(page_size):
    client, _ = as_user("auditor", "view_job", "view_payload")
    for n in range(45):
        tasks.api_add.enqueue(n)
    client.get(BASE + "jobs/")  # the user's permissions are cached on the user from here on
    with CaptureQueriesContext(connection) as queries:
        response = client.get(BASE + "jobs/", {"page_size": page_size})
    assert len(response.json()["results"]) == page_size
    # Authentication is forced, so these are the page's own: one SELECT of the jobs (the
    # permission checks hit the user's cache). Two page sizes, one count: no N+1.
    table = connection.ops.quote_name("jobguard_job")  # "..." or `...` on MariaDB/MySQL
    job_selects = [q["sql"] for q in queries.captured_queries if table in q["sql"]]
    assert len(job_selects) == 1, job_selects
    assert len(queries.captured_queries) == _queries_at_page_size(client, 5)


def _queries_at_page_size(client, size: int) -> int:
    with CaptureQueriesContext(connection) as queries:
        client.get(BASE + "jobs/", {"page_size": size})
    return len(queries.captured_queries)


def test_cancel_a_queued_job():
    job = tasks.api_add.enqueue(1)
    client, _ = as_user("operator", "view_job", "cancel_job")
    response = client.post(f"{BASE}jobs/{job.pk}/cancel/", {"reason": "duplicate order"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    job.refresh_from_db()
    assert (job.status, job.last_error) == ("cancelled", "cancelled: duplicate order")


def test_cancel_of_a_finished_job_is_409_and_changes_nothing():
    job = tasks.api_add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(status="succeeded", finished_at=timezone.now())
    client, _ = as_user("operator", "view_job", "cancel_job")
    before = snapshot()
    response = client.post(f"{BASE}jobs/{job.pk}/cancel/", format="json")
    assert response.status_code == 409
    assert "succeeded" in response.json()["detail"]
    assert snapshot() == before


@pytest.mark.parametrize("codenames", [(), ("view_job",), ("cancel_job",), ("view_job", "retry_job")])
def test_cancel_without_cancel_job_is_403_and_changes_nothing(codenames):
    job = tasks.api_add.enqueue(1)
    client, _ = as_user("someone", *codenames)
    before = snapshot()
    assert client.post(f"{BASE}jobs/{job.pk}/cancel/", format="json").status_code == 403
    assert client_for(None).post(f"{BASE}jobs/{job.pk}/cancel/", format="json").status_code in (401, 403)
    assert snapshot() == before


def test_retry_makes_a_waiting_job_due_now():
    later = timezone.now() + datetime.timedelta(hours=1)
    job = tasks.api_add.using(run_after=later).enqueue(1)
    client, _ = as_user("operator", "view_job", "retry_job")
    response = client.post(f"{BASE}jobs/{job.pk}/retry/", format="json")
    assert response.status_code == 200, response.content
    job.refresh_from_db()
    assert job.run_after <= timezone.now()
    assert Job.objects.due().filter(pk=job.pk).exists()


def test_retry_of_a_dead_job_is_409_pointing_at_the_replay():
    job = tasks.api_add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(status="dead", finished_at=timezone.now())
    client, _ = as_user("operator", "view_job", "retry_job")
    before = snapshot()
    response = client.post(f"{BASE}jobs/{job.pk}/retry/", format="json")
    assert response.status_code == 409
    assert "dead letter" in response.json()["detail"]
    assert snapshot() == before


@pytest.mark.parametrize("codenames", [(), ("view_job",), ("view_job", "cancel_job")])
def test_retry_without_retry_job_is_403_and_changes_nothing(codenames):
    later = timezone.now() + datetime.timedelta(hours=1)
    job = tasks.api_add.using(run_after=later).enqueue(1)
    client, _ = as_user("someone", *codenames)
    before = snapshot()
    assert client.post(f"{BASE}jobs/{job.pk}/retry/", format="json").status_code == 403
    assert snapshot() == before


def test_queues_shows_the_status_figures_per_queue():
    tasks.api_add.enqueue(1)
    tasks.api_add.enqueue(2)
    tasks.api_notify.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1)
    client, _ = as_user("reader", "view_job")
    rows = {row["queue"]: row for row in client.get(BASE + "queues/").json()}
    assert rows["default"]["depth"] == 2 and rows["default"]["scheduled"] == 0
    assert rows["slow"]["scheduled"] == 1 and rows["slow"]["depth"] == 0
    assert set(rows["default"]) >= {"in_flight", "oldest_age_seconds", "dead_letters", "pending_approvals"}


def test_the_schema_needs_an_authenticated_user():
    assert client_for(None).get(BASE + "schema/").status_code in (401, 403)
    client, _ = as_user("someone")
    response = client.get(BASE + "schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response.json()["servers"] == [{"url": "http://testserver/jobguard/api"}]


def test_a_method_an_endpoint_does_not_have_is_405_and_changes_nothing():
    job = tasks.api_add.enqueue(1)
    client, _ = as_user("reader", "view_job")
    before = snapshot()
    assert client.delete(f"{BASE}jobs/{job.pk}/").status_code == 405
    assert client.put(f"{BASE}jobs/{job.pk}/", {}, format="json").status_code == 405
    assert snapshot() == before


def test_the_check_warns_when_exposed_tasks_have_no_rest_framework(settings):
    from django_jobguard.checks.settings import check_api

    assert check_api() == []
    settings.INSTALLED_APPS = [app for app in settings.INSTALLED_APPS if app != "rest_framework"]
    (warning,) = check_api()
    assert warning.id == "jobguard.W040"
    assert "@task(api=True)" in warning.msg and "rest_framework" in warning.hint


def test_any_other_path_under_the_api_is_a_problem_404_with_a_slash_hint():
    client, _ = as_user("reader", "view_job")
    response = client.post(BASE + "jobs", {}, format="json")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"
    assert "Did you mean /jobguard/api/jobs/" in response.json()["detail"]
    response = client.get(BASE + "jobs/not-a-number/")
    assert response.status_code == 404 and "Did you mean" not in response.json()["detail"]


def test_an_id_beyond_the_column_range_is_404_not_a_database_error():
    client, _ = as_user("operator", "view_job", "cancel_job", "view_deadletter")
    huge = 10**30
    for method, path in (
        ("get", f"jobs/{huge}/"),
        ("post", f"jobs/{huge}/cancel/"),
        ("get", f"dead-letters/{huge}/"),
    ):
        response = getattr(client, method)(BASE + path, format="json")
        assert response.status_code == 404, (path, response.content)


def test_operator_writes_are_throttled_at_the_configured_rate(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "API": {"OPERATE_THROTTLE_RATE": "2/minute"}}
    made = [tasks.api_add.enqueue(n) for n in range(3)]
    client, _ = as_user("operator", "view_job", "cancel_job")
    codes = [client.post(f"{BASE}jobs/{job.pk}/cancel/", format="json").status_code for job in made]
    assert codes == [200, 200, 429]
    assert Job.objects.get(pk=made[2].pk).status == "queued"
    response = client.post(f"{BASE}jobs/{made[2].pk}/cancel/", format="json")
    assert response["Content-Type"] == "application/problem+json" and int(response["Retry-After"]) > 0
    # Reads are not throttled.
    assert client.get(f"{BASE}jobs/{made[2].pk}/").status_code == 200
