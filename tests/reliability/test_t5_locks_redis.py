"""T5: per-resource locks on Redis, with Redis down, a holder paused, and Redis restarted empty.

Written against the lock API of the spine and issue 5 (``@task(lock=...)``, the Redis back
end through django-redis, fencing tokens on the context). The workers use a private
``redis-server`` the test starts on port 6398 (never the shared one), so it can stop it.

- Redis down before acquire: no handler may run; jobs wait (transient retries) and all
  complete once Redis is back.
- Redis restarted without persistence during locked work: held locks and fencing counters
  vanish. The fenced counter must lose no update and accept no stale write.
- A holder paused past the lock TTL (not past its lease): another worker takes the lock;
  the paused holder's accesses must be refused when it wakes.

Checks on what committed: no two accepted runs of one resource overlap (runs without
lock), each resource's counter equals its applied increments (lost updates), and no accepted
write carries an older fencing token than the one before it (stale writes accepted).
"""

import collections
import itertools
import shutil
import time

import pytest

from django_jobguard.models import Job
from tests.conftest import wait_for
from tests.support.redis_server import RedisServer
from tests.testapp import tasks_faults
from tests.testapp.models import FencedCounter, Interval, LedgerEntry

from .harness import Pool, check, enqueue_probes, open_jobs

pytestmark = [pytest.mark.reliability, pytest.mark.postgres, pytest.mark.processes, pytest.mark.slow]

REDIS_PORT = 6398
RESOURCES = ("r0", "r1", "r2", "r3")


class LockedRun:
    """Workers on a private Redis, four fenced counters, and the figures of what committed."""

    def __init__(self, scenario, observer, workers, tmp_path) -> None:
        self.scenario = scenario
        self.history = scenario.history
        self.redis = RedisServer(tmp_path, REDIS_PORT)
        self.env = {
            "JOBGUARD_TEST_REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
            "JOBGUARD_TEST_LOCK_BACKEND": "redis",
        }
        self.pool = Pool(workers, self.history, observer, size=3, concurrency=2, env=self.env)
        self.observer = observer
        self._marker = iter(range(10**6))
        for resource in RESOURCES:
            FencedCounter.objects.create(resource=resource)

    def enqueue(self, count, hold):
        calls = [
            (
                (),
                {
                    "resource": RESOURCES[i % len(RESOURCES)],
                    "marker": f"t5-{next(self._marker)}",
                    "hold": hold,
                },
            )
            for i in range(count)
        ]
        return enqueue_probes(self.history, calls, task=tasks_faults.locked_increment)

    def finish(self, **more):
        events = self.history.events()
        overlaps = _overlaps()
        lost_updates = {
            r: LedgerEntry.objects.filter(effect_key__in=_markers(r)).count()
            - FencedCounter.objects.get(resource=r).value
            for r in RESOURCES
        }
        stale_accepted, reused = _token_order()
        figures = check(self.history)
        figures.update(
            lock_unavailable=self.history.count("lock_unavailable"),
            lock_lost=self.history.count("lock_lost"),
            lock_contended=self.history.count("lock_contended"),
            fenced_accesses_refused=dict(
                collections.Counter(e["access"] for e in events if e["event"] == "fenced_access_refused")
            ),
            runs_without_lock=len(overlaps),
            overlapping_runs=overlaps[:5],
            lost_updates=sum(abs(n) for n in lost_updates.values()),
            stale_writes_accepted=stale_accepted,
            fencing_tokens_reused=reused,
            counters={r: FencedCounter.objects.get(resource=r).value for r in RESOURCES},
            **more,
        )
        violations = self.scenario.finish(**figures)
        return figures, violations

    def assert_safe(self, figures, violations, total):
        assert figures["runs_without_lock"] == 0, figures["overlapping_runs"]
        assert figures["lost_updates"] == 0, figures["counters"]
        assert figures["stale_writes_accepted"] == 0
        assert figures["statuses"] == {"succeeded": total}, figures["statuses"]
        assert LedgerEntry.objects.count() == total
        assert (figures["lost"], figures["unexpected"]) == (0, 0), figures
        assert set(figures["exit_codes"].values()) == {0}, figures["exit_codes"]
        assert not any(violations.values()), violations


