"""The consistency audit: silent on what the engine writes, loud on rows changed behind its back."""

import datetime
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models.functions import Now
from django.utils import timezone

from django_jobguard import dlq
from django_jobguard.models import DeadLetter, IdempotencyKey, Job
from django_jobguard.monitoring.audit import CHECKS, SAMPLE_SIZE, audit
from django_jobguard.operations import jobs
from tests.support.dlq import dead_charge, run_burst
from tests.support.factories import make_user
from tests.testapp import tasks, tasks_dlq

pytestmark = pytest.mark.django_db(transaction=True)

HOUR_AGO = Now() - datetime.timedelta(hours=1)


def found() -> dict[str, list[int]]:
    return {finding.check: finding.sample for finding in audit() if not finding.ok}


def run_audit(*options: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("jobguard_audit", *options, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_what_the_engine_writes_passes_every_check():
    approver = make_user("amir", "approve_replay", "view_deadletter", "view_payload")  # approves a correction
    requester = make_user("rita", "request_replay", "view_payload", "view_deadletter")
    tasks_dlq.charge.using(idempotency_key="charge:1").enqueue(order_id=1, amount=100)  # succeeds
    tasks_dlq.charge.using(idempotency_key="charge:1").enqueue(order_id=1, amount=100)  # a duplicate
    letter = dead_charge(order_id=2, amount=0, key="charge:2")  # dead, its key failed
    cancelled = tasks_dlq.charge.using(idempotency_key="charge:3").enqueue(order_id=3, amount=5)
    jobs.cancel([cancelled.pk])
    tasks_dlq.charge.using(idempotency_key="charge:4").enqueue(order_id=4, amount=5)  # left queued
    dlq.request_replay(letter, requester, "typo", kwargs={"order_id": 2, "amount": 200})
    dlq.approve_replay(letter, approver, "ok")
    assert run_burst() == 0  # redrives the replay, which takes the key over, and runs it

    statuses = sorted(Job.objects.values_list("status", flat=True))
    assert statuses == ["cancelled", "dead", "succeeded", "succeeded", "succeeded"]
    assert set(IdempotencyKey.objects.values_list("status", flat=True)) == {"succeeded", "failed"}
    assert found() == {}
    assert [finding.check for finding in audit()] == [check.name for check in CHECKS]


def test_an_expired_lease_is_reported_once_it_outlives_the_grace_period():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(
        status="running", lease_token="t" * 32, lease_expires_at=HOUR_AGO, attempts=1
    )
    assert found() == {"expired_leases": [job.pk]}
    assert all(finding.ok for finding in audit(grace=2 * 3600))


def test_a_dead_job_without_its_dead_letter_is_reported():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(status="dead", finished_at=Now())
    assert found() == {"dead_without_dead_letter": [job.pk]}


@pytest.mark.parametrize(
    ("job_status", "key_status"),
    [
        ("succeeded", "in_progress"),
        ("queued", "succeeded"),
        ("cancelled", "in_progress"),
        ("succeeded", "failed"),
    ],
)
def test_a_key_that_disagrees_with_its_job_is_reported(job_status, key_status):
    job = tasks_dlq.charge.using(idempotency_key="charge:9").enqueue(order_id=9, amount=5)
    key = IdempotencyKey.objects.get(job=job)
    assert found() == {}
    Job.objects.filter(pk=job.pk).update(status=job_status)
    IdempotencyKey.objects.filter(pk=key.pk).update(status=key_status)
    assert found() == {"keys_disagreeing_with_their_job": [key.pk]}


def test_an_approved_replay_left_waiting_is_reported():
    letter = dead_charge(order_id=5, amount=0)
    DeadLetter.objects.filter(pk=letter.pk).update(replay_state="approved", replay_decided_at=Now())
    assert found() == {}  # approved just now: a worker has not had its turn yet
    DeadLetter.objects.filter(pk=letter.pk).update(replay_decided_at=HOUR_AGO)
    assert found() == {"approved_replays_waiting": [letter.pk]}


def test_findings_count_every_row_and_list_the_first_ids():
    ids = [job.pk for job in tasks.add.bulk_enqueue([((i,), {}) for i in range(SAMPLE_SIZE + 5)])]
    Job.objects.filter(pk__in=ids).update(status="dead", finished_at=Now())
    [finding] = [finding for finding in audit() if not finding.ok]
    assert (finding.count, finding.sample, finding.model) == (
        len(ids),
        sorted(ids)[:SAMPLE_SIZE],
        "jobguard.Job",
    )


def test_command_exits_zero_when_clean_and_one_with_findings():
    tasks.add.enqueue(1)
    code, out = run_audit()
    assert code == 0
    assert out.strip().endswith("jobguard audit: nothing found")
    assert out.count("ok     ") == len(CHECKS)

    job = tasks.add.enqueue(2)
    Job.objects.filter(pk=job.pk).update(status="dead", finished_at=Now())
    code, out = run_audit()
    assert code == 1
    assert "FOUND  dead_without_dead_letter: 1 dead jobs with no dead-letter row" in out
    assert f"jobguard.Job ids: {job.pk}\n" in out
    assert "1 of 4 checks found rows" in out


def test_command_json_lists_every_check():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(
        status="running", lease_token="t" * 32, lease_expires_at=HOUR_AGO, attempts=1
    )
    code, out = run_audit("--json", "--grace", "60")
    document = json.loads(out)
    assert code == 1
    assert (document["ok"], document["database"], document["grace_seconds"]) == (False, "default", 60.0)
    counts = {finding["check"]: finding["count"] for finding in document["findings"]}
    assert counts == {check.name: int(check.name == "expired_leases") for check in CHECKS}
    assert datetime.datetime.fromisoformat(document["checked_at"]) <= timezone.now()


def test_command_rejects_bad_options():
    with pytest.raises(CommandError, match="0 seconds or more"):
        call_command("jobguard_audit", "--grace", "-1")
    with pytest.raises(ValueError, match="0 seconds or more"):
        audit(grace=-1)


@pytest.mark.parametrize(
    "command", ["jobguard_audit", "jobguard_prune", "jobguard_status", "jobguard_worker"]
)
def test_every_command_names_an_unknown_database_alias(command):
    with pytest.raises(CommandError, match="--database 'elsewhere': no such database alias in DATABASES"):
        call_command(command, "--database", "elsewhere")
