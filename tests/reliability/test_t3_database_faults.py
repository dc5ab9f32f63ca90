"""T3: worker database connections terminated every 1-5 s, plus (opt-in) a PostgreSQL restart.

``pg_terminate_backend`` cuts every connection the workers hold to the test database
(claims, executors, heartbeats, LISTEN) at random moments. Nothing may be lost or take
effect twice, and no worker may die: all of them must be alive at the end, each started
once. The restart step needs ``--reliability-pg-restart-cmd``: it restarts the whole
server, so it is skipped on a shared one.
"""

import subprocess
import time

import pytest
from django.db import connection

from tests.conftest import wait_for

from .harness import (
    Pool,
    check,
    django_backend_pid,
    enqueue_probes,
    observer_connection,
    open_jobs,
    run_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]


@pytest.mark.scenario("T3")
def test_t3_terminated_connections_lose_nothing_and_crash_no_worker(scenario, observer, workers):
    rng = scenario.rng
    history = scenario.history
    total = scenario.size(1000)
    restart_cmd = scenario.request.config.getoption("--reliability-pg-restart-cmd")
    scenario.parameters = {
        "jobs": total,
        "workers": 3,
        "concurrency": 3,
        "terminate_interval_seconds": [1, 5],
        "postgres_restart": bool(restart_cmd),
    }
    if not restart_cmd:
        scenario.skipped_steps["postgres_restart"] = (
            "needs --reliability-pg-restart-cmd: restarting the shared PostgreSQL would break "
            "every other test run on this server"
        )
    calls = []
    for i in range(total):
        kwargs = {"marker": f"t3-{i}", "seconds": round(rng.uniform(0.02, 0.15), 3)}
        if rng.random() < 0.03:
            kwargs["seconds"] = round(rng.uniform(1.7, 2.0), 2)  # heartbeats while connections die
        calls.append(((), kwargs))
    enqueue_probes(history, calls)
    pool = Pool(workers, history, observer, size=3, concurrency=3, respawn=False).start()
    pool.wait_started()
    own = {django_backend_pid()}
    terminated = []
    restarted = []
    state = {"observer": observer, "next": time.monotonic() + rng.uniform(1, 5)}
    restart_at = time.monotonic() + 10

    def chaos():
        if time.monotonic() < state["next"]:
            return
        conn = state["observer"]
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> ALL(%s) "
            "AND backend_type = 'client backend'",
            [list(own)],
        ).fetchall()
        terminated.append(len(rows))
        history.record("backends_terminated", count=len(rows))
        state["next"] = time.monotonic() + rng.uniform(1, 5)
        if restart_cmd and not restarted and time.monotonic() >= restart_at:
            history.record("postgres_restart")
            began = time.monotonic()
            subprocess.run(restart_cmd, shell=True, check=True, timeout=120)  # noqa: S602 - the user's own command
            state["observer"].close()
            wait_for(_reachable, timeout=120, message="PostgreSQL to accept connections again")
            state["observer"] = observer_connection()
            connection.close()
            own.clear()
            own.add(django_backend_pid())
            restarted.append(round(time.monotonic() - began, 2))

    drained = run_until(lambda: open_jobs(state["observer"]) == 0, timeout=300 * scenario.scale, tick=chaos)
    alive = [s.worker_id for s in pool.live()]
    exit_codes = pool.stop()
    if state["observer"] is not observer:
        state["observer"].close()

    events = history.events()
    worker_errors = {
        name: sum(1 for e in events if e["event"] == name)
        for name in ("claim_failed", "job_db_error", "heartbeat_failed", "listen_lost", "job_crashed")
    }
    figures = check(history, deaths=pool.deaths)
    violations = scenario.finish(
        **figures,
        drained=drained,
        terminations=len(terminated),
        backends_terminated=sum(terminated),
        postgres_restart_seconds=restarted or None,
        worker_errors_logged=worker_errors,
        workers_alive_at_end=len(alive),
        workers_started=len(pool.started),
        exit_codes=exit_codes,
    )

    assert drained, figures["statuses"]
    assert sum(terminated) > 0, "no worker connection was ever terminated"
    assert len(alive) == 3 and len(pool.started) == 3, (alive, pool.started)
    assert set(exit_codes.values()) == {0}, exit_codes
    assert (figures["lost"], figures["unexpected"]) == (0, 0), figures
    assert (figures["duplicated_executions"], figures["duplicate_effects"]) == (0, 0), figures
    assert (figures["missing_effects"], figures["orphan_effects"]) == (0, 0), figures
    # A job whose every attempt lost its connection mid-run may end in the dead-letter
    # queue (terminal, with its reason); none may end anywhere else.
    assert figures["statuses"].get("succeeded", 0) + figures["statuses"].get("dead", 0) == total
    assert all(
        d["reason"] == "retries_exhausted" and "OperationalError" in d["error"]
        for d in figures["dead_letter_samples"]
    ), figures["dead_letter_samples"]
    assert not any(violations.values()), violations


def _reachable():
    try:
        observer_connection().close()
    except Exception:
        return False
    return True


@pytest.mark.scenario("T3-idle")
def test_an_idle_workers_dropped_connections_cost_the_next_job_no_attempt(scenario, observer, workers):
    # Found by T3: after its connections were cut while idle (a restart, a failover, a
    # pooler's idle timeout), every executor failed its next job with OperationalError,
    # charging the job an attempt; with several idle executors one job could bounce
    # between them until it was dead-lettered.
    pool = Pool(workers, scenario.history, observer, size=1, concurrency=3, respawn=False).start()
    pool.wait_started()
    first = enqueue_probes(scenario.history, [((), {"marker": f"t3-warm-{i}"}) for i in range(6)])
    wait_for(lambda: open_jobs(observer, first) == 0, timeout=60, message="the warm-up jobs")
    cut = observer.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND pid <> %s AND backend_type = 'client backend'",
        [django_backend_pid()],
    ).fetchall()
    time.sleep(1.5)  # idle long enough for the executors to check before the next job
    after = enqueue_probes(scenario.history, [((), {"marker": f"t3-next-{i}"}) for i in range(6)])
    wait_for(lambda: open_jobs(observer, after) == 0, timeout=60, message="the jobs after the cut")
    exit_codes = pool.stop()
    attempts = sorted(
        observer.execute("SELECT attempts FROM jobguard_job WHERE id = ANY(%s)", [after]).fetchall()
    )
    violations = scenario.finish(connections_cut=len(cut), attempts_after_cut=[a for (a,) in attempts])
    assert len(cut) >= 3
    assert [a for (a,) in attempts] == [1] * 6
    assert set(exit_codes.values()) == {0}
    assert not any(violations.values()), violations
