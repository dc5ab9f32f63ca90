"""T4: a worker frozen past its lease while another completes the job, 50 times.

Each repetition is one job. Worker A claims a round of jobs and starts them, and is
SIGSTOPped. Their leases expire, worker B's reaper returns them and B completes them.
Then A is resumed: each of its handlers waits until A's heartbeat has learnt that the
lease is gone, then ends with a stale ack, a stale retry or a stale dead-lettering.
Every one of those must be refused, and only B's effect may exist.
"""

import collections

import pytest

from django_jobguard.models import DeadLetter, Job
from tests.conftest import wait_for
from tests.testapp import tasks_faults
from tests.testapp.models import Execution, LedgerEntry

from .harness import Pool, check, open_jobs

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

OUTCOMES = ("complete", "retry", "dead")
REJECTION = {"complete": "ack_rejected", "retry": "retry_rejected", "dead": "dead_letter_rejected"}


@pytest.mark.scenario("T4")
def test_t4_stale_acks_retries_and_dead_letterings_are_all_refused(scenario, observer, workers):
    repetitions = scenario.size(50)
    per_round = 10
    scenario.parameters = {"repetitions": repetitions, "jobs_per_round": per_round, "outcomes": OUTCOMES}
    history = scenario.history
    job_outcome: dict[int, str] = {}

    for first in range(0, repetitions, per_round):
        size = min(per_round, repetitions - first)
        ids = []
        for i in range(first, first + size):
            outcome = OUTCOMES[i % len(OUTCOMES)]
            job = tasks_faults.probe_stale.enqueue(marker=f"t4-{i}", outcome=outcome)
            ids.append(job.pk)
            job_outcome[job.pk] = outcome
        history.record("enqueue_ok", job_ids=ids, count=len(ids))

        frozen = Pool(workers, history, observer, size=1, concurrency=size, name=f"a{first}-").start()
        a = frozen.slots[0]
        wait_for(
            lambda ids=ids, a=a: _started_by(history, a.worker_id, ids) == set(ids),
            timeout=120,
            message=f"worker {a.worker_id} to start all {size} jobs of the round",
        )
        frozen.pause(a)
        healthy = Pool(workers, history, observer, size=1, concurrency=2, name=f"b{first}-").start()
        wait_for(
            lambda ids=ids: Job.objects.filter(pk__in=ids, status="succeeded").count() == len(ids),
            timeout=120,
            message="worker B to complete every job of the frozen worker",
        )
        frozen.resume(a)
        wait_for(
            lambda ids=ids, a=a: _stale_ends(history, a.worker_id, ids) == len(ids),
            timeout=120,
            message="every stale attempt of the resumed worker to end and be refused",
        )
        exit_codes = {**frozen.stop(), **healthy.stop()}
        assert set(exit_codes.values()) == {0}, exit_codes

    events = history.events()
    a_events = [e for e in events if e["source"].startswith("a")]
    refused = collections.Counter(e["event"] for e in a_events if e["event"] in REJECTION.values())
    accepted_stale = collections.Counter(
        e["event"] for e in a_events if e["event"] in ("job_succeeded", "job_retry", "job_dead_lettered")
    )
    heartbeats_refused = sum(1 for e in a_events if e["event"] == "lease_lost")
    ledger = collections.Counter(LedgerEntry.objects.values_list("job_id", flat=True))
    ledger_keys = set(LedgerEntry.objects.values_list("effect_key", flat=True))
    figures = check(history)
    violations = scenario.finish(
        **figures,
        repetitions=repetitions,
        stale_refused=dict(refused),
        stale_accepted=dict(accepted_stale),
        stale_heartbeats_refused=heartbeats_refused,
        jobs_with_one_ledger_row=sum(1 for n in ledger.values() if n == 1),
        stale_effects_committed=sum(1 for key in ledger_keys if key.endswith(":1")),
        dead_letters=DeadLetter.objects.count(),
    )

    expected = collections.Counter(REJECTION[o] for o in job_outcome.values())
    assert accepted_stale == {}, accepted_stale
    assert refused == expected, (refused, expected)
    assert heartbeats_refused >= repetitions
    assert open_jobs(observer) == 0
    assert set(Job.objects.values_list("status", "attempts").distinct()) == {("succeeded", 2)}
    assert DeadLetter.objects.count() == 0
    assert len(ledger) == repetitions and set(ledger.values()) == {1}, ledger
    assert ledger_keys == {f"t4-{i}:2" for i in range(repetitions)}
    # Only the accepted attempt's raw execution committed with its ack (the stale ones rolled back).
    assert sorted(Execution.objects.values_list("attempt", flat=True)) == [2] * repetitions
    assert (figures["lost"], figures["unexpected"], figures["duplicate_effects"]) == (0, 0, 0), figures
    assert not any(violations.values()), violations


def _started_by(history, worker_id, ids):
    return {
        e["job_id"] for e in history.events() if e["event"] == "start" and e["source"] == worker_id
    } & set(ids)


def _stale_ends(history, worker_id, ids):
    wanted = set(ids)
    return sum(
        1
        for e in history.events()
        if e["source"] == worker_id and e["event"] in REJECTION.values() and e.get("job_id") in wanted
    )
