"""The failover scenario: real workers and enqueuers while the primary dies and the standby is promoted.

Shared by ``tests/processes/test_failover.py`` (asserts on the figures) and
``benchmarks/bench_failover.py`` (runs it at full size, synchronous and asynchronous, and prints
them). Everything talks to a :class:`~tests.support.pg_replica.ReplicatedPostgres` of its
own through the multi-host settings in ``tests/settings.py`` (``JOBGUARD_TEST_FAILOVER_PORTS``).

What it does: migrate, enqueue half the jobs in bulk, start the workers and an enqueuer that
enqueues the other half one keyed job at a time, stop the primary with ``-m immediate`` once a
quarter of the jobs finished, promote the standby, wait until every job is finished, stop the
workers, then start the old primary on its own to compare what it committed with what survived.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from .pg_replica import DATABASE, ReplicatedPostgres

ROOT = Path(__file__).resolve().parents[2]
#: Share of the jobs enqueued in bulk before the workers start; the rest arrive during the run.
PRELOADED = 0.5
#: Share of the jobs finished when the primary is stopped.
FAIL_AT = 0.25
#: Worker log events counted in the figures.
WORKER_EVENTS = (
    "claim_failed",
    "job_db_error",
    "heartbeat_failed",
    "ack_failed",
    "listen_failed",
    "lease_lost",
)
TERMINAL = ("succeeded", "dead")
WORKER = [sys.executable, "-m", "django", "jobguard_worker"]


def env_for(cluster: ReplicatedPostgres, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("JOBGUARD_TEST_DB_NAME", None)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        JOBGUARD_TEST_FAILOVER_PORTS=cluster.ports,
        JOBGUARD_TEST_FAILOVER_DB=DATABASE,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),
    )
    env.update(extra)
    return env


def run_command(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=600, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(command[1:])} exited with {done.returncode}: {output}")


def wait_until(predicate: Callable[[], bool], timeout: float, message: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class Observer:
    """A connection that follows the primary (multi-host, read-write), reopened after errors."""

    def __init__(self, cluster: ReplicatedPostgres) -> None:
        self.conninfo = cluster.conninfo()
        self.conn: psycopg.Connection[Any] | None = None

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]] | None:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(self.conninfo, autocommit=True)
            return self.conn.execute(sql, params).fetchall()
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            return None

    def count(self, where: str) -> int | None:
        rows = self.query(f"SELECT count(*) FROM jobguard_job WHERE {where}")
        return None if rows is None else int(rows[0][0])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def run(
    work_dir: Path,
    *,
    jobs: int,
    synchronous: bool = True,
    workers: int = 4,
    concurrency: int = 4,
    timeout: float = 600,
    standby_lag: float = 0.0,
) -> dict[str, Any]:
    """Run the scenario once on fresh clusters (removed at the end); the figures as a dict.

    ``standby_lag``: seconds for which the standby receives nothing before the primary dies
    (its link held, then reset): the lag of a standby behind a slow or congested network.
    """
    cluster = ReplicatedPostgres(synchronous=synchronous, lagging_link=standby_lag > 0)
    procs: list[subprocess.Popen[bytes]] = []
    observer = Observer(cluster)
    try:
        cluster.start()
        env = env_for(cluster)
        run_command([sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"], env)
        preloaded = int(jobs * PRELOADED)
        acked_bulk = work_dir / "enqueued-bulk.txt"
        acked_trickle = work_dir / "enqueued-trickle.txt"
        enqueuer = [sys.executable, "-m", "tests.processes.failover_enqueuer"]
        run_command([*enqueuer, str(acked_bulk), "0", str(preloaded), "1000"], env)
        worker_env = env_for(cluster, JOBGUARD_TEST_LOG_LEVEL="INFO")
        logs = [work_dir / f"worker-{index}.log" for index in range(workers)]
        for path in logs:
            with path.open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [*WORKER, "--concurrency", str(concurrency)],
                        cwd=ROOT,
                        env=worker_env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        with (work_dir / "enqueuer.log").open("wb") as log:
            trickle = subprocess.Popen(
                [*enqueuer, str(acked_trickle), str(preloaded), str(jobs - preloaded)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs.append(trickle)
        started = time.monotonic()

        wait_until(
            lambda: (observer.count("status = 'succeeded'") or 0) >= jobs * FAIL_AT,
            timeout,
            f"{FAIL_AT:.0%} of the jobs to finish before the failover",
        )
        finished_before = observer.count("status = 'succeeded'")
        enqueued_before = len(_lines(acked_trickle))
        observer.close()
        if cluster.link is not None:
            cluster.link.hold()
            time.sleep(standby_lag)  # the injected lag: the standby hears nothing meanwhile
        began = time.monotonic()
        cluster.stop_primary_immediately()
        stopped = time.monotonic()
        if cluster.link is not None:
            cluster.link.drop()
        cluster.promote_standby()
        promoted_at = datetime.datetime.now(datetime.UTC)
        promoted = time.monotonic()

        def drained() -> bool:
            if trickle.poll() is None:
                return False
            open_jobs = observer.count(f"status NOT IN {TERMINAL}")
            return open_jobs == 0

        wait_until(drained, timeout, "every job to finish after the promotion", interval=0.5)
        drained_after = time.monotonic() - promoted
        alive = sum(1 for proc in procs[:workers] if proc.poll() is None)
        for proc in procs[:workers]:
            proc.send_signal(signal.SIGTERM)
        exit_codes = [proc.wait(timeout=120) for proc in procs[:workers]]
        elapsed = time.monotonic() - started

        acked = [line for line in _lines(acked_bulk) + _lines(acked_trickle) if line.startswith("fo-")]
        tail = _lines(acked_trickle)[-1:] or [""]
        retries = int(tail[0].split("=")[1]) if tail[0].startswith("done retries=") else None
        rows = observer.query("SELECT args->>0, status FROM jobguard_job") or []
        status_of = dict(rows)
        executions = Counter(
            marker for (marker,) in observer.query("SELECT marker FROM testapp_execution") or []
        )
        first_after = observer.query(
            "SELECT min(finished_at) FROM jobguard_job WHERE status = 'succeeded' AND finished_at > %s",
            [promoted_at],
        )
        first_done = first_after[0][0] if first_after else None
        atomic = [m for m in acked if int(m[3:]) % 2 == 0]
        plain = [m for m in acked if int(m[3:]) % 2 == 1]
        worker_logs = [path.read_text(errors="replace") for path in logs]
        figures: dict[str, Any] = {
            "replication": "synchronous" if synchronous else "asynchronous",
            "standby_lag_seconds": standby_lag,
            "jobs": jobs,
            "workers": f"{workers}x{concurrency}",
            "acked_enqueues": len(acked),
            "acked_enqueues_lost": sum(1 for m in acked if m not in status_of),
            "statuses": dict(Counter(status_of.values())),
            "atomic_effects_doubled": sum(1 for m in atomic if executions[m] > 1),
            "atomic_succeeded_without_effect": sum(
                1 for m in atomic if status_of.get(m) == "succeeded" and executions[m] == 0
            ),
            "plain_reruns": sum(max(0, executions[m] - 1) for m in plain),
            "finished_before_failover": finished_before,
            "enqueued_during_run_before_failover": enqueued_before,
            "enqueued_after_failover": len(_lines(acked_trickle)) - 1 - enqueued_before,
            "enqueue_retries": retries,
            "stop_seconds": round(stopped - began, 2),
            "promote_seconds": round(promoted - stopped, 2),
            "promotion_to_first_completion_seconds": (
                round((first_done - promoted_at).total_seconds(), 2) if first_done else None
            ),
            "promotion_to_all_finished_seconds": round(drained_after, 1),
            "workers_alive_at_end": alive,
            "worker_exit_codes": exit_codes,
            "worker_errors_logged": {
                name: sum(log.count(name) for log in worker_logs) for name in WORKER_EVENTS
            },
            "worker_threads_died": sum(log.count("worker_thread_died") for log in worker_logs),
            "elapsed_seconds": round(elapsed, 1),
        }
        observer.close()
        figures.update(_compare_with_old_primary(cluster, status_of))
        return figures
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        observer.close()
        cluster.stop()


def _compare_with_old_primary(cluster: ReplicatedPostgres, status_of: dict[str, str]) -> dict[str, Any]:
    """Start the dead primary on its own (nothing else connects now) and see what only it holds.

    Commits only the old primary holds are the loss: with synchronous replication they were
    never acknowledged to a client (it was waiting for the standby when the server died);
    with asynchronous replication they were.
    """
    cluster.start_old_primary_alone()
    runs = "SELECT marker, attempt, pid FROM testapp_execution"
    with psycopg.connect(cluster.conninfo(port=cluster.primary_port), autocommit=True) as old:
        old_jobs = dict(old.execute("SELECT args->>0, status FROM jobguard_job").fetchall())
        old_runs = Counter(old.execute(runs).fetchall())
        old_last = old.execute("SELECT max(finished_at) FROM jobguard_job").fetchone()
    with psycopg.connect(cluster.conninfo(port=cluster.standby_port), autocommit=True) as new:
        new_runs = Counter(new.execute(runs).fetchall())
        last_old = old_last[0] if old_last else None
        survived_last = new.execute(
            "SELECT max(finished_at) FROM jobguard_job WHERE finished_at <= %s", [last_old]
        ).fetchone()
    only_old = old_runs - new_runs
    completions_lost = {marker for (marker, _, _) in only_old if old_jobs.get(marker) == "succeeded"}
    window = None
    if old_last and old_last[0] and survived_last and survived_last[0]:
        window = round((old_last[0] - survived_last[0]).total_seconds() * 1000, 1)
    return {
        "old_primary_only_enqueues": sum(1 for m in old_jobs if m not in status_of),
        "old_primary_only_effects": sum(only_old.values()),
        "old_primary_only_completions": len(completions_lost),
        "loss_window_ms": window,
    }
