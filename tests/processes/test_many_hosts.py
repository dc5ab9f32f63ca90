"""Many workers (as on many hosts) run maintenance at once: one transition per expired lease."""

from __future__ import annotations

import re
import signal
import time
from collections import Counter

import pytest
from django.db import connection

from django_jobguard import dlq, store
from django_jobguard.models import DeadLetter, Job
from django_jobguard.worker import LIVENESS_TOUCH_SECONDS
from tests.conftest import wait_for
from tests.support.factories import make_user
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

#: Worker processes racing over the same expired leases, each named as if on its own host.
REAPERS = 6
EXPIRED = 240
#: Within the default replay throttle's 10-second burst (60 a minute), so redrive is not paced.
EXHAUSTED = 10


def expire_all_leases() -> None:
    """Move every running lease into the past, in one statement, on the database clock."""
    past = {
        "postgresql": "statement_timestamp() - interval '1 second'",
        "mysql": "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
        "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 seconds')",
    }[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE jobguard_job SET lease_expires_at = {past} WHERE status = 'running'")


def test_workers_running_maintenance_at_once_reap_dead_letter_and_redrive_each_job_once(
    workers,
):
    tasks.add.bulk_enqueue([((index,), {}) for index in range(EXPIRED + EXHAUSTED)])
    # A "ghost" worker on a vanished host holds them all; some are on their last attempt.
    held = store.claim("default", None, EXPIRED + EXHAUSTED, "gone-host:1:abcdef")
    assert len(held) == EXPIRED + EXHAUSTED
    last_attempt = sorted(job.id for job in held)[:EXHAUSTED]
    Job.objects.filter(pk__in=last_attempt).update(max_attempts=1)
    # The reapers take no jobs (their queue is empty), so each row moves only by reaping.
    procs = [
        workers.start(
            "--queue", "nothing-here", "--reaper-interval", "0.05", "--worker-id", f"host-{index}:{index}:r"
        )
        for index in range(REAPERS)
    ]
    for proc in procs:
        workers.wait_started(proc)
    expire_all_leases()  # every reaper's next pass sees all of them at once
    wait_for(
        lambda: not Job.objects.filter(status="running").exists(),
        timeout=120,
        message="the reapers to settle every expired lease",
    )
    wait_for(
        lambda: DeadLetter.objects.count() >= EXHAUSTED,
        timeout=60,
        message="the exhausted jobs' dead letters",
    )
    returned = Job.objects.exclude(pk__in=last_attempt)
    assert set(returned.values_list("status", "reappearances", "attempts").distinct()) == {("queued", 1, 1)}
    assert set(Job.objects.filter(pk__in=last_attempt).values_list("status", flat=True)) == {"dead"}
    letters = Counter(DeadLetter.objects.values_list("job_id", flat=True))
    assert sorted(letters) == last_attempt
    assert set(letters.values()) == {1}

    # Every worker's log together names each returned job exactly once. The lines follow the
    # reaper's commit (and other workers may dead-letter the exhausted jobs first), so wait for
    # them rather than read the logs the moment the rows show the jobs reaped.
    def logged_ids() -> Counter[int]:
        return Counter(int(job_id) for proc in procs for job_id in reaped_by(workers, proc))

    wait_for(lambda: sum(logged_ids().values()) >= EXPIRED, timeout=30, message="the lease_expired lines")
    logged = logged_ids()
    assert sorted(logged) == sorted(returned.values_list("pk", flat=True))
    assert set(logged.values()) == {1}

    # Approved replays: every worker's redrive pass races for them; each letter makes one job.
    requester = make_user("rita", "request_replay", "view_deadletter")
    approver = make_user("amir", "approve_replay", "view_deadletter")
    for letter in DeadLetter.objects.all():
        dlq.request_replay(letter, requester, "host came back")
        dlq.approve_replay(letter, approver, "ok")
    wait_for(
        lambda: DeadLetter.objects.filter(replay_state="replayed").count() == EXHAUSTED,
        timeout=120,
        message="the workers to redrive every approved replay",
    )
    replays = Job.objects.filter(replayed_from__isnull=False)
    assert Counter(replays.values_list("replayed_from__job_id", flat=True)) == Counter(last_attempt)
    assert Job.objects.count() == EXPIRED + 2 * EXHAUSTED


# slow, so the Django 6.x runs skip it: a thread touching a file and SIGSTOP do not depend on Django.
@pytest.mark.slow
def test_the_heartbeat_thread_touches_the_liveness_file_and_stops_when_the_worker_freezes(workers, tmp_path):
    alive = tmp_path / "alive"
    proc = workers.start(env={"JOBGUARD_TEST_LIVENESS_FILE": str(alive)})
    wait_for(alive.exists, timeout=60, message="the heartbeat thread to create the liveness file")
    first = alive.stat().st_mtime_ns
    wait_for(
        lambda: alive.stat().st_mtime_ns > first, timeout=60, message="the liveness file to be touched again"
    )
    proc.send_signal(signal.SIGSTOP)  # frozen: what a probe must catch
    try:
        frozen_at = alive.stat().st_mtime_ns
        time.sleep(3 * LIVENESS_TOUCH_SECONDS)
        assert alive.stat().st_mtime_ns == frozen_at
    finally:
        proc.send_signal(signal.SIGCONT)
    wait_for(lambda: alive.stat().st_mtime_ns > frozen_at, timeout=60, message="touches to resume")


def ghost_leases(count: int, marker: str) -> list[int]:
    """``count`` jobs held by a worker that vanished, their leases already expired."""
    tasks.add.bulk_enqueue([((index,), {}) for index in range(count)])
    held = store.claim("default", None, count, f"gone-{marker}:1:abcdef")
    expire_all_leases()
    return sorted(job.id for job in held)


def reaped_by(workers, proc) -> list[str]:
    return re.findall(r"lease_expired job_id=(\d+)", workers.log(proc))


def leaders(workers, procs) -> list:
    return [proc for proc in procs if "maintenance_leader_elected" in workers.log(proc)]


def test_with_an_elected_leader_one_worker_reaps_and_another_takes_over_when_it_dies(workers):
    env = {"JOBGUARD_TEST_MAINTENANCE_LEADER": "1"}
    procs = [
        workers.start("--queue", "nothing-here", "--worker-id", f"host-{index}:{index}:l", env=env)
        for index in range(3)
    ]
    for proc in procs:
        workers.wait_started(proc)
    wait_for(lambda: leaders(workers, procs), timeout=60, message="a maintenance leader to be elected")
    (leader,) = leaders(workers, procs)
    first = ghost_leases(30, "a")
    wait_for(
        lambda: not Job.objects.filter(pk__in=first, status="running").exists(),
        timeout=60,
        message="the leader to reap the expired leases",
    )
    # Only the leader ran the reaper. Its log lines follow the reaper's commit, so wait for them
    # rather than read the log the moment the rows show the jobs reaped.
    wait_for(
        lambda: len(reaped_by(workers, leader)) == len(first),
        timeout=30,
        message="the leader's lease_expired log lines",
    )
    for proc in procs:
        if proc is not leader:
            assert not reaped_by(workers, proc), workers.log(proc)[-2000:]
    leader.kill()  # SIGKILL: its leadership row is left to expire
    leader.wait(timeout=10)
    Job.objects.filter(pk__in=first).delete()  # so the next ghost holds only new jobs
    second = ghost_leases(30, "b")
    survivors = [proc for proc in procs if proc is not leader]
    wait_for(
        lambda: not Job.objects.filter(pk__in=second, status="running").exists(),
        timeout=120,
        message="another worker to take over leadership and reap",
    )
    assert len(leaders(workers, survivors)) == 1
    assert set(Job.objects.filter(pk__in=second).values_list("reappearances", flat=True)) == {1}
