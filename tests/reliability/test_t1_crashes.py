"""T1: workers SIGKILLed at random (and respawned) plus every fault point at p=0.01.

2,000 jobs: atomic probes (some slow enough to heartbeat, some failing once, a few
failing for good) and external-effect probes calling a loopback provider with the job's
idempotency key. Some enqueues are rolled back on purpose.
"""

import os
import time

import pytest

from tests.testapp import tasks_faults

from .harness import (
    FAULT_POINTS,
    RECOVERY_BOUND,
    Pool,
    check,
    enqueue_probes,
    open_jobs,
    run_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

FAULT_PROBABILITY = 0.01
#: After the last kill every job must be terminal within this many seconds.
SETTLE_SECONDS = 60


@pytest.mark.scenario("T1")
def test_t1_random_kills_and_fault_points_lose_nothing_and_duplicate_no_effect(
    scenario, observer, workers, stub
):
    rng = scenario.rng
    total = scenario.size(2000)
    external = total // 20
    faults = ",".join(f"{point}={FAULT_PROBABILITY}" for point in FAULT_POINTS)
    scenario.parameters = {
        "jobs": total,
        "external_jobs": external,
        "workers": "4 killed at random and respawned, plus 1 steady worker (never killed, no faults)",
        "concurrency": 3,
        "batch_size": 3,
        "kill_interval_seconds": [0.5, 3.0],
        "faults": faults,
        "lease_seconds": tasks_faults.LEASE_SECONDS,
    }

    calls, failing = [], 0
    for i in range(total - external):
        roll = rng.random()
        kwargs = {"marker": f"t1-{i}", "seconds": round(rng.uniform(0.02, 0.2), 3)}
        if roll < 0.02:
            kwargs["seconds"] = round(rng.uniform(2, 2.5), 2)  # past a third of the lease: heartbeats
        elif roll < 0.07:
            kwargs["fail"] = "first"
        elif roll < 0.08:
            kwargs["fail"] = "always"
            failing += 1
        calls.append(((), kwargs))
    enqueue_probes(scenario.history, calls, rng=rng, fail_ratio=0.1, chunk=100)
    external_ids = []
    for i in range(external):
        marker = f"t1-ext-{i}"
        job = tasks_faults.probe_external.using(idempotency_key=f"charge:{marker}").enqueue(
            marker=marker, url=stub.url, seconds=round(rng.uniform(0.02, 0.2), 3)
        )
        external_ids.append(job.pk)
    scenario.history.record("enqueue_ok", job_ids=external_ids, count=len(external_ids))

    pool = Pool(
        workers,
        scenario.history,
        observer,
        size=4,
        concurrency=3,
        extra_args=["--batch-size", "3"],  # a death orphans at most what was running
        faults=faults,
        seed=str(scenario.seed),
    ).start()
    # One worker is never killed and has no fault points: recovery needs a live reaper,
    # and in production not every worker dies at once.
    steady = Pool(workers, scenario.history, observer, size=1, concurrency=1, name="steady").start()
    next_kill = [time.monotonic() + rng.uniform(0.5, 3.0)]

    def chaos():
        pool.reap_exits()
        if time.monotonic() >= next_kill[0]:
            live = pool.live()
            if live:
                pool.kill(rng.choice(live))
            next_kill[0] = time.monotonic() + rng.uniform(0.5, 3.0)

    began = time.time()
    drained = run_until(lambda: open_jobs(observer) == 0, timeout=300 * scenario.scale, tick=chaos)
    drained_at = time.time()
    if not drained:
        # Stop the chaos and give the survivors the settle time the contract promises.
        pool.faults = ""
        drained = run_until(lambda: open_jobs(observer) == 0, timeout=SETTLE_SECONDS, tick=pool.reap_exits)
        drained_at = time.time()
    exit_codes = {**pool.stop(), **steady.stop()}
    last_death = max((d.at for d in pool.deaths), default=began)

    figures = check(scenario.history, deaths=pool.deaths)
    provider = stub.figures()
    succeeded_external = _succeeded_markers(tasks_faults.probe_external.name)
    external_missing = sorted(m for m in succeeded_external if stub.applied.get(m, 0) != 1)
    violations = scenario.finish(
        **figures,
        external=provider,
        external_missing_effects=len(external_missing),
        drained=drained,
        chaos_seconds=round(drained_at - began, 2),
        terminal_seconds_after_last_kill=round(max(0.0, drained_at - last_death), 2),
        expected_dead=failing,
        load_average=os.getloadavg(),
        exit_codes=exit_codes,
    )

    assert drained, f"jobs still open {SETTLE_SECONDS}s after the chaos: {figures['statuses']}"
    assert (figures["lost"], figures["unexpected"]) == (0, 0), figures
    assert figures["duplicated_executions"] == 0, figures
    assert figures["duplicate_effects"] == 0, figures
    assert (figures["missing_effects"], figures["orphan_effects"]) == (0, 0), figures
    assert provider["duplicate_effects"] == 0, provider
    assert provider["keyless_requests"] == 0, provider
    assert external_missing == [], external_missing[:10]
    assert figures["statuses"] == {"succeeded": total - failing, "dead": failing}, figures
    assert figures["dead_letter_reasons"] == ({"permanent_error": failing} if failing else {}), figures
    assert figures["worker_deaths"]["harness"] > 0 and figures["worker_deaths"]["self"] > 0, figures
    assert figures["recovered"] > 0, figures
    assert max(0.0, drained_at - last_death) <= SETTLE_SECONDS
    assert figures["recovery"]["unrecovered"] == 0, figures["recovery"]
    # A timing bound: on a machine loaded by other work the reaper can be late; the
    # artifact records the load average next to the figure.
    assert figures["recovery"]["max_seconds"] <= RECOVERY_BOUND, (figures["recovery"], os.getloadavg())
    assert not any(violations.values()), violations


def _succeeded_markers(task_name):
    from django_jobguard.models import Job

    return [
        kwargs["marker"]
        for kwargs in Job.objects.filter(task_name=task_name, status="succeeded").values_list(
            "kwargs", flat=True
        )
    ]
