"""A database failover mid-run: the primary dies, the standby is promoted, nothing acknowledged is lost.

The test builds its own primary and streaming standby (``tests/support/pg_replica.py``; the
suite's PostgreSQL is not touched), with synchronous replication. Four real worker
processes and an enqueuer run against the multi-host settings (``HOST "127.0.0.1,127.0.0.1"``,
``PORT "p1,p2"``, ``target_session_attrs=read-write``); the primary is stopped with
``-m immediate`` while jobs run and enqueues arrive, and the standby is promoted. Nobody
restarts the workers or tells them where the new primary is.

``JOBGUARD_TEST_FAILOVER_JOBS`` sets the job count (default 20,000: about 3 minutes on two
busy cores); ``python benchmarks/bench_failover.py`` adds asynchronous replication and a lagging
standby.
The figures go to the test's output and to ``artifacts/failover/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import failover, pg_replica

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

JOBS = int(os.environ.get("JOBGUARD_TEST_FAILOVER_JOBS", "20000"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "failover"


@pytest.fixture(autouse=True)
def _needs_binaries() -> None:
    reason = pg_replica.missing_reason()
    if reason:
        pytest.skip(reason)


def test_a_promoted_standby_loses_no_acknowledged_enqueue_and_doubles_no_atomic_effect(tmp_path):
    figures = failover.run(tmp_path, jobs=JOBS, synchronous=True, timeout=600)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "synchronous.json").write_text(json.dumps(figures, indent=2, default=str))
    print(json.dumps(figures, indent=2, default=str))

    # The scenario did what it says: jobs ran and enqueues arrived on both sides of the failover.
    assert figures["finished_before_failover"] >= JOBS * failover.FAIL_AT
    assert figures["enqueued_after_failover"] > 0, figures
    logged = figures["worker_errors_logged"]
    assert logged["claim_failed"] + logged["heartbeat_failed"] > 0, "the workers never saw the primary go"
    # Nothing acknowledged is lost, every job finished, no atomic effect committed twice.
    assert figures["acked_enqueues"] == JOBS
    assert figures["acked_enqueues_lost"] == 0, figures
    assert figures["statuses"] == {"succeeded": JOBS}, figures["statuses"]
    assert figures["atomic_effects_doubled"] == 0, figures
    assert figures["atomic_succeeded_without_effect"] == 0, figures
    assert figures["promotion_to_first_completion_seconds"] is not None
    # The workers reconnected by themselves: alive all along, and a clean exit when told to stop.
    assert figures["workers_alive_at_end"] == 4
    assert figures["worker_exit_codes"] == [0, 0, 0, 0]
    assert figures["worker_threads_died"] == 0
