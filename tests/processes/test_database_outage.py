"""The database away for a long while: workers back off, log once per interval, stay up and resume.

The test owns its PostgreSQL (``tests/support/pg_replica.py``). Two real workers run; the
primary is stopped for ``JOBGUARD_TEST_OUTAGE_SECONDS`` (default 40; the figures in the docs
come from 180) and started again. Nobody restarts the workers. Then one worker alone loses
its network path to the database (a TCP forwarder cut) while it holds a job: another worker
re-runs the job once its lease runs out, and the cut-off worker's late ack is refused.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import failover, pg_replica
from tests.support.failover import WORKER, Observer, env_for, run_command, wait_until
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

OUTAGE_SECONDS = float(os.environ.get("JOBGUARD_TEST_OUTAGE_SECONDS", "40"))
#: What a worker logs about the database being away (the claim loop, the heartbeat, LISTEN).
OUTAGE_LINES = re.compile(
    r"claim_failed|heartbeat_failed|database_still_unreachable|listen_failed|listen_lost|job_db_error"
)


@pytest.fixture
def cluster() -> Iterator[pg_replica.ReplicatedPostgres]:
    reason = pg_replica.missing_reason()
    if reason:
        pytest.skip(reason)
    server = pg_replica.ReplicatedPostgres(synchronous=False)
    try:
        server.start()
        run_command([sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"], env_for(server))
        yield server
    finally:
        server.stop()


class Workers:
    def __init__(self, cluster: pg_replica.ReplicatedPostgres, log_dir: Path) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, **env: str) -> subprocess.Popen[bytes]:
        with (self.log_dir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [*WORKER, "--worker-id", name, "--concurrency", "2"],
                env=env_for(self.cluster, JOBGUARD_TEST_LOG_LEVEL="INFO", **env),
                cwd=failover.ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        wait_until(lambda: "worker_started" in self.log(name), 60, f"worker {name} to start")
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> dict[str, int]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return {name: proc.wait(timeout=60) for name, proc in self.procs.items()}

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def workers(cluster, tmp_path) -> Iterator[Workers]:
    pool = Workers(cluster, tmp_path)
    yield pool
    pool.kill()


def enqueue(cluster: pg_replica.ReplicatedPostgres, code: str) -> None:
    script = f"import django; django.setup(); from tests.testapp import tasks; {code}"
    run_command([sys.executable, "-c", script], env_for(cluster))


def test_workers_ride_out_a_long_outage_with_one_log_line_per_interval_and_resume(cluster, workers):
    observer = Observer(cluster)
    first = workers.start("first")
    second = workers.start("second")
    enqueue(cluster, "tasks.record_atomic.bulk_enqueue([((f'before-{n}',), {}) for n in range(20)])")
    wait_until(lambda: observer.count("status = 'succeeded'") == 20, 60, "the jobs before the outage")
    observer.close()
    before = {name: len(workers.log(name)) for name in ("first", "second")}

    cluster.stop_primary()
    stopped = time.monotonic()
    # The outage is the thing under test: it lasts OUTAGE_SECONDS whatever the workers do.
    while time.monotonic() - stopped < OUTAGE_SECONDS:
        assert first.poll() is None and second.poll() is None, "a worker exited while the database was away"
        time.sleep(1)
    cluster.start_primary()
    for name in ("first", "second"):
        wait_until(
            lambda n=name: "database_reachable" in workers.log(n), 60, f"{name} to see the database back"
        )
    enqueue(cluster, "tasks.record_atomic.bulk_enqueue([((f'after-{n}',), {}) for n in range(20)])")
    wait_until(lambda: observer.count("status = 'succeeded'") == 40, 120, "the jobs after the outage")
    # Both beat again: the admin and jobguard_status count them live (their rows went stale
    # while the database was away). Waited for: a loaded machine may delay a beat past the
    # moment the last job finished.
    wait_until(
        lambda: (
            observer.query(
                "SELECT count(*) FROM jobguard_workerbeat WHERE last_beat_at >= now() - interval '15 seconds'"
            )
            == [(2,)]
        ),
        60,
        "both workers to beat again",
    )
    observer.close()
    exit_codes = workers.stop()

    assert exit_codes == {"first": 0, "second": 0}
    for name in ("first", "second"):
        during = workers.log(name)[before[name] :]
        lines = [line for line in during.splitlines() if OUTAGE_LINES.search(line)]
        # Per interval: one line of the claim loop/heartbeat and one of LISTEN, plus the first
        # failure of each and the LISTEN connection lost; not one per try.
        allowed = 4 + 2 * int(OUTAGE_SECONDS // 30 + 1)
        assert 1 <= len(lines) <= allowed, (name, len(lines), lines)
        assert during.count("database_reachable") == 1
        assert "worker_thread_died" not in during and "worker_started" not in during


def test_a_worker_cut_off_from_the_database_does_not_ack_the_job_whose_lease_ran_out(
    cluster, workers, tmp_path
):
    observer = Observer(cluster)
    proxy = TcpProxy(cluster.primary_port)
    release = tmp_path / "release"
    try:
        stale = workers.start("stale", JOBGUARD_TEST_FAILOVER_PORTS=str(proxy.port))
        # Not atomic: no transaction is open while it waits, so what fails is its ack. It waits
        # for the release file, not a time: its ack must come after the link is back, however
        # long the other worker takes to start on a loaded host.
        enqueue(cluster, f"tasks.short_lease_plain.enqueue('cut-off', path={str(release)!r})")
        wait_until(
            lambda: Path(f"{release}.started").exists(),
            60,
            "the job's handler to start on the worker about to be cut off",
        )
        assert observer.query("SELECT worker_id FROM jobguard_job WHERE status = 'running'") == [("stale",)]
        proxy.cut()
        workers.start("healthy")
        wait_until(
            lambda: (
                observer.query("SELECT status, worker_id FROM jobguard_job") == [("succeeded", "healthy")]
            ),
            60,
            "the healthy worker to re-run the job once its 2 s lease ran out",
        )
        proxy.restore()
        release.touch()
        wait_until(lambda: "ack_rejected" in workers.log("stale"), 60, "the cut-off worker's late ack")
        job = observer.query("SELECT status, worker_id, attempts, result FROM jobguard_job")
        runs = observer.query("SELECT attempt FROM testapp_execution ORDER BY attempt")
        assert stale.poll() is None, "the cut-off worker exited"
    finally:
        proxy.close()
        observer.close()
    assert workers.stop() == {"stale": 0, "healthy": 0}
    # Both attempts ran (the handler is not atomic); the result is the second one's, whose
    # worker held the lease: the stale worker's ack, which would have written 1, was refused.
    assert runs == [(1,), (2,)], runs
    assert job == [("succeeded", "healthy", 2, 2)], job
