"""Workers through PgBouncer in transaction pooling mode: every guarantee holds unchanged.

The pool is smaller than the connections the workers open, so server connections pass
from client to client between transactions: any session state jobguard left behind (a
SET, a prepared statement, a LISTEN) would show up in another client or break a claim.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection

from django_jobguard.models import DeadLetter, Job
from tests.conftest import ROOT, wait_for, worker_env
from tests.support import pgbouncer as pgbouncer_module
from tests.support.factories import make_superuser
from tests.support.locking import assert_runs_never_overlap
from tests.support.pgbouncer import PgBouncer
from tests.testapp import tasks, tasks_locks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.postgres]

#: Server connections per database: fewer than the workers' clients, so they are shared.
POOL_SIZE = 3
#: Log lines that mean a session feature broke behind the pooler.
POOLER_ERRORS = ("prepared statement", "claim_failed", "heartbeat_failed", "Traceback")


@pytest.fixture
def bouncer() -> Iterator[PgBouncer]:
    if not pgbouncer_module.available():
        pytest.skip(f"needs pgbouncer ({pgbouncer_module.PGBOUNCER}): apt-get install pgbouncer")
    server = PgBouncer(
        server_host=str(connection.settings_dict["HOST"] or "127.0.0.1"),
        server_port=int(connection.settings_dict["PORT"] or 5432),
        user=str(connection.settings_dict["USER"] or "postgres"),
        pool_size=POOL_SIZE,
    )
    server.start()
    yield server
    server.stop()


def pooled(bouncer: PgBouncer, *, listen_alias: bool = True) -> dict[str, str]:
    """Worker environment: "default" through PgBouncer (tests/settings.py), LISTEN direct or not."""
    return {
        "JOBGUARD_TEST_PGBOUNCER_PORT": str(bouncer.port),
        "JOBGUARD_TEST_LISTEN_DIRECT": str(int(listen_alias)),
    }


def through_bouncer(bouncer: PgBouncer) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1",
        port=bouncer.port,
        user=str(connection.settings_dict["USER"] or "postgres"),
        dbname=str(connection.settings_dict["NAME"]),
        autocommit=True,
        prepare_threshold=None,
    )


def assert_clean_logs(workers, procs) -> None:
    for proc in procs:
        log = workers.log(proc)
        for marker in POOLER_ERRORS:
            assert marker not in log, f"worker {proc.pid} logged {marker!r}:\n{log[-3000:]}"


def status_of(job: Job) -> str:
    job.refresh_from_db()
    return job.status


def test_workers_through_pgbouncer_run_every_job_exactly_once_and_leave_no_session_state(bouncer, workers):
    count = 300
    tasks.record.bulk_enqueue([((f"ledger:{index}",), {}) for index in range(count)])
    env = pooled(bouncer)
    procs = [workers.start("--concurrency", "2", env=env) for _ in range(3)]
    wait_for(
        lambda: Job.objects.filter(status="succeeded").count() == count,
        timeout=600,
        interval=0.5,
        message=f"all {count} jobs to succeed through PgBouncer",
    )
    # Exactly once: one committed execution and one ledger effect per job, nothing dead.
    assert LedgerEntry.objects.count() == count
    assert Execution.objects.count() == count
    assert not DeadLetter.objects.exists()
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    # Three workers shared the pool's three server connections (and the pool was in
    # transaction mode), yet their planner SET did not leak to a client that borrows them.
    pools = {row[0]: row for row in bouncer.show("POOLS")}
    assert pools[connection.settings_dict["NAME"]][-1] == "transaction"
    for _ in range(POOL_SIZE * 2):
        with through_bouncer(bouncer) as conn:
            assert conn.execute("SHOW enable_bitmapscan").fetchone() == ("on",)
    assert_clean_logs(workers, procs)


def test_an_undeclared_pooler_is_detected_once_per_worker_and_every_job_runs_once(bouncer, workers):
    # Django's pooling settings are followed, but the alias is not in POOLED_DATABASES: each
    # worker finds the pooler at its first lost prepared statement and sends text after it.
    count = 300
    tasks.record.bulk_enqueue([((f"ledger:{index}",), {}) for index in range(count // 2)])
    tasks.record_plain.bulk_enqueue([((f"plain:{index}",), {}) for index in range(count // 2)])
    env = {**pooled(bouncer), "JOBGUARD_TEST_PGBOUNCER_UNDECLARED": "1"}
    procs = [workers.start("--concurrency", "4", env=env) for _ in range(2)]
    wait_for(
        lambda: Job.objects.filter(status="succeeded").count() == count,
        timeout=600,
        interval=0.5,
        message=f"all {count} jobs to succeed through an undeclared PgBouncer",
    )
    # Nothing lost, no atomic effect doubled (an ack that failed inside its transaction rolled
    # the effect back with it), nothing dead.
    assert LedgerEntry.objects.count() == count // 2
    assert not DeadLetter.objects.exists()
    warnings = [workers.log(proc).count('JOBGUARD["POOLED_DATABASES"]') for proc in procs]
    assert max(warnings) == 1, warnings
    assert all(count <= 1 for count in warnings), warnings
    for proc in procs:
        assert "Traceback" not in workers.log(proc), workers.log(proc)[-3000:]


def test_behind_an_undeclared_pooler_burst_workers_finish_every_atomic_job_on_its_first_attempt(
    bouncer, workers
):
    # An atomic job's ack that meets a lost prepared statement rolls back with the handler's
    # writes: the job is put back due at once with its attempt given back, so burst workers
    # (which stop at the first empty claim) leave nothing behind and no attempt is used.
    count = 1000
    tasks.record.bulk_enqueue([((f"burst:{index}",), {}) for index in range(count)])
    env = {**pooled(bouncer), "JOBGUARD_TEST_PGBOUNCER_UNDECLARED": "1"}
    procs = [workers.start("--burst", "--concurrency", "2", env=env) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, workers.log(proc)[-3000:]
    assert Job.objects.filter(status="succeeded").count() == count
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert LedgerEntry.objects.count() == count and not DeadLetter.objects.exists()
    for proc in procs:
        log = workers.log(proc)
        assert log.count('JOBGUARD["POOLED_DATABASES"]') <= 1
        # Once per connection that had prepared statements before the process found the
        # pooler: its two executors, the ack thread and the heartbeat's at most.
        assert log.count("reason=prepared_statement_lost") <= 4, log[-3000:]
        assert "Traceback" not in log, log[-3000:]


def test_a_worker_killed_behind_pgbouncer_is_recovered_by_another(bouncer, workers):
    env = pooled(bouncer)
    job = tasks.short_lease.enqueue("crash", seconds=30)
    first = workers.start("--worker-id", "first", env=env)
    wait_for(lambda: status_of(job) == "running", message="the first worker to claim the job")
    first.kill()  # SIGKILL mid-job: PgBouncer sees its client connections vanish
    first.wait(timeout=10)
    second = workers.start("--worker-id", "second", env=env)
    wait_for(lambda: status_of(job) == "succeeded", timeout=90, message="the second worker to finish it")
    assert (job.attempts, job.reappearances, job.worker_id) == (2, 1, "second")
    assert list(Execution.objects.values_list("attempt", flat=True)) == [2]
    assert LedgerEntry.objects.get(effect_key="crash").job_id == job.pk
    assert_clean_logs(workers, [second])


def test_a_frozen_workers_late_ack_through_pgbouncer_is_refused(bouncer, workers):
    env = pooled(bouncer)
    job = tasks.short_lease.enqueue("stale", seconds=4, per_attempt=True)
    frozen = workers.start("--worker-id", "frozen", env=env)
    wait_for(lambda: status_of(job) == "running", message="the first worker to claim the job")
    frozen.send_signal(signal.SIGSTOP)  # no heartbeat: its 2 s lease runs out
    workers.start("--worker-id", "healthy", env=env)
    wait_for(lambda: status_of(job) == "succeeded", timeout=90, message="the healthy worker to finish it")
    frozen.send_signal(signal.SIGCONT)
    wait_for(lambda: "ack_rejected" in workers.log(frozen), timeout=60, message="the stale ack to be refused")
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker_id) == ("succeeded", 2, "healthy")
    # The stale attempt's effect rolled back with its refused ack.
    assert list(LedgerEntry.objects.values_list("effect_key", flat=True)) == ["stale:2"]


@pytest.mark.slow
def test_database_locks_through_pgbouncer_never_overlap(bouncer, workers):
    resources = [f"r{index}" for index in range(4)]
    count = 160
    tasks_locks.interval.bulk_enqueue([((resources[index % 4],), {}) for index in range(count)])
    env = {**pooled(bouncer), "JOBGUARD_TEST_LOCK_BACKEND": "database"}
    procs = [workers.start("--concurrency", "2", env=env) for _ in range(3)]
    wait_for(
        lambda: Job.objects.filter(status="succeeded").count() == count,
        timeout=600,
        interval=0.5,
        message=f"all {count} locked jobs to succeed",
    )
    runs = assert_runs_never_overlap()
    assert sum(len(intervals) for intervals in runs.values()) == count
    assert_clean_logs(workers, procs)


def test_an_idle_worker_behind_pgbouncer_wakes_on_notify_through_the_direct_alias(bouncer, workers):
    proc = workers.start("--poll-interval", "600", "--reaper-interval", "600", env=pooled(bouncer))
    workers.wait_started(proc)
    assert "listening alias=direct" in workers.log(proc)
    job = tasks.add.enqueue(2, b=3)
    # Polling and reaping are 10 minutes apart: only the NOTIFY can wake the worker in time.
    wait_for(lambda: status_of(job) == "succeeded", timeout=30, message="the NOTIFY to wake the worker")
    assert job.result == 5


def test_without_a_listen_alias_a_pooled_worker_polls_instead_of_listening(bouncer, workers):
    proc = workers.start("--poll-interval", "0.2", env=pooled(bouncer, listen_alias=False))
    workers.wait_started(proc)
    log = workers.log(proc)
    assert "listen_disabled reason=pooled_database" in log
    assert "listening alias=" not in log
    job = tasks.add.enqueue(4, b=5)
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="a poll to find the job")
    # No LISTEN reached a pooled server connection.
    with through_bouncer(bouncer) as conn:
        assert conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)


def test_enqueue_and_the_admin_work_through_the_pooled_alias(bouncer, workers):
    make_superuser("admin")
    result = subprocess.run(
        [sys.executable, "-m", "tests.processes.pooled_client", "5"],
        cwd=ROOT,
        env=worker_env(**pooled(bouncer)),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    seen = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert seen["port"] == str(bouncer.port)
    assert seen["admin_status"] == 200
    assert seen["admin_lists_keyed_job"] is True
    assert seen["keyed"][0] == seen["keyed"][1]  # the idempotency key deduplicated through the pooler
    assert Job.objects.filter(pk__in=seen["jobs"]).count() == 5
    proc = workers.start(env=pooled(bouncer))
    wait_for(
        lambda: Job.objects.filter(status="succeeded").count() == 6, timeout=120, message="the 6 jobs to run"
    )
    assert sorted(LedgerEntry.objects.values_list("effect_key", flat=True)) == sorted(
        [f"pooled:{index}" for index in range(5)] + ["pooled:keyed"]
    )
    assert_clean_logs(workers, [proc])
