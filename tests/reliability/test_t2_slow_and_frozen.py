"""T2: jobs running three times their lease stay leased by heartbeats; a frozen worker's do not.

Six probes of 3 x the lease run on three workers (two each). One worker is SIGSTOPped past
its lease: its two jobs must come back and be re-claimed by a fourth worker within the
recovery bound, while the four jobs on live workers are never re-claimed. Resumed, the
frozen worker's late acks are refused.
"""

import time

import pytest

from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.testapp.models import JobTransition, LedgerEntry

from .harness import LEASE, RECOVERY_BOUND, Death, Pool, check, enqueue_probes, open_jobs, recovery_times

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

SLOW_SECONDS = 3 * LEASE


@pytest.mark.scenario("T2")
def test_t2_heartbeats_keep_slow_jobs_and_a_frozen_workers_jobs_come_back(scenario, observer, workers):
    history = scenario.history
    scenario.parameters = {
        "slow_jobs": 6,
        "job_seconds": SLOW_SECONDS,
        "lease_seconds": LEASE,
        "frozen_for_seconds": 2 * LEASE + 2,
    }
    ids = enqueue_probes(history, [((), {"marker": f"t2-{i}", "seconds": SLOW_SECONDS}) for i in range(6)])
    live = Pool(
        workers, history, observer, size=2, concurrency=2, extra_args=["--batch-size", "2"], name="live"
    )
    frozen = Pool(
        workers, history, observer, size=1, concurrency=2, extra_args=["--batch-size", "2"], name="frz"
    )
    live.start()
    frozen.start()
    wait_for(
        lambda: Job.objects.filter(pk__in=ids, status="running").count() == 6,
        timeout=120,
        message="the three workers to claim two slow jobs each",
    )
    f = frozen.slots[0]
    wait_for(
        lambda: len(frozen.held_by(f.worker_id)) == 2, timeout=30, message="the frozen worker's two jobs"
    )
    paused_at = frozen.pause(f)
    held = frozen.held_by(f.worker_id)
    frozen_ids = {job_id for job_id, _ in held}
    live_ids = set(ids) - frozen_ids
    spare = Pool(workers, history, observer, size=1, concurrency=2, name="spare").start()

    wait_for(
        lambda: _claimed_by(frozen_ids, spare.slots[0].worker_id) == frozen_ids,
        timeout=60,
        message="the spare worker to re-claim the frozen worker's jobs",
    )
    time.sleep(max(0.0, paused_at + 2 * LEASE + 2 - time.time()))
    frozen.resume(f)
    wait_for(lambda: open_jobs(observer) == 0, timeout=120, message="every job to finish")
    wait_for(
        lambda: _stale_refusals(history, f.worker_id) >= 2,
        timeout=60,
        message="the resumed worker's two late acks to be refused",
    )
    exit_codes = {**live.stop(), **frozen.stop(), **spare.stop()}

    transitions = {}
    for t in JobTransition.objects.order_by("at", "id").values():
        transitions.setdefault(t["job_id"], []).append(t)
    returned = recovery_times(
        [Death(worker_id=f.worker_id, at=paused_at, cause="paused", returncode=None, orphans=held)],
        transitions,
    )
    reclaim_seconds = max(
        next(
            t["at"] for t in transitions[j] if t["new_status"] == "running" and t["worker_id"] != f.worker_id
        ).timestamp()
        - paused_at
        for j in frozen_ids
    )
    live_claims = {j: sum(1 for t in transitions[j] if t["new_status"] == "running") for j in live_ids}
    figures = check(history)
    violations = scenario.finish(
        **figures,
        live_job_claims=sorted(live_claims.values()),
        live_jobs_reclaimed=sum(1 for n in live_claims.values() if n > 1),
        frozen_jobs=len(frozen_ids),
        frozen_returned=returned,
        frozen_reclaim_max_seconds=round(reclaim_seconds, 3),
        frozen_stale_refusals=_stale_refusals(history, f.worker_id),
        heartbeats_refused_after_resume=sum(
            1 for e in history.events() if e["source"] == f.worker_id and e["event"] == "lease_lost"
        ),
        exit_codes=exit_codes,
    )

    assert live_claims == dict.fromkeys(live_ids, 1), "a job on a live worker was re-claimed"
    assert set(Job.objects.filter(pk__in=live_ids).values_list("attempts", "reappearances")) == {(1, 0)}
    assert returned["unrecovered"] == 0 and returned["orphaned_jobs"] == 2, returned
    assert returned["max_seconds"] <= RECOVERY_BOUND, returned
    assert reclaim_seconds <= RECOVERY_BOUND, reclaim_seconds
    assert _stale_refusals(history, f.worker_id) == 2
    assert set(Job.objects.filter(pk__in=frozen_ids).values_list("attempts", "reappearances")) == {(2, 1)}
    assert sorted(LedgerEntry.objects.values_list("effect_key", flat=True)) == sorted(
        f"t2-{i}" for i in range(6)
    )
    assert (figures["lost"], figures["duplicated_executions"], figures["duplicate_effects"]) == (0, 0, 0)
    assert set(exit_codes.values()) == {0}, exit_codes
    assert not any(violations.values()), violations


def _claimed_by(ids, worker_id):
    return set(
        JobTransition.objects.filter(job_id__in=ids, new_status="running", worker_id=worker_id).values_list(
            "job_id", flat=True
        )
    )


def _stale_refusals(history, worker_id):
    return sum(
        1
        for e in history.events()
        if e["source"] == worker_id
        and e["event"] in ("ack_rejected", "retry_rejected", "dead_letter_rejected")
    )
