"""Several real worker processes drain one queue: every job runs exactly once."""

import subprocess
from collections import Counter

import pytest

from django_jobguard.models import Job
from tests.conftest import ROOT, worker_command, worker_env
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def drain_with_processes(processes: int, concurrency: int) -> None:
    procs = [
        subprocess.Popen(
            worker_command("--burst", "--concurrency", str(concurrency)),
            cwd=ROOT,
            env=worker_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(processes)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]


def assert_each_ran_once(total: int) -> None:
    assert Job.objects.filter(status="succeeded").count() == total
    runs = Counter(Execution.objects.values_list("marker", flat=True))
    assert len(runs) == total
    assert set(runs.values()) == {1}, [marker for marker, n in runs.items() if n > 1][:10]
    assert LedgerEntry.objects.count() == total
    # Each job was claimed once: no lease expired, nothing reappeared.
    assert set(Job.objects.values_list("attempts", "reappearances").distinct()) == {(1, 0)}


@pytest.mark.server_db
@pytest.mark.slow
def test_four_processes_drain_two_thousand_jobs_exactly_once_on_a_database_server():
    tasks.record.bulk_enqueue([((f"job-{i}",), {}) for i in range(2000)])
    drain_with_processes(processes=4, concurrency=3)
    assert_each_ran_once(2000)
    # The work really was shared between processes.
    assert len(set(Execution.objects.values_list("pid", flat=True))) > 1


def test_several_processes_drain_jobs_exactly_once():
    tasks.record.bulk_enqueue([((f"job-{i}",), {}) for i in range(300)])
    drain_with_processes(processes=2, concurrency=2)
    assert_each_ran_once(300)
