"""Reported progress in the console: the job's page (the message only with view_payload) and
each member's progress on its workflow's page."""

import pytest
from django.urls import reverse

from django_jobguard import group
from django_jobguard.models import Job
from tests.support.factories import force_login
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

REPORT = {"done": 30, "total": 120, "message": "customer ada@example.com", "at": "2026-12-07T11:00:00+00:00"}


def job_page(client, job) -> str:
    response = client.get(reverse("admin:jobguard_job_change", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_job_page_shows_the_reported_progress_and_its_message_with_view_payload(client):
    job = tasks.counts_with_progress.enqueue()
    Job.objects.filter(pk=job.pk).update(progress=REPORT)
    force_login(client, "reader", "view_job", "view_payload")
    html = job_page(client, job)
    assert '<progress value="30" max="120">25%</progress> 30 / 120 (25%)' in html
    assert "reported 2026-12-07 11:00:00 UTC" in html
    assert "customer ada@example.com" in html


def test_without_view_payload_the_job_page_shows_the_bar_but_not_the_message(client):
    job = tasks.counts_with_progress.enqueue()
    Job.objects.filter(pk=job.pk).update(progress=REPORT)
    force_login(client, "viewer", "view_job")
    html = job_page(client, job)
    assert "30 / 120 (25%)" in html
    assert "ada@example.com" not in html
    assert "progress message" not in html


def test_a_job_that_reported_nothing_shows_a_dash(client):
    job = tasks.add.enqueue(1)
    force_login(client, "viewer", "view_job")
    html = job_page(client, job)
    assert "<progress" not in html


def test_the_workflow_page_shows_each_members_progress_without_messages(client):
    workflow = group(
        [tasks.counts_with_progress.s(total=10), tasks.counts_with_progress.s(total=20)]
    ).enqueue()
    first, _ = Job.objects.filter(workflow_id=workflow.id).order_by("pk")
    Job.objects.filter(pk=first.pk).update(progress=REPORT)
    force_login(client, "viewer", "view_job", "view_payload")
    response = client.get(reverse("admin:jobguard_workflow_change", args=[workflow.id]))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('class="member-progress"') == 2
    assert "30 / 120 (25%)" in html
    assert "ada@example.com" not in html  # a member's message is on its own page
