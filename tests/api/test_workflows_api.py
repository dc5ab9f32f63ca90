"""``GET workflows/{id}/``: a workflow's progress, callbacks and members, for job viewers."""

import pytest
from django.db import connection

from django_jobguard import Batch
from django_jobguard.models import Job
from tests.api.support import BASE, as_user, client_for
from tests.support.dlq import run_burst
from tests.testapp import tasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor == "mysql", reason="workflows do not run on MariaDB/MySQL yet"),
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
