"""T6: workers whose clocks are five minutes fast or slow.

``JOBGUARD_TEST_CLOCK_OFFSET`` (handled in ``tests/settings.py``) shifts a worker's
``time.time()`` and ``django.utils.timezone.now()``. Leases, heartbeats, the reaper and
``run_after`` must follow the database clock only: a fast worker's reaper must not take
live jobs away, and no worker may start a job (or a retry) before its ``run_after``.
"""

import collections
import datetime

import pytest
from django.db.models import F

from django_jobguard.models import Job
from tests.testapp import tasks_faults
from tests.testapp.models import JobTransition

from .harness import LEASE, Pool, check, enqueue_probes, open_jobs, run_until

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

SKEW_SECONDS = 300


@pytest.mark.scenario("T6")
def test_t6_skewed_worker_clocks_cause_no_early_start_and_no_premature_reclaim(scenario, observer, workers):
    history = scenario.history
    rng = scenario.rng
    slow, scheduled, retried, quick = 6, scenario.size(20), scenario.size(10), scenario.size(100)
    scenario.parameters = {
        "skews_seconds": [SKEW_SECONDS, -SKEW_SECONDS, 0],
        "slow_jobs": slow,
        "slow_seconds": 2.4 * LEASE,
        "scheduled_jobs": scheduled,
        "retried_jobs_retry_after_seconds": 3,
        "retried_jobs": retried,
        "quick_jobs": quick,
    }
    pools = {
        name: Pool(
            workers,
            history,
            observer,
            size=1,
            concurrency=3,
            extra_args=["--batch-size", "3"],
            env={"JOBGUARD_TEST_CLOCK_OFFSET": str(offset)},
            name=name,
        ).start()
        for name, offset in (("fast", SKEW_SECONDS), ("slow", -SKEW_SECONDS), ("true", 0))
    }
    for pool in pools.values():
        pool.wait_started()
    enqueue_probes(history, [((), {"marker": f"t6-slow-{i}", "seconds": 2.4 * LEASE}) for i in range(slow)])
    for i in range(scheduled):
        delay = datetime.timedelta(seconds=rng.uniform(2, 8))
        job = tasks_faults.probe.using(run_after=delay).enqueue(marker=f"t6-at-{i}")
        history.record("enqueue_ok", job_ids=[job.pk], count=1)
    enqueue_probes(
        history, [((), {"marker": f"t6-retry-{i}", "fail": "first-retry-after-3"}) for i in range(retried)]
    )
    enqueue_probes(history, [((), {"marker": f"t6-q-{i}", "seconds": 0.05}) for i in range(quick)])

    drained = run_until(lambda: open_jobs(observer) == 0, timeout=180)
    exit_codes = {wid: code for pool in pools.values() for wid, code in pool.stop().items()}

    events = history.events()
    spawned = {e["worker_id"]: e["t"] for e in events if e["event"] == "worker_spawned"}
    observed_offsets = {
        e["source"]: round(e["t"] - spawned[e["source"]])
        for e in events
        if e["event"] == "process_started" and e["source"] in spawned
    }
    claims = JobTransition.objects.filter(new_status="running")
    early_starts = claims.filter(at__lt=F("run_after")).count()
    # Without faults, every lease the reaper judged expired was taken away prematurely.
    premature_reclaims = Job.objects.filter(reappearances__gt=0).count()
    slow_claims = sorted(
        claims.filter(
            job_id__in=Job.objects.filter(kwargs__marker__startswith="t6-slow").values("id")
        ).values_list("job_id", flat=True)
    )
    claims_by_worker = collections.Counter(claims.values_list("worker_id", flat=True))
    figures = check(history)
    violations = scenario.finish(
        **figures,
        drained=drained,
        observed_clock_offsets=observed_offsets,
        claims_by_worker=dict(claims_by_worker),
        early_starts=early_starts,
        premature_reclaims=premature_reclaims,
        slow_job_claims=len(slow_claims),
        scheduled_claims_checked=claims.count(),
        exit_codes=exit_codes,
    )

    assert drained, figures["statuses"]
    # The skew really was in force (seconds between spawning and the worker's first event).
    assert observed_offsets["fast0g0"] >= SKEW_SECONDS - 30, observed_offsets
    assert observed_offsets["slow0g0"] <= -SKEW_SECONDS + 30, observed_offsets
    assert all(claims_by_worker[w] > 0 for w in ("fast0g0", "slow0g0")), claims_by_worker
    assert early_starts == 0
    assert premature_reclaims == 0
    assert figures["reappearances"] == 0
    assert len(slow_claims) == len(set(slow_claims)) == slow, slow_claims
    assert set(
        Job.objects.filter(kwargs__marker__startswith="t6-slow").values_list("attempts", flat=True)
    ) == {1}
    assert figures["statuses"] == {"succeeded": slow + scheduled + retried + quick}
    assert (figures["lost"], figures["duplicated_executions"], figures["duplicate_effects"]) == (0, 0, 0)
    assert set(exit_codes.values()) == {0}, exit_codes
    assert not any(violations.values()), violations