@pytest.mark.scenario("T5")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")
def test_t5_redis_down_and_a_holder_paused_past_its_ttl_break_no_lock_guarantee(
    scenario, observer, workers, tmp_path
):
    run = LockedRun(scenario, observer, workers, tmp_path)
    history, pool, redis = run.history, run.pool, run.redis
    down_jobs, busy_jobs = scenario.size(20), scenario.size(80)
    scenario.parameters = {
        "resources": len(RESOURCES),
        "jobs_while_redis_down": down_jobs,
        "jobs_with_redis_up": busy_jobs,
        "lock_ttl_seconds": 3.0,
        "lease_seconds": tasks_faults.LEASE_SECONDS,
        "paused_for_seconds": 4.0,
        "workers": 3,
        "concurrency": 2,
    }
    try:
        # Redis down before acquire: nothing may start; all runs once Redis answers.
        pool.start()
        pool.wait_started()
        outage_ids = run.enqueue(down_jobs, 0.02)
        wait_for(
            lambda: history.count("lock_unavailable") >= down_jobs,
            timeout=60,
            message="the workers to find Redis down",
        )
        started_while_down = history.count("start")
        redis.start()
        history.record("redis_started")
        wait_for(
            lambda: open_jobs(observer, outage_ids) == 0, timeout=120, message="the outage jobs after Redis"
        )
        run.enqueue(busy_jobs, 0.1)

        # A holder paused past the lock TTL, but not past its lease.
        (slow_id,) = run.enqueue(1, 4.0)
        wait_for(
            lambda: any(e["event"] == "locked_read" and e["job_id"] == slow_id for e in history.events()),
            timeout=120,
            message="the slow job to take its lock and read",
        )
        holder = next(
            s
            for s in pool.slots
            if any(
                e["event"] == "locked_read" and e["job_id"] == slow_id and e["source"] == s.worker_id
                for e in history.events()
            )
        )
        paused_at = pool.pause(holder)
        after_pause = run.enqueue(8, 0.05)
        resource = Job.objects.get(pk=slow_id).kwargs["resource"]
        wait_for(
            lambda: Interval.objects.filter(resource=resource, started__gt=paused_at).exists(),
            timeout=60,
            message="another worker to take the expired lock and write",
        )
        time.sleep(max(0.0, paused_at + 4.0 - time.time()))  # past the 3 s TTL, short of the 5 s lease
        pool.resume(holder)
        wait_for(lambda: open_jobs(observer) == 0, timeout=240, message="every job to finish")
        exit_codes = pool.stop()
    finally:
        redis.crash()

    slow_refused = [
        e["access"]
        for e in history.events()
        if e["event"] == "fenced_access_refused" and e["job_id"] == slow_id
    ]
    figures, violations = run.finish(
        handlers_started_while_redis_down=started_while_down,
        paused_holder_refusals=slow_refused,
        exit_codes=exit_codes,
        after_pause_jobs=len(after_pause),
    )
    assert started_while_down == 0, "a handler ran while its lock could not be taken"
    assert slow_refused, "the paused holder's late access was not refused"
    assert figures["fencing_tokens_reused"] == 0
    run.assert_safe(figures, violations, down_jobs + busy_jobs + 1 + 8)


@pytest.mark.scenario("T5-restart")
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")
def test_t5_redis_restarted_empty_during_locked_work_loses_no_update(scenario, observer, workers, tmp_path):
    run = LockedRun(scenario, observer, workers, tmp_path)
    history, pool, redis = run.history, run.pool, run.redis
    busy_jobs = scenario.size(160)
    scenario.parameters = {
        "resources": len(RESOURCES),
        "jobs_across_restart": busy_jobs,
        "lock_ttl_seconds": 3.0,
        "workers": 3,
        "concurrency": 2,
    }
    try:
        redis.start()
        pool.start()
        busy_ids = run.enqueue(busy_jobs, 0.15)
        wait_for(
            lambda: Job.objects.filter(pk__in=busy_ids, status="succeeded").count() >= busy_jobs // 4,
            timeout=120,
            message="a quarter of the jobs to finish before the restart",
        )
        history.record("redis_crash")
        redis.crash()
        redis.start()
        history.record("redis_started")
        wait_for(lambda: open_jobs(observer) == 0, timeout=240, message="every job to finish")
        exit_codes = pool.stop()
    finally:
        redis.crash()

    figures, violations = run.finish(exit_codes=exit_codes)
    run.assert_safe(figures, violations, busy_jobs)


def _markers(resource):
    return [
        kwargs["marker"]
        for kwargs in Job.objects.filter(task_name=tasks_faults.locked_increment.name).values_list(
            "kwargs", flat=True
        )
        if kwargs["resource"] == resource
    ]


def _overlaps():
    found = []
    for resource in RESOURCES:
        runs = sorted(
            Interval.objects.filter(resource=resource).values_list("started", "ended", "fencing_token")
        )
        for (_s1, e1, t1), (s2, _e2, t2) in itertools.pairwise(runs):
            if s2 < e1:
                found.append((resource, t1, t2, round(e1 - s2, 3)))
    return found


def _token_order():
    """Accepted writes per resource whose token is older than the previous one, and equal to it."""
    older = equal = 0
    for resource in RESOURCES:
        tokens = list(
            Interval.objects.filter(resource=resource).order_by("id").values_list("fencing_token", flat=True)
        )
        older += sum(1 for a, b in itertools.pairwise(tokens) if b < a)
        equal += sum(1 for a, b in itertools.pairwise(tokens) if b == a)
    return older, equal
