"""The worker's pieces called directly: the pipeline's outcome, the completer's writes, lease keeping.

Real database rows, real metrics and log records; the worker's threads are not involved
except in the last test, where a real worker's executor thread dies.
"""

import datetime
import logging
import time

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from django_jobguard import locks, signals, store
from django_jobguard.maintenance import KeyPruner, Reaper, ReapResult
from django_jobguard.models import DeadLetter, DeadLetterReason, Job
from django_jobguard.outcome import Dead, HeldState, Kind, PutBack, PutBackCause, Retry, Stale, Succeeded
from django_jobguard.task import task
from django_jobguard.worker import EXIT_THREAD_DIED, Worker, pipeline
from django_jobguard.worker.completer import Completer
from django_jobguard.worker.held import Held
from django_jobguard.worker.leases import LeaseKeeper
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "default"
WORKER_ID = "pipeline-test"


@task(name="tests.worker_pipeline.interrupts")
def interrupts() -> None:
    # Not an Exception: the executor does not catch it, so its thread dies.
    raise KeyboardInterrupt


def claim_one() -> Held:
    jobs = store.claim(ALIAS, None, 1, WORKER_ID)
    assert len(jobs) == 1
    now = time.monotonic()
    return Held(job=jobs[0], renewed_at=now, state=HeldState.RUNNING, started_at=now)


def runtime() -> pipeline.Runtime:
    return pipeline.Runtime(ALIAS, WORKER_ID, Completer(ALIAS, WORKER_ID))


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def records(caplog: pytest.LogCaptureFixture, prefix: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(prefix)]


