"""Real worker processes all running the scheduler: each tick is enqueued once, none is lost.

A schedule ticking every second (cron with a seconds field) runs in several
``jobguard_worker`` processes at once. The tick times in the jobs' idempotency keys must
then form an unbroken run of seconds: no gap (a tick nobody enqueued) and no duplicate
(a tick two schedulers enqueued). Each tick's key must also show no duplicate attempt, so
the compare-and-set on the schedule row, not the key, stopped the other schedulers.
"""

from __future__ import annotations

import datetime
import itertools
import json
import signal
import subprocess

import pytest

from django_jobguard import store
from django_jobguard.models import IdempotencyKey, Job, Schedule
from tests.conftest import WorkerProcesses, wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes, pytest.mark.slow]

EVERY_SECOND = json.dumps({"tick": {"task": "tests.testapp.tasks.noop", "cron": "* * * * * *"}})
PREFIX = "schedule:tick:"


def tick_times() -> list[datetime.datetime]:
    keys = Job.objects.filter(idempotency_key__startswith=PREFIX).values_list("idempotency_key", flat=True)
    return [datetime.datetime.fromisoformat(key.removeprefix(PREFIX)) for key in keys]


def assert_one_job_per_tick(expected_at_least: int) -> list[datetime.datetime]:
    times = tick_times()
    assert len(times) >= expected_at_least
    assert len(set(times)) == len(times), "a tick was enqueued twice"
    ordered = sorted(times)
    gaps = [(a, b) for a, b in itertools.pairwise(ordered) if b - a != datetime.timedelta(seconds=1)]
    assert gaps == [], f"ticks missing between {gaps[:3]}"
    assert not IdempotencyKey.objects.filter(key__startswith=PREFIX, duplicates__gt=0).exists()
    row = Schedule.objects.get(name="tick")
    assert row.last_tick_at == ordered[-1] and row.next_tick_at == ordered[-1] + datetime.timedelta(seconds=1)
    return ordered


def stop(workers: WorkerProcesses) -> None:
    for proc in workers.procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in workers.procs:
        proc.wait(timeout=60)


def enqueued_by(workers: WorkerProcesses, proc: subprocess.Popen[bytes]) -> int:
    return workers.log(proc).count("schedule_tick_enqueued name=tick ")


@pytest.mark.server_db
def test_four_workers_enqueue_each_one_second_tick_exactly_once(workers):
    procs = [
        workers.start("--worker-id", f"s{index}", env={"JOBGUARD_TEST_SCHEDULES": EVERY_SECOND})
        for index in range(4)
    ]
    for proc in procs:
        workers.wait_started(proc)
    wait_for(lambda: len(tick_times()) >= 35, timeout=120, message="35 ticks to be enqueued")
    stop(workers)
    ordered = assert_one_job_per_tick(35)
    # Every tick is logged once, by the one worker whose compare-and-set won it.
    counts = [enqueued_by(workers, proc) for proc in procs]
    assert sum(counts) == len(ordered)
    assert sum(1 for count in counts if count) >= 2, f"one worker won every tick: {counts}"
    # The tick jobs are ordinary jobs: the workers ran them.
    assert Job.objects.filter(idempotency_key__startswith=PREFIX, status="succeeded").count() >= 25


@pytest.mark.server_db
def test_a_scheduler_killed_mid_tick_leaves_the_tick_to_another_and_it_is_enqueued_once(workers):
    # Each worker SIGKILLs itself inside a fifth of the tick transactions it wins, after the
    # job's insert and the schedule's advance, before the commit. Killed workers are restarted.
    env = {"JOBGUARD_TEST_SCHEDULES": EVERY_SECOND, "JOBGUARD_TEST_FAULTS": "in_schedule_tick=0.2"}
    live = []
    for index in range(3):
        live.append(
            workers.start("--worker-id", f"k{index}", env={**env, "JOBGUARD_TEST_FAULTS_SEED": str(index)})
        )
    kills = 0

    def progress() -> bool:
        nonlocal kills
        for slot, proc in enumerate(live):
            if proc.poll() is not None:
                assert proc.returncode == -signal.SIGKILL, workers.log(proc)
                kills += 1
                seed = f"{slot}:{kills}"
                live[slot] = workers.start(
                    "--worker-id", f"k{slot}-{kills}", env={**env, "JOBGUARD_TEST_FAULTS_SEED": seed}
                )
        return kills >= 3 and len(tick_times()) >= 20

    wait_for(progress, timeout=150, interval=0.2, message="3 kills mid-tick and 20 ticks")
    stop(workers)
    assert_one_job_per_tick(20)
    # The only fault point armed is inside the tick transaction: every SIGKILL was mid-tick.
    assert sum(1 for proc in workers.procs if proc.returncode == -signal.SIGKILL) >= 3


def test_two_workers_with_skewed_clocks_tick_by_the_database_clock(workers):
    # One worker's clock runs an hour ahead, the other's an hour behind: if either decided
    # due-ness or tick times by its own clock, ticks would be an hour off or bunched.
    procs = [
        workers.start(
            "--worker-id",
            f"skew{offset}",
            env={"JOBGUARD_TEST_SCHEDULES": EVERY_SECOND, "JOBGUARD_TEST_CLOCK_OFFSET": str(offset)},
        )
        for offset in (3600, -3600)
    ]
    for proc in procs:
        workers.wait_started(proc)
    wait_for(lambda: len(tick_times()) >= 15, timeout=120, message="15 ticks to be enqueued")
    stop(workers)
    ordered = assert_one_job_per_tick(15)
    now = store.database_now("default")
    assert now - datetime.timedelta(minutes=5) < ordered[0] and ordered[-1] <= now


def test_a_worker_started_with_no_schedule_runs_jobs_but_no_scheduler(workers):
    job = tasks.noop.enqueue()
    workers.start("--no-schedule", env={"JOBGUARD_TEST_SCHEDULES": EVERY_SECOND})
    # The loop's first pass would have synced and ticked before claiming this job.
    wait_for(lambda: Job.objects.filter(pk=job.pk, status="succeeded").exists(), message="the job to run")
    assert not Schedule.objects.exists()
    assert tick_times() == []
