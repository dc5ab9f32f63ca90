"""Idempotency with real worker processes: the payment scenario, crashes, concurrent producers."""

import json
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from django_jobguard.models import IdempotencyKey, Job
from django_jobguard.worker import Worker
from tests.conftest import ROOT, wait_for, worker_env
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry, ProviderCall
from tests.testapp.tasks_idem import charge

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

KILLED = -9


def status_of(job):
    job.refresh_from_db()
    return job.status


def duplicates_counted(where):
    value = REGISTRY.get_sample_value(
        "jobguard_idempotency_duplicates_total", {"task": charge.name, "where": where}
    )
    return value or 0.0


def test_the_payment_scenario_charges_once_through_resends_crashes_and_redeliveries(workers):
    enqueue_before, execution_before = duplicates_counted("enqueue"), duplicates_counted("execution")

    # The same business action enqueued three times: one job.
    key = "charge:order:7"
    jobs = [charge.using(idempotency_key=key).enqueue(order_id=7, amount=1000) for _ in range(3)]
    job = jobs[0]
    assert {j.pk for j in jobs} == {job.pk}
    assert Job.objects.count() == 1

    # Worker A is SIGKILLed right after the provider charged, before the checkpoint.
    a = workers.start("--worker-id", "A", env={"JOBGUARD_TEST_FAULTS": "mid_task=1"})
    assert a.wait(timeout=60) == KILLED
    assert (ProviderCall.objects.count(), LedgerEntry.objects.count()) == (1, 0)
    assert IdempotencyKey.objects.get(key=key).status == "in_progress"

    # The message is redelivered when A's lease expires. Worker B finds no checkpoint, so it
    # calls the provider again with the same key (the provider answers with the same charge),
    # writes the ledger, and is SIGKILLed after the handler returned, before the ack.
    b = workers.start("--worker-id", "B", env={"JOBGUARD_TEST_FAULTS": "after_effect=1"})
    assert b.wait(timeout=60) == KILLED
    first_call = ProviderCall.objects.order_by("pk").first()
    assert list(ProviderCall.objects.values_list("idempotency_key", flat=True)) == [key, key]
    assert LedgerEntry.objects.count() == 1
    job.refresh_from_db()
    assert (job.status, job.checkpoints) == ("running", {"charged": f"ch_{first_call.pk}", "recorded": True})

    # Redelivered again: worker C resumes after the last checkpoint and only acks.
    c = workers.start("--worker-id", "C")
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="worker C to finish the charge")
    assert (job.attempts, job.reappearances, job.worker_id) == (3, 2, "C")
    assert job.result == {"charge": f"ch_{first_call.pk}"}
    assert Execution.objects.filter(marker="charge:7").count() == 3

    # Another order, charged once.
    other = charge.using(idempotency_key="charge:order:8").enqueue(order_id=8, amount=500)
    wait_for(lambda: status_of(other) == "succeeded", timeout=60, message="worker C to charge order 8")

    # The producer resends the first action: enqueue answers with the finished job.
    resent = charge.using(idempotency_key=key).enqueue(order_id=7, amount=1000)
    assert (resent.pk, resent.status) == (job.pk, "succeeded")
    c.terminate()
    assert c.wait(timeout=30) == 0

    # A resend as a new message that bypassed enqueue (a relay's copy): acked with the stored
    # result by a worker in this process, without running the handler.
    copy = Job.objects.create(
        task_name=charge.name, kwargs={"order_id": 7, "amount": 1000}, idempotency_key=key
    )
    assert Worker(burst=True, install_signal_handlers=False).run() == 0
    copy.refresh_from_db()
    assert (copy.status, copy.attempts, copy.result) == ("succeeded", 1, job.result)

    # One charge in the ledger per order; the provider charged once per key.
    assert sorted(LedgerEntry.objects.values_list("effect_key", "amount")) == [
        ("charge:order:7", 1000),
        ("charge:order:8", 500),
    ]
    calls = {}
    for call in ProviderCall.objects.order_by("pk"):
        calls.setdefault(call.idempotency_key, []).append(call)
    assert {k: len(v) for k, v in calls.items()} == {key: 2, "charge:order:8": 1}
    assert job.result == {"charge": f"ch_{calls[key][0].pk}"}
    assert other.result == {"charge": f"ch_{calls['charge:order:8'][0].pk}"}
    assert Execution.objects.filter(marker="charge:7").count() == 3  # the copy never ran

    # The duplicate counters agree: 2 + 1 at enqueue, 1 at execution.
    row = IdempotencyKey.objects.get(key=key)
    assert (row.scope, row.status, row.job_id, row.result) == ("payments", "succeeded", job.pk, job.result)
    assert IdempotencyKey.objects.get(key="charge:order:8").duplicates == 0
    at_enqueue = duplicates_counted("enqueue") - enqueue_before
    at_execution = duplicates_counted("execution") - execution_before
    assert (at_enqueue, at_execution) == (3, 1)
    assert row.duplicates == at_enqueue + at_execution == 4


def test_an_atomic_job_killed_inside_its_ack_leaves_its_key_unrecorded_until_it_succeeds(workers):
    job = tasks.short_lease.using(idempotency_key="lease:1").enqueue("atomic-ack")
    first = workers.start("--worker-id", "first", env={"JOBGUARD_TEST_FAULTS": "in_complete=1"})
    assert first.wait(timeout=60) == KILLED
    # The handler's writes, the key's success and the ack were one transaction: none committed.
    assert not Execution.objects.exists() and not LedgerEntry.objects.exists()
    key = IdempotencyKey.objects.get(key="lease:1")
    assert (key.status, key.result) == ("in_progress", None)
    second = workers.start("--worker-id", "second")
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="the second worker to finish it")
    key.refresh_from_db()
    assert (key.status, key.result, key.job_id) == ("succeeded", second.pid, job.pk)
    assert job.result == second.pid
    assert LedgerEntry.objects.get().job_id == job.pk


@pytest.mark.parametrize("mode", ["autocommit", "atomic"])
def test_eight_processes_enqueueing_one_key_at_once_make_exactly_one_job(mode):
    producers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.processes.idempotent_producer", mode, "charge:order:1"],
            cwd=ROOT,
            env=worker_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    for producer in producers:
        assert producer.stdout.readline().strip() == b"ready"
    for producer in producers:  # all connected: start them together
        producer.stdin.write(b"go\n")
        producer.stdin.flush()
    outputs = [producer.communicate(timeout=120) for producer in producers]
    for producer, (_, err) in zip(producers, outputs, strict=True):
        assert producer.returncode == 0, err.decode(errors="replace")[-2000:]
    job_ids = {json.loads(out.splitlines()[-1])["job"] for out, _ in outputs}
    assert len(job_ids) == 1
    assert list(Job.objects.values_list("pk", flat=True)) == list(job_ids)
    key = IdempotencyKey.objects.get()
    assert (key.key, key.job_id, key.duplicates) == ("charge:order:1", job_ids.pop(), 7)
