"""Scrapes after scripted runs of real worker processes: every metric with its expected value.

The worker's own counters come from ``jobguard_worker --metrics-port``; the queue gauges
and the enqueue counters from the web process's ``/metrics`` (django-prometheus's view).
Both pages are parsed with prometheus_client's text parser.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable

import pytest
from django.db import transaction
from django.db.models import Sum
from django.test import RequestFactory
from django.utils import timezone

from django_jobguard import lock
from django_jobguard.models import DeadLetter, Job
from django_jobguard.monitoring.metrics import metrics_view
from tests.conftest import wait_for
from tests.support.prometheus import Samples, free_port, parse, scrape_worker, value
from tests.testapp import tasks, tasks_cache

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

ADD = "tests.testapp.tasks.add"
FLAKY = "tests.testapp.tasks.flaky"
RECORD = "tests.testapp.tasks.record"
LOCKED = "tests.testapp.tasks.locked_interval"
SHORT = "tests.testapp.tasks.short_lease_plain"
CHURN = "tests.testapp.tasks_cache.cache_churn"


def scrape_web(client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    return parse(response.content.decode())


def finished(jobs: Iterable[Job]) -> bool:
    ids = [job.pk for job in jobs]
    return not Job.objects.filter(pk__in=ids, status__in=("queued", "running")).exists()


def test_scrape_after_a_scripted_run_shows_every_metric(workers, client):
    before = scrape_web(client)
    port = free_port()
    proc = workers.start("--queue", "default", "--concurrency", "2", "--metrics-port", str(port))
    workers.wait_started(proc)
    assert f"port={port}" in workers.log(proc)

    # Lock contention: the test holds the lock the job needs, until the job has bounced off it.
    held = lock("res:obs-metrics", ttl=120)
    assert held.acquire(blocking=False)
    # One commit: the running worker sees the whole script at once.
    with transaction.atomic():
        locked = tasks.locked_interval.enqueue("obs-metrics")

        adds = [tasks.add.enqueue(i, b=1) for i in range(5)]
        retried = tasks.flaky.enqueue("obs-retry", failures=2)  # two transient failures, then success
        permanent = tasks.flaky.enqueue("obs-permanent", failures=9, error="permanent")
        first = tasks.record.enqueue("obs-dup")
        second = tasks.record.enqueue("obs-dup")  # same ledger key: a unique-constraint conflict
        Job.objects.filter(pk__in=[first.pk, second.pk]).update(max_attempts=1)
        keyed = tasks.add.using(idempotency_key="obs-key").enqueue(40, b=2)
        # Versioned cache writes 3, 1, 3, 5: two refused as stale; then 2 + 1 keys invalidated.
        churn = tasks_cache.cache_churn.enqueue("obs-cache", [3, 1, 3, 5])
        # A lease that already expired (its worker died): the reaper makes the job visible again.
        now = timezone.now()
        orphan = Job.objects.create(
            task_name=ADD,
            queue_name="default",
            args=[1],
            status="running",
            attempts=1,
            max_attempts=3,
            lease_token="0" * 32,
            lease_expires_at=now - datetime.timedelta(seconds=5),
            started_at=now - datetime.timedelta(seconds=60),
        )
        # Gauges: a due job in a queue no worker serves, one scheduled for later.
        parked = tasks.add.using(queue_name="parked", run_after=now - datetime.timedelta(seconds=90)).enqueue(
            0
        )
        later = tasks.add.using(run_after=now + datetime.timedelta(hours=1)).enqueue(0)

    wait_for(lambda: Job.objects.get(pk=locked.pk).lock_contentions >= 1, 60, message="a lock contention")
    held.release()
    run = [*adds, retried, permanent, first, second, keyed, orphan, locked, churn]
    wait_for(lambda: finished(run), 120, message="the scripted jobs to finish")
    # A second job with a key whose action already succeeded: a duplicate at execution.
    duplicate = Job.objects.create(
        task_name=ADD, queue_name="default", args=[40, 2], idempotency_key="obs-key"
    )
    wait_for(lambda: finished([duplicate]), 60, message="the duplicate to be acked")

    contentions = Job.objects.get(pk=locked.pk).lock_contentions
    worker = scrape_worker(port)
    assert proc.poll() is None

    # Successes and the duration histogram.
    assert value(worker, "jobguard_jobs_succeeded_total", queue="default", task=ADD) == 7
    assert value(worker, "jobguard_jobs_succeeded_total", queue="default", task=FLAKY) == 1
    assert value(worker, "jobguard_jobs_succeeded_total", queue="default", task=RECORD) == 1
    assert value(worker, "jobguard_jobs_succeeded_total", queue="default", task=LOCKED) == 1
    assert (
        value(worker, "jobguard_job_duration_seconds_count", queue="default", task=ADD, status="succeeded")
        == 7
    )
    assert (
        value(worker, "jobguard_job_duration_seconds_count", queue="default", task=FLAKY, status="failed")
        == 3
    )
    assert (
        value(
            worker,
            "jobguard_job_duration_seconds_bucket",
            queue="default",
            task=ADD,
            status="succeeded",
            le="3600.0",
        )
        == 7
    )
    # Retries, failures by category, dead letters by reason.
    assert (
        value(worker, "jobguard_jobs_retried_total", queue="default", task=FLAKY, category="transient") == 2
    )
    assert value(worker, "jobguard_jobs_failed_total", queue="default", task=FLAKY, category="transient") == 2
    assert value(worker, "jobguard_jobs_failed_total", queue="default", task=FLAKY, category="permanent") == 1
    assert (
        value(
            worker, "jobguard_jobs_dead_lettered_total", queue="default", task=FLAKY, reason="permanent_error"
        )
        == 1
    )
    assert (
        value(worker, "jobguard_jobs_failed_total", queue="default", task=RECORD, category="transient") == 1
    )
    assert (
        value(
            worker,
            "jobguard_jobs_dead_lettered_total",
            queue="default",
            task=RECORD,
            reason="retries_exhausted",
        )
        == 1
    )
    assert value(worker, "jobguard_unique_conflicts_total", queue="default", task=RECORD) == 1
    # Locks, leases, reappearances, idempotency.
    assert contentions >= 1
    assert value(worker, "jobguard_lock_contentions_total", queue="default", task=LOCKED) == contentions
    assert value(worker, "jobguard_visibility_timeout_reappearances_total", queue="default") == 1
    assert value(worker, "jobguard_idempotency_duplicates_total", task=ADD, where="execution") == 1
    assert not [key for key in worker if key[0] == "jobguard_lease_lost_total"]
    assert not [key for key in worker if key[0] == "jobguard_lock_failures_total"]
    # Cache invalidations by cache alias and status, and versioned writes refused as stale.
    assert Job.objects.get(pk=churn.pk).result == [True, False, False, True]
    assert value(worker, "jobguard_cache_invalidations_total", cache="default", status="ok") == 2
    assert value(worker, "jobguard_cache_invalidations_total", cache="files", status="ok") == 1
    assert not [
        key
        for key in worker
        if key[0] == "jobguard_cache_invalidations_total" and ("status", "error") in key[1]
    ]
    assert value(worker, "jobguard_cache_stale_writes_rejected_total", cache="default") == 2
    # The worker serves no queue gauges: the web process does, once for all workers.
    assert not [key for key in worker if key[0].startswith("jobguard_queue_")]

    # The web process: enqueue counters, and the gauges computed from the database.
    DeadLetter.objects.filter(job=permanent.pk).update(replay_state="requested")
    web = scrape_web(client)

    def enqueued(samples: Samples, task: str, queue: str = "default") -> float:
        return value(samples, "jobguard_jobs_enqueued_total", queue=queue, task=task)

    assert enqueued(web, ADD) - enqueued(before, ADD) == 7  # 5 + keyed + later
    assert enqueued(web, ADD, "parked") - enqueued(before, ADD, "parked") == 1
    assert enqueued(web, FLAKY) - enqueued(before, FLAKY) == 2
    assert value(web, "jobguard_queue_depth", queue="default") == 0
    assert value(web, "jobguard_queue_scheduled", queue="default") == 1
    assert value(web, "jobguard_queue_in_flight", queue="default") == 0
    assert value(web, "jobguard_queue_dead_letters", queue="default") == 2
    assert value(web, "jobguard_queue_replays_pending_approval", queue="default") == 1
    assert value(web, "jobguard_queue_depth", queue="parked") == 1
    assert 90 <= value(web, "jobguard_queue_oldest_age_seconds", queue="parked") < 3600
    assert value(web, "jobguard_queue_stats_up") == 1
    assert Job.objects.filter(pk__in=[parked.pk, later.pk], status="queued").count() == 2
    # Cross-check against the rows: nothing was counted twice.
    assert Job.objects.filter(pk__in=[j.pk for j in run]).aggregate(n=Sum("reappearances"))["n"] == 1


def test_a_frozen_worker_counts_its_refused_ack_as_a_lost_lease(workers):
    port = free_port()
    # Worker A takes the job, then freezes past its 2 s lease; worker B re-runs it.
    slow = workers.start("--concurrency", "1", "--metrics-port", str(port))
    workers.wait_started(slow)
    job = tasks.short_lease_plain.enqueue("obs-frozen", seconds=3.0)
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "running", 60, message="worker A to claim")
    os.kill(slow.pid, signal.SIGSTOP)
    try:
        workers.start("--concurrency", "1")
        wait_for(lambda: Job.objects.get(pk=job.pk).attempts == 2, 60, message="worker B to re-claim")
        wait_for(lambda: Job.objects.get(pk=job.pk).status == "succeeded", 60, message="worker B's ack")
    finally:
        os.kill(slow.pid, signal.SIGCONT)
    wait_for(
        lambda: "ack_rejected" in workers.log(slow) or "lease_lost" in workers.log(slow),
        60,
        message="worker A to notice",
    )
    wait_for(lambda: "ack_rejected" in workers.log(slow), 60, message="worker A's refused ack")
    samples = scrape_worker(port)
    assert value(samples, "jobguard_lease_lost_total", queue="default", task=SHORT, operation="ack") == 1
    # The heartbeat may notice first; either way no success is counted for the stale attempt.
    assert (
        value(samples, "jobguard_lease_lost_total", queue="default", task=SHORT, operation="heartbeat") <= 1
    )
    assert value(samples, "jobguard_jobs_succeeded_total", queue="default", task=SHORT) == 0


def test_an_unreachable_lock_back_end_is_counted_as_a_lock_failure(workers):
    port = free_port()
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    env = {
        "JOBGUARD_TEST_LOCK_BACKEND": "redis",
        "JOBGUARD_TEST_REDIS_URL": f"redis://127.0.0.1:{dead_port}/0",
    }
    proc = workers.start("--metrics-port", str(port), env=env)
    workers.wait_started(proc)
    job = tasks.locked_interval.enqueue("obs-unreachable")
    Job.objects.filter(pk=job.pk).update(max_attempts=2)

    def failures() -> float:
        samples = scrape_worker(port)
        found = value(
            samples, "jobguard_lock_failures_total", queue="default", task=LOCKED, reason="unavailable"
        )
        return found

    wait_for(lambda: failures() >= 2, 120, message="two failed acquisitions to be counted")
    samples = scrape_worker(port)
    # An unreachable back end uses no attempt: the job waits for it instead of dying.
    job.refresh_from_db()
    assert job.status in ("queued", "running")
    assert job.attempts <= 1
    assert "LockUnavailable" in job.last_error
    assert not value(
        samples, "jobguard_jobs_dead_lettered_total", queue="default", task=LOCKED, reason="retries_exhausted"
    )
    assert value(samples, "jobguard_lock_contentions_total", queue="default", task=LOCKED) == 0


def test_metrics_port_that_is_taken_fails_with_a_clear_message(workers):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # the worker's default address
        sock.listen()
        port = sock.getsockname()[1]
        result = workers.burst("--metrics-port", str(port), timeout=120)
    assert result.returncode == 1
    assert f"--metrics-port {port}: [Errno 98] Address already in use" in result.stderr.decode()


def test_multiprocess_mode_gathers_worker_counters_and_our_view_adds_the_gauges(
    workers, tmp_path, monkeypatch
):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    for i in range(3):
        tasks.add.enqueue(i)
    tasks.flaky.enqueue("obs-mp", failures=9, error="permanent")
    result = workers.burst(env={"PROMETHEUS_MULTIPROC_DIR": str(directory)})
    assert result.returncode == 0, result.stderr.decode()
    assert list(directory.glob("counter_*.db"))

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    from django_prometheus.exports import ExportToDjangoView

    request = RequestFactory().get("/metrics")
    theirs = parse(ExportToDjangoView(request).content.decode())
    ours = parse(metrics_view(request).content.decode())
    for samples in (theirs, ours):
        assert value(samples, "jobguard_jobs_succeeded_total", queue="default", task=ADD) == 3
        assert (
            value(
                samples,
                "jobguard_jobs_dead_lettered_total",
                queue="default",
                task=FLAKY,
                reason="permanent_error",
            )
            == 1
        )
    # django-prometheus's multiprocess page has only what processes wrote to the directory.
    assert not [key for key in theirs if key[0].startswith("jobguard_queue_")]
    assert value(ours, "jobguard_queue_dead_letters", queue="default") == 1
    assert value(ours, "jobguard_queue_stats_up") == 1


def test_multiprocess_view_serves_every_other_file_when_a_process_left_its_own_empty(tmp_path, monkeypatch):
    # A process creates its file empty and sizes it next; killed in between, it leaves the
    # empty file for good. prometheus_client's own collector fails every scrape on it.
    directory = tmp_path / "prometheus"
    directory.mkdir()
    subprocess.run(
        [sys.executable, "-c", "import prometheus_client as p; p.Counter('probe', 'A probe.').inc(2)"],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
        check=True,
    )
    assert list(directory.glob("counter_*.db"))
    (directory / "histogram_4194304.db").touch()  # what the killed process left
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))

    response = metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 200
    samples = parse(response.content.decode())
    assert value(samples, "probe_total") == 2
    assert value(samples, "jobguard_queue_stats_up") == 1


def test_metrics_port_out_of_range_is_refused(workers):
    result = workers.burst("--metrics-port", "70000", timeout=120)
    assert result.returncode == 1
    assert "--metrics-port 70000: a port is 0 to 65535." in result.stderr.decode()
