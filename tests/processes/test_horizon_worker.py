"""A real worker running a slow atomic job: its open job transaction is a gauge, and its
horizon watcher names that transaction (another backend of the same worker) once past the
threshold."""

from __future__ import annotations

import json

import pytest

from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.support.prometheus import free_port, scrape_worker, value
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

GAUGE = "jobguard_worker_job_transaction_age_seconds"


def _gauge(port: int, name: str = GAUGE) -> float:
    try:
        return value(scrape_worker(port), name)
    except OSError:
        return -1.0  # not serving yet


# On SQLite the heartbeat that sets the gauge waits behind the job's write lock (one writer).
@pytest.mark.server_db
def test_a_slow_atomic_job_shows_as_the_longest_open_job_transaction(workers):
    port = free_port()
    proc = workers.start("--queue", "slow", "--concurrency", "1", "--metrics-port", str(port))
    workers.wait_started(proc)
    job = tasks.slow_record.enqueue("horizon-gauge", seconds=3.0)
    wait_for(lambda: _gauge(port) >= 1.0, timeout=60, message="the open job transaction's gauge to pass 1 s")
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == "succeeded", timeout=60, message="the job to finish"
    )
    wait_for(lambda: _gauge(port) == 0.0, timeout=30, message="the gauge back to 0 once it committed")


@pytest.mark.postgres
def test_the_workers_watcher_names_a_long_atomic_job_transaction(workers):
    port = free_port()
    proc = workers.start(
        "--queue",
        "slow",
        "--concurrency",
        "1",
        "--metrics-port",
        str(port),
        env={"JOBGUARD_TEST_HORIZON": json.dumps({"WARN_AFTER": 1.0, "INTERVAL": 0.5})},
    )
    workers.wait_started(proc)
    job = tasks.slow_record.enqueue("horizon-watcher", seconds=4.0)
    wait_for(
        lambda: (
            "vacuum_horizon_held kind=session" in workers.log(proc)
            and "state='idle in transaction'" in workers.log(proc)
        ),
        timeout=60,
        message="the worker's watcher to name its own atomic job's transaction",
    )
    line = next(
        line
        for line in workers.log(proc).splitlines()
        if "vacuum_horizon_held" in line and "INSERT INTO" in line and "execution" in line
    )
    assert "kind=session" in line and "user=" in line and "application=" in line
    assert _gauge(port, "jobguard_vacuum_horizon_age_seconds") >= 1.0
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == "succeeded", timeout=60, message="the job to finish"
    )
    wait_for(
        lambda: "vacuum_horizon_released" in workers.log(proc),
        timeout=30,
        message="the watcher to say the transaction is gone",
    )
