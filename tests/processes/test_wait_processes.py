"""A waiter in this process, the worker in another: Job.wait() across processes, through a crash.

On SQLite and MariaDB the waiter polls its row; on PostgreSQL the settlement's NOTIFY wakes it
(the postgres tests below check that the notification path, not the poll, carries it).
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection, connections

from django_jobguard import JobCancelled
from django_jobguard.models import Job
from django_jobguard.operations import jobs as job_ops
from tests.conftest import ROOT, wait_for, worker_env
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


@pytest.fixture
def in_thread() -> Iterator[Callable[..., Future[Any]]]:
    pool = ThreadPoolExecutor(max_workers=2)

    def submit(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        def run() -> Any:
            try:
                return function(*args, **kwargs)
            finally:
                connections.close_all()

        return pool.submit(run)

    yield submit
    pool.shutdown(wait=True)


def status_of(job: Job) -> str:
    job.refresh_from_db()
    return job.status


def test_the_waiter_gets_the_result_a_worker_process_stores(workers, in_thread):
    job = tasks.add.enqueue(40, b=2)
    waiter = in_thread(job.wait, timeout=180)
    workers.start()
    assert waiter.result(timeout=180) == 42


def test_a_worker_killed_mid_job_leaves_the_waiter_waiting_for_the_retried_result(workers, in_thread):
    # Not atomic: its first write commits, so the test sees the attempt start (on SQLite an
    # atomic handler would hold the write lock while it sleeps).
    job = tasks.short_lease_plain.enqueue("waited-crash", seconds=60)
    waiter = in_thread(job.wait, timeout=300)
    first = workers.start("--worker-id", "first")
    wait_for(lambda: Execution.objects.filter(job_id=job.pk).exists(), message="the first attempt to start")
    first.kill()  # SIGKILL mid-job
    first.wait(timeout=10)
    assert not waiter.done()
    workers.start("--worker-id", "second")
    # The reaper takes the job back after its 2 s lease; the second worker runs it again.
    assert waiter.result(timeout=300) == 2  # the second attempt's result
    job.refresh_from_db()
    assert job.worker_id == "second"
    assert (job.status, job.attempts, job.reappearances) == ("succeeded", 2, 1)


def test_a_job_cancelled_while_waited_on_raises_for_the_waiter(workers, in_thread):
    job = tasks.add.using(run_after=datetime.timedelta(hours=1)).enqueue(1)
    waiter = in_thread(job.wait, timeout=180)
    workers.start()  # running, but the job is not due: the operator cancels it first
    job_ops.cancel([job.pk], reason="not needed")
    with pytest.raises(JobCancelled, match="not needed"):
        waiter.result(timeout=180)


WAITER = """
import django, sys
django.setup()
from django_jobguard.models import Job
print("waiting", flush=True)
Job.objects.get(pk=int(sys.argv[1])).wait(timeout=600)
"""


def listening_sessions() -> int:
    """PostgreSQL sessions LISTENing for settlements (their last statement is the LISTEN)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN jobguard_settled'"
        )
        return int(cursor.fetchone()[0])


def test_a_waiter_killed_mid_wait_leaves_nothing_behind(tmp_path):
    job = tasks.add.enqueue(1)
    jobs_before = Job.objects.count()
    log = tmp_path / "waiter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WAITER), str(job.pk)],
            cwd=ROOT,
            env=worker_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: "waiting" in log.read_text(), timeout=120, message="the waiter to start")
        if connection.vendor == "postgresql":
            wait_for(
                lambda: Job.objects.filter(pk=job.pk, waited=True).exists(), timeout=120, message="the flag"
            )
            wait_for(lambda: listening_sessions() == 1, timeout=120, message="the waiter's LISTEN")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if connection.vendor == "postgresql":
        # Its connection closed with it: no LISTEN session left on the server.
        wait_for(lambda: listening_sessions() == 0, timeout=120, message="the LISTEN to end with the process")
    # No row was written for the waiter, and the job is as it was.
    assert Job.objects.count() == jobs_before
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("queued", 0)