def test_a_success_is_acked_by_the_pipeline_and_reported_by_the_completer(caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard.worker")
    job = tasks.add.enqueue(2, b=3)
    held, rt = claim_one(), runtime()
    labels = {"queue": job.queue_name, "task": job.task_name}
    before = sample("jobguard_jobs_succeeded_total", **labels)
    sent = []
    signals.job_succeeded.connect(receiver := lambda **kw: sent.append(kw), weak=False)
    try:
        outcome = pipeline.run(held, rt)
        assert isinstance(outcome, Succeeded) and outcome.kind is Kind.SUCCEEDED and outcome.result == 5
        job.refresh_from_db()
        assert job.status == "succeeded"  # the ack committed in the pipeline, under the job's lock
        assert sample("jobguard_jobs_succeeded_total", **labels) == before and not sent
        rt.completer.settle(held, outcome)
    finally:
        signals.job_succeeded.disconnect(receiver)
    assert sample("jobguard_jobs_succeeded_total", **labels) == before + 1
    assert [kw["result"] for kw in sent] == [5]
    (line,) = records(caplog, "job_succeeded")
    assert (line.job_id, line.outcome, line.worker_id) == (job.id, "succeeded", WORKER_ID)
    assert rt.completer.outcomes["succeeded"] == 1


def test_a_failed_attempt_is_a_retry_the_completer_writes(caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard.worker")
    job = tasks.flaky.enqueue("m", failures=1)
    held, rt = claim_one(), runtime()
    outcome = pipeline.run(held, rt)
    assert isinstance(outcome, Retry) and outcome.category == "transient" and outcome.delay >= 0
    job.refresh_from_db()
    assert job.status == "running"  # nothing written before the completer
    labels = {"queue": job.queue_name, "task": job.task_name, "category": "transient"}
    before = sample("jobguard_jobs_retried_total", **labels)
    rt.completer.settle(held, outcome)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_token) == ("queued", 1, None)
    assert sample("jobguard_jobs_retried_total", **labels) == before + 1
    (line,) = records(caplog, "job_retry")
    assert line.outcome == "retry"
    assert rt.completer.outcomes["retried"] == 1


def test_a_permanent_failure_and_an_unknown_task_are_dead_letters():
    job = tasks.flaky.enqueue("m", failures=1, error="permanent")
    held, rt = claim_one(), runtime()
    outcome = pipeline.run(held, rt)
    assert isinstance(outcome, Dead) and outcome.reason == DeadLetterReason.PERMANENT_ERROR
    rt.completer.settle(held, outcome)
    job.refresh_from_db()
    assert job.status == "dead"
    unknown = tasks.add.enqueue(1)
    Job.objects.filter(pk=unknown.pk).update(task_name="tests.no_such_task")
    held = claim_one()
    outcome = pipeline.run(held, rt)
    assert isinstance(outcome, Dead) and outcome.reason == DeadLetterReason.UNKNOWN_TASK
    assert outcome.error is None  # the handler never ran
    rt.completer.settle(held, outcome)
    assert DeadLetter.objects.filter(reason=DeadLetterReason.UNKNOWN_TASK).count() == 1
    assert rt.completer.outcomes["dead_lettered"] == 2


def test_an_invalid_payload_is_dead_without_running_the_handler():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(args="not a list")
    held, rt = claim_one(), runtime()
    outcome = pipeline.run(held, rt)
    assert isinstance(outcome, Dead) and outcome.reason == DeadLetterReason.INVALID_PAYLOAD


def test_an_ack_the_lease_refuses_is_stale_and_counted_as_a_lost_lease(caplog):
    job = tasks.add.enqueue(1)
    held, rt = claim_one(), runtime()
    Job.objects.filter(pk=job.pk).update(lease_token="someone-else")  # noqa: S106 - a stale token, not a secret
    labels = {"queue": job.queue_name, "task": job.task_name, "operation": "ack"}
    before = sample("jobguard_lease_lost_total", **labels)
    outcome = pipeline.run(held, rt)
    assert isinstance(outcome, Stale)
    rt.completer.settle(held, outcome)
    assert sample("jobguard_lease_lost_total", **labels) == before + 1
    assert records(caplog, "ack_rejected")
    job.refresh_from_db()
    assert job.status == "running"


def test_a_taken_lock_puts_the_job_back_without_using_an_attempt():
    job = tasks.locked_interval.enqueue(resource="r1")
    held, rt = claim_one(), runtime()
    with locks.lock("res:r1", ttl=30):
        outcome = pipeline.run(held, rt)
    assert isinstance(outcome, PutBack) and outcome.cause is PutBackCause.LOCK_CONTENDED
    rt.completer.settle(held, outcome)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("queued", 0)
    assert rt.completer.outcomes["put_back"] == 1


def test_lease_keeping_extends_a_held_lease_and_reports_a_lost_one(caplog):
    job = tasks.add.enqueue(1)
    held = claim_one()
    keeper = LeaseKeeper(ALIAS, WORKER_ID)
    first = Job.objects.get(pk=job.pk).lease_expires_at
    time.sleep(0.01)
    now = time.monotonic() + held.job.visibility_timeout  # every lease is due
    assert keeper.renew_leases([held], now) == [held]
    assert held.renewed_at == now and not held.lease_lost
    assert Job.objects.get(pk=job.pk).lease_expires_at > first
    Job.objects.filter(pk=job.pk).update(lease_token="someone-else")  # noqa: S106 - a stale token, not a secret
    labels = {"queue": job.queue_name, "task": job.task_name, "operation": "heartbeat"}
    before = sample("jobguard_lease_lost_total", **labels)
    keeper.renew_leases([held], now + held.job.visibility_timeout)
    assert held.lease_lost
    assert sample("jobguard_lease_lost_total", **labels) == before + 1
    assert records(caplog, "lease_lost")
    # A lost lease is not renewed again.
    assert keeper.renew_leases([held], now + 3 * held.job.visibility_timeout) == []


def test_maintenance_services_run_once_and_say_what_they_did():
    job = tasks.add.enqueue(1)
    claim_one()
    assert Reaper(ALIAS).run_once() == ReapResult()
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - datetime.timedelta(hours=1))
    assert Reaper(ALIAS).run_once() == ReapResult(reappeared=1)
    assert Job.objects.get(pk=job.pk).status == "queued"
    assert KeyPruner(ALIAS).run_once().ran


def test_a_dying_executor_thread_stops_the_worker_loudly(caplog):
    caplog.set_level(logging.INFO, logger="django_jobguard.worker")
    interrupts.enqueue()
    worker = Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, shutdown_grace=1)
    assert worker.run() == EXIT_THREAD_DIED
    (died,) = records(caplog, "worker_thread_died")
    assert died.levelno == logging.CRITICAL and "jobguard-exec-0" in died.getMessage()
    assert records(caplog, "worker_stopped")
