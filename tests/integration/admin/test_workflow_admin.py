"""The workflow console: a workflow's page in the admin (progress, members), its cancel and
retry buttons guarded as the job admin's are, and a dead member retried through the
dead-letter queue's two-person approval. Django's test client; no browser."""

import pytest
from django.test import Client
from django.urls import reverse

from django_jobguard import Batch, chain, dlq
from django_jobguard.exceptions import ReplayPermissionDenied
from django_jobguard.models import DeadLetter, Job, ReplayState
from django_jobguard.workflows import progress
from tests.integration.workflows.test_workflows import drain, ran, status
from tests.support.factories import make_user
from tests.testapp import tasks
from tests.testapp.models import LedgerEntry

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


def login(name: str, *codenames: str) -> Client:
    client = Client()
    client.force_login(make_user(name, *codenames))
    return client


def page_url(workflow_id: int, action: str = "change") -> str:
    return reverse(f"admin:jobguard_workflow_{action}", args=[workflow_id])


def test_a_workflow_page_lists_its_members_states_and_progress():
    batch = Batch(on_complete=tasks.wf_callback.s("cb")).enqueue(
        [tasks.wf_step.s("m1"), tasks.wf_fails.s("m2"), tasks.wf_step.s("m3")]
    )
    drain()
    viewer = login("viewer", "view_job")
    listing = viewer.get(reverse("admin:jobguard_workflow_changelist"))
    assert listing.status_code == 200
    assert "2 done, 1 failed, 0 pending (of 3)" in listing.content.decode()
    page = viewer.get(page_url(batch.id))
    assert page.status_code == 200
    html = page.content.decode()
    assert '<strong id="progress-done">2</strong>' in html
    assert '<strong id="progress-failed">1</strong>' in html
    assert '<strong id="progress-pending">0</strong>' in html
    members = Job.objects.filter(workflow_id=batch.id).order_by("pk")
    for job in members:
        assert reverse("admin:jobguard_job_change", args=[job.pk]) in html
    assert html.count('class="member"') == 3
    assert 'class="status-dead"' in html and "dead letter" in html
    assert "on_complete" in html  # the callback ran, linked
    # Every member, in the job list (the page lists the first 200).
    every = viewer.get(reverse("admin:jobguard_job_changelist"), {"workflow_id": batch.id})
    assert every.status_code == 200
    assert [job.pk for job in every.context["cl"].result_list] == sorted(
        (job.pk for job in members), reverse=True
    )
    # A viewer gets no button: cancel and retry need their permissions.
    assert 'id="workflow-cancel"' not in html and 'id="workflow-retry-failed"' not in html


def test_the_workflow_pages_need_a_view_permission():
    batch = Batch().enqueue([tasks.wf_step.s("m")])
    nobody = login("nobody")
    assert nobody.get(reverse("admin:jobguard_workflow_changelist")).status_code == 403
    assert nobody.get(page_url(batch.id)).status_code == 403


def test_cancel_needs_the_cancel_permission_and_cancels_pending_members_with_a_reason():
    wf = chain(tasks.wf_step.s("a"), tasks.wf_step.s("b"), tasks.wf_step.s("c")).enqueue()
    viewer = login("viewer", "view_job")
    refused = viewer.post(page_url(wf.pk, "cancel"), {"reason": "withdrawn"})
    assert refused.status_code == 403
    assert "jobguard.cancel_job" in refused.content.decode()
    assert [status(job) for job in wf.jobs] == ["queued", "waiting", "waiting"]

    operator = login("operator", "view_job", "cancel_job")
    html = operator.get(page_url(wf.pk)).content.decode()
    assert 'id="workflow-cancel"' in html
    assert 'id="workflow-retry-failed"' not in html  # nothing failed yet, and no retry permission
    assert operator.post(page_url(wf.pk, "cancel"), {"reason": ""}).status_code == 200  # the form again
    assert [status(job) for job in wf.jobs] == ["queued", "waiting", "waiting"]
    done = operator.post(page_url(wf.pk, "cancel"), {"reason": "order withdrawn"})
    assert done.status_code == 302
    first, second, third = (Job.objects.get(pk=job.pk) for job in wf.jobs)
    assert [first.status, second.status, third.status] == ["cancelled"] * 3
    reason = f"cancelled: workflow #{wf.pk} cancelled: by operator in the admin: order withdrawn"
    assert first.last_error == reason
    drain()
    assert ran("a") == ran("b") == ran("c") == 0
    p = progress(wf.pk)
    assert (p.state, p.failed, p.pending) == ("finished", 3, 0)
    # The page says why each member stopped.
    assert "order withdrawn" in operator.get(page_url(wf.pk)).content.decode()


