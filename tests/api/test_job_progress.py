"""Reported progress in the API: ``GET jobs/{id}/`` and a workflow's members; the message only
with ``jobguard.view_payload``."""

from __future__ import annotations

import pytest

from django_jobguard import group
from django_jobguard.models import Job
from tests.api.support import BASE, as_user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

REPORT = {"done": 3, "total": 4.5, "message": "order 7 of ada@example.com", "at": "2026-12-07T11:00:00+00:00"}


def test_a_job_shows_its_last_report_with_the_message_for_payload_readers():
    job = tasks.counts_with_progress.enqueue()
    Job.objects.filter(pk=job.pk).update(progress=REPORT)
    reader, _ = as_user("payload-reader", "view_job", "view_payload")
    body = reader.get(f"{BASE}jobs/{job.pk}/").json()
    assert body["progress"] == {
        "done": 3,  # an integer stays one
        "total": 4.5,
        "message": "order 7 of ada@example.com",
        "at": "2026-12-07T11:00:00+00:00",
    }


def test_without_view_payload_the_report_has_no_message():
    job = tasks.counts_with_progress.enqueue()
    Job.objects.filter(pk=job.pk).update(progress=REPORT)
    viewer, _ = as_user("viewer", "view_job")
    body = viewer.get(f"{BASE}jobs/{job.pk}/").json()
    assert body["progress"] == {"done": 3, "total": 4.5, "at": "2026-12-07T11:00:00+00:00"}
    listed = viewer.get(f"{BASE}jobs/").json()["results"][0]
    assert listed["progress"] == body["progress"]


@pytest.mark.parametrize("stored", [None, {"done": "lots"}, [1, 2], {"total": 4}])
def test_a_job_without_a_readable_report_shows_null(stored):
    job = tasks.counts_with_progress.enqueue()
    Job.objects.filter(pk=job.pk).update(progress=stored)
    viewer, _ = as_user("viewer", "view_job")
    assert viewer.get(f"{BASE}jobs/{job.pk}/").json()["progress"] is None


def test_a_workflows_members_show_their_progress():
    workflow = group(
        [tasks.counts_with_progress.s(total=10), tasks.counts_with_progress.s(total=20)]
    ).enqueue()
    first, _ = Job.objects.filter(workflow_id=workflow.id).order_by("pk")
    Job.objects.filter(pk=first.pk).update(progress=REPORT)
    viewer, _ = as_user("viewer", "view_job")
    members = viewer.get(f"{BASE}workflows/{workflow.id}/").json()["members"]
    assert [member["progress"] for member in members] == [
        {"done": 3, "total": 4.5, "at": "2026-12-07T11:00:00+00:00"},
        None,
    ]


def test_the_openapi_document_describes_the_report_and_marks_its_message_optional():
    from django_jobguard.api.schema import build_schema

    schemas = build_schema()["components"]["schemas"]
    report = schemas["JobProgress"]
    assert report["properties"]["done"]["type"] == "number"
    assert set(report["required"]) == {"done", "total", "at"}  # the message needs view_payload
    assert "jobguard.view_payload" in report["properties"]["message"]["description"]
    assert "progress" in schemas["Job"]["properties"]
