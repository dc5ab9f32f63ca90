"""Every job state renders everywhere it can appear: the admin's job list, its state filter and a
job's page, for a superuser and for a viewer without ``view_payload``. A job waiting in a workflow
was once a ``KeyError: 'waiting'`` (a 500 for everyone) on the list and the job's page.

The mappings keyed by status are checked against :class:`JobStatus` itself, so a status added
later cannot be forgotten in one of them."""

import datetime
import re

import pytest
from django.test import Client
from django.utils import timezone

from django_jobguard import chain
from django_jobguard.admin import jobs as job_admin
from django_jobguard.models import IdempotencyStatus, Job, JobStatus
from django_jobguard.monitoring import audit
from tests.support.factories import JOB_STATES, make_job, make_superuser, make_user
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

URL = "/admin/jobguard/job/"


def test_every_status_has_a_state_with_a_label_badge_and_filter():
    states = {key for key, _label in job_admin.STATES}
    assert set(job_admin._BADGE_COLOURS) == states
    assert set(job_admin._STATE_LABELS) == states
    now = timezone.now()
    hour = datetime.timedelta(hours=1)
    for status in JobStatus:
        # Queued splits by due / scheduled / retrying, running by its lease: each way, a state.
        for run_after, lease in ((now, now), (now + hour, now - hour)):
            job = Job(status=status, run_after=run_after, lease_expires_at=lease)
            assert job_admin.job_state(job, now) in states, status


def test_every_status_maps_to_an_idempotency_key_status():
    assert set(audit._KEY_STATUS_FOR_JOB) == set(JobStatus)
    assert audit._KEY_STATUS_FOR_JOB[JobStatus.WAITING] == IdempotencyStatus.IN_PROGRESS


def test_every_status_maps_to_a_django_task_result_status():
    backend = pytest.importorskip("django_jobguard.backends.backend")
    assert set(backend.STATUS_MAP) == set(JobStatus)


@pytest.fixture
def one_job_in_each_state() -> dict[str, Job]:
    """A job in each state of the admin's filter, and so in each status."""
    workflow = chain(tasks.wf_step.s("first"), tasks.wf_step.s("second")).enqueue()
    # The workflow's first step (not one of these) would be due: it has succeeded.
    Job.objects.filter(pk=workflow.jobs[0].pk).update(status=JobStatus.SUCCEEDED, finished_at=timezone.now())
    fresh = {"waiting": Job.objects.get(pk=workflow.jobs[1].pk)}
    for n, state in enumerate(JOB_STATES, start=1):
        fresh[state] = make_job(state, n, n)
    assert {job.status for job in fresh.values()} == set(JobStatus)
    return fresh


def listed_ids(html: str) -> set[int]:
    return {int(n) for n in re.findall(r'<a href="/admin/jobguard/job/(\d+)/change/', html)}


@pytest.mark.parametrize("who", ["superuser", "viewer"])
def test_the_job_list_filters_and_pages_render_a_job_in_each_state(one_job_in_each_state, who):
    client = Client()
    if who == "superuser":
        client.force_login(make_superuser())
    else:
        client.force_login(make_user("viewer", "view_job"))
    listing = client.get(URL)
    assert listing.status_code == 200
    html = listing.content.decode()
    for state, job in one_job_in_each_state.items():
        assert job.pk in listed_ids(html), state
        assert f"state-{state}" in html, state
        filtered = client.get(URL, {"state": state})
        assert filtered.status_code == 200, state
        expected = {job.pk}
        if state == "scheduled":  # a retry is scheduled too
            expected.add(one_job_in_each_state["retrying"].pk)
        made = {other.pk for other in one_job_in_each_state.values()}
        assert listed_ids(filtered.content.decode()) & made == expected, state
        page = client.get(f"{URL}{job.pk}/change/")
        assert page.status_code == 200, state
        assert f"state-{state}" in page.content.decode(), state
    # The waiting job reads as waiting on its dependencies.
    assert "waiting for dependencies" in html


def test_the_cancel_confirmation_counts_waiting_jobs_with_the_queued(one_job_in_each_state):
    client = Client()
    client.force_login(make_superuser())
    ids = [one_job_in_each_state[state].pk for state in ("waiting", "due", "running")]
    response = client.post(URL, {"action": "cancel_jobs", "_selected_action": ids})
    assert response.status_code == 200
    text = re.sub(r"\s+", " ", response.content.decode())
    assert "Cancel 3 jobs?" in text
    assert "2 queued or waiting are cancelled at once; 1 running are asked to stop" in text