def test_retrying_a_cancelled_chain_resumes_it_in_order():
    steps = [tasks.wf_step.s("a"), tasks.wf_step.s("b").receives("previous"), tasks.wf_step.s("c")]
    wf = chain(*steps).enqueue()
    operator = login("operator", "view_job", "cancel_job", "retry_job")
    operator.post(page_url(wf.pk, "cancel"), {"reason": "paused for a fix"})
    assert progress(wf.pk).state == "finished"
    html = operator.get(page_url(wf.pk)).content.decode()
    assert 'id="workflow-retry-failed"' in html and 'id="workflow-cancel"' not in html
    assert operator.post(page_url(wf.pk, "retry_failed"), {"reason": "fixed"}).status_code == 302
    assert [status(job) for job in wf.jobs] == ["queued", "waiting", "waiting"]
    assert progress(wf.pk).as_dict() | {"workflow_id": 0} == {
        "workflow_id": 0,
        "state": "closed",
        "total": 3,
        "succeeded": 0,
        "failed": 0,
        "pending": 3,
    }
    drain()
    assert [status(job) for job in wf.jobs] == ["succeeded"] * 3
    assert LedgerEntry.objects.filter(effect_key="b<-a-done").exists()
    p = progress(wf.pk)
    assert (p.state, p.succeeded, p.failed) == ("finished", 3, 0)


def test_retrying_a_dead_member_goes_through_the_replay_approval():
    batch = Batch(on_success=tasks.wf_callback.s("ok")).enqueue(
        [tasks.wf_step.s("m1"), tasks.wf_fails_until_allowed.s("m2")]
    )
    drain()
    assert ran("ok") == 0
    # Re-queuing cancelled jobs is not enough for a dead one: the replay request is refused.
    retrier = login("retrier", "view_job", "retry_job")
    retrier.post(page_url(batch.id, "retry_failed"), {"reason": "try again"})
    letter = DeadLetter.objects.get(job__workflow_id=batch.id)
    assert letter.replay_state == ReplayState.NONE

    no_rights = login("viewer", "view_job")
    assert no_rights.get(page_url(batch.id, "retry_failed")).status_code == 403

    requester = login("rita", "view_job", "request_replay", "approve_replay", "view_deadletter")
    assert requester.post(page_url(batch.id, "retry_failed"), {"reason": "fix deployed"}).status_code == 302
    letter.refresh_from_db()
    assert letter.replay_state == ReplayState.REQUESTED
    drain()
    assert ran("ok") == 0  # requested, not approved: nothing runs
    # The requester may not approve their own request; another user does, as for any dead letter.
    with pytest.raises(ReplayPermissionDenied, match="another user"):
        dlq.approve_replay(letter, letter.replay_requested_by, "self")
    LedgerEntry.objects.create(effect_key="allow:m2")
    dlq.approve_replay(letter, make_user("amir", "approve_replay", "view_deadletter"), "checked")
    drain()
    p = progress(batch.id)
    assert (p.state, p.total, p.succeeded, p.failed) == ("finished", 2, 2, 0)
    assert ran("ok") == 1
    # The page links the dead member and its replay both ways, not two unrelated rows.
    letter.refresh_from_db()
    dead, replay = letter.job_id, letter.replay_job_id
    html = login("watcher", "view_job").get(page_url(batch.id)).content.decode()
    dead_url, replay_url = (reverse("admin:jobguard_job_change", args=[pk]) for pk in (dead, replay))
    assert f'replayed as <a href="{replay_url}">#{replay}</a>' in html
    assert f'replay of <a href="{dead_url}">#{dead}</a>' in html


def gauges() -> dict[tuple[str, str], float]:
    from django_jobguard.monitoring import metrics

    return {
        (family.name, sample.labels["kind"]): sample.value
        for family in metrics.QueueCollector().collect()
        for sample in family.samples
        if family.name.startswith("jobguard_queue_workflow")
    }


def test_the_scrape_reports_open_batches_and_the_oldest_ones_age():
    pytest.importorskip("prometheus_client")
    import datetime

    from django.db.models.functions import Now

    from django_jobguard.models import Workflow

    assert gauges()[("jobguard_queue_workflows_open", "batch")] == 0
    assert gauges()[("jobguard_queue_workflow_oldest_open_age_seconds", "batch")] == 0
    first = Batch().open()
    first.add([tasks.wf_step.s("m1")])
    Batch().enqueue([tasks.wf_step.s("m2")])
    chain(tasks.wf_step.s("c1")).enqueue()
    Workflow.objects.filter(pk=first.id).update(created_at=Now() - datetime.timedelta(minutes=10))
    seen = gauges()
    assert seen[("jobguard_queue_workflows_open", "batch")] == 2
    assert seen[("jobguard_queue_workflows_open", "chain")] == 1
    assert seen[("jobguard_queue_workflows_open", "group")] == 0
    assert 600 <= seen[("jobguard_queue_workflow_oldest_open_age_seconds", "batch")] < 3600
    drain()
    seen = gauges()
    assert seen[("jobguard_queue_workflows_open", "batch")] == 1  # the open one: finished members, not closed
    assert seen[("jobguard_queue_workflows_open", "chain")] == 0
    first.close()
    assert gauges()[("jobguard_queue_workflows_open", "batch")] == 0


def test_a_dependent_cancelled_with_its_parent_says_why_on_its_timeline():
    wf = chain(tasks.wf_step.s("a"), tasks.wf_step.s("b")).enqueue()
    first, second = wf.jobs
    from django_jobguard.operations import jobs

    jobs.cancel([first.pk], reason="order withdrawn")
    viewer = login("viewer", "view_job")
    html = viewer.get(reverse("admin:jobguard_job_change", args=[second.pk])).content.decode()
    assert f"upstream failed: job #{first.pk} was cancelled" in html
    html = viewer.get(reverse("admin:jobguard_job_change", args=[first.pk])).content.decode()
    assert "cancelled: order withdrawn" in html
