"""``GET workflows/{id}/``: a workflow's progress, callbacks and members, for job viewers."""

import pytest

from django_jobguard import Batch
from django_jobguard.models import Job
from tests.api.support import BASE, as_user, client_for
from tests.support.dlq import run_burst
from tests.testapp import tasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


def test_a_workflow_shows_its_progress_callbacks_and_members():
    batch = Batch(on_complete=tasks.add.s(0)).enqueue([tasks.add.s(1), tasks.add.s(2)])
    client, _ = as_user("reader", "view_job")
    body = client.get(f"{BASE}workflows/{batch.id}/").json()
    assert (body["kind"], body["state"], body["total"], body["pending"]) == ("batch", "closed", 2, 2)
    assert [m["status"] for m in body["members"]] == ["queued", "queued"]
    assert body["callbacks"] == []
    for _ in range(5):
        run_burst()
        if not Job.objects.filter(status="queued").exists():
            break
    body = client.get(f"{BASE}workflows/{batch.id}/").json()
    assert (body["state"], body["succeeded"], body["failed"], body["pending"]) == ("finished", 2, 0, 0)
    callback = Job.objects.get(args=[0])
    assert body["callbacks"] == [{"when": "complete", "job_id": callback.pk}]


def test_a_workflow_needs_the_view_job_permission_and_an_existing_id():
    batch = Batch().enqueue([tasks.add.s(1)])
    nobody, _ = as_user("nobody")
    assert nobody.get(f"{BASE}workflows/{batch.id}/").status_code == 403
    assert client_for(None).get(f"{BASE}workflows/{batch.id}/").status_code in (401, 403)
    reader, _ = as_user("reader", "view_job")
    missing = reader.get(f"{BASE}workflows/987654/")
    assert missing.status_code == 404
    assert missing["Content-Type"].startswith("application/problem+json")


def test_cancel_needs_the_cancel_permission_and_cancels_the_pending_members():
    from django_jobguard import chain

    wf = chain(tasks.add.s(1), tasks.add.s(2), tasks.add.s(3)).enqueue()
    reader, _ = as_user("reader", "view_job")
    refused = reader.post(f"{BASE}workflows/{wf.pk}/cancel/", {"reason": "no"}, format="json")
    assert refused.status_code == 403
    statuses = set(Job.objects.filter(workflow_id=wf.pk).values_list("status", flat=True))
    assert statuses == {"queued", "waiting"}
    operator, _ = as_user("operator", "view_job", "cancel_job")
    bad = operator.post(f"{BASE}workflows/{wf.pk}/cancel/", {"reason": ["not", "text"]}, format="json")
    assert bad.status_code == 400 and "reason" in bad.json()["errors"]
    assert operator.post(f"{BASE}workflows/987654/cancel/", {}, format="json").status_code == 404
    body = operator.post(f"{BASE}workflows/{wf.pk}/cancel/", {"reason": "withdrawn"}, format="json").json()
    assert sorted(body["cancelled"]) == sorted(job.pk for job in wf.jobs)
    assert (body["asked_to_stop"], body["closed"]) == ([], False)
    first = Job.objects.get(pk=wf.jobs[0].pk)
    assert first.last_error == f"cancelled: workflow #{wf.pk} cancelled: by operator over the API: withdrawn"


def test_retry_failed_needs_a_reason_and_a_retry_permission():
    from django_jobguard.operations import jobs

    batch = Batch().enqueue([tasks.add.s(1), tasks.add.s(2)])
    member = Job.objects.filter(workflow_id=batch.id).order_by("pk").first()
    jobs.cancel([member.pk], reason="by hand")
    url = f"{BASE}workflows/{batch.id}/retry-failed/"
    reader, _ = as_user("reader", "view_job")
    assert reader.post(url, {"reason": "again"}, format="json").status_code == 403
    retrier, _ = as_user("retrier", "view_job", "retry_job")
    missing = retrier.post(url, {}, format="json")
    assert missing.status_code == 400 and "reason" in missing.json()["errors"]
    blank = retrier.post(url, {"reason": "   "}, format="json")
    assert blank.status_code == 400 and "reason" in blank.json()["errors"]
    assert Job.objects.get(pk=member.pk).status == "cancelled"
    body = retrier.post(url, {"reason": "cancelled by mistake"}, format="json").json()
    assert body["requeued"] == [member.pk] and body["refused"] == []
    assert Job.objects.get(pk=member.pk).status == "queued"
    reader_view = reader.get(f"{BASE}workflows/{batch.id}/").json()
    assert (reader_view["failed"], reader_view["pending"]) == (0, 2)
