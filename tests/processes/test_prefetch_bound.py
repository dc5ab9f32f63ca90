"""A worker never holds more unacked jobs than its prefetch cap, even when its acks fall behind.

Jobs whose handler finished but whose batched ack is not written yet are still ``running``
in the database: a crash runs them again. So they count against the cap like the jobs in
hand, and a completer that falls behind holds the claimer back.
"""

from __future__ import annotations

import time

import pytest

from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

#: The cap: --batch-size is the most jobs a worker holds.
CAP = 8
#: A long ack window, so acks pile up in the completer while the executors finish jobs.
SLOW_ACKS = {"JOBGUARD_TEST_ACK_WINDOW": "0.5"}
JOBS = 600


def running_rows(worker_id: str) -> int:
    return Job.objects.filter(status="running", worker_id=worker_id).count()


def test_running_rows_of_a_worker_never_exceed_its_cap_while_acks_lag(workers):
    tasks.record_plain.bulk_enqueue([((f"bound:{n}",), {}) for n in range(JOBS)])
    worker = workers.start(
        "--worker-id", "bounded", "--concurrency", "4", "--batch-size", str(CAP), env=SLOW_ACKS
    )
    samples: list[int] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        # No pause between samples: the two queries pace the loop (a few milliseconds each).
        samples.append(running_rows("bounded"))
        if Job.objects.filter(status="succeeded").count() == JOBS:
            break
    else:
        pytest.fail(f"the worker did not finish {JOBS} jobs:\n{workers.log(worker)[-2000:]}")
    assert max(samples) > 0, "the sampling never saw the worker's jobs"
    assert max(samples) <= CAP, f"up to {max(samples)} running rows with a cap of {CAP}"


def test_a_sigkill_mid_drain_runs_again_at_most_the_cap(workers):
    tasks.record_plain.bulk_enqueue([((f"kill:{n}",), {}) for n in range(JOBS)])
    first = workers.start(
        "--worker-id", "killed", "--concurrency", "4", "--batch-size", str(CAP), env=SLOW_ACKS
    )
    wait_for(
        lambda: Execution.objects.count() >= JOBS // 3,
        timeout=300,
        message="the first worker to be a third of the way through",
    )
    first.kill()
    first.wait(timeout=30)
    # Every job whose handler ran but whose ack was lost runs again (its lease expires).
    workers.start("--worker-id", "second", "--concurrency", "4", env={"JOBGUARD_TEST_ACK_WINDOW": "0.01"})
    wait_for(
        lambda: Job.objects.filter(status="succeeded").count() == JOBS,
        timeout=300,
        interval=0.5,
        message="the second worker to finish every job",
    )
    runs = Execution.objects.count()
    assert JOBS <= runs <= JOBS + CAP, f"{runs - JOBS} jobs ran twice with a cap of {CAP}"
