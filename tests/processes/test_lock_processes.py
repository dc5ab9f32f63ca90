"""Locks across real worker processes: no overlap, killed and frozen holders, a Redis outage."""

from __future__ import annotations

import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from django_jobguard.models import DeadLetter, Job
from tests.conftest import wait_for
from tests.support import locking
from tests.support.factories import make_superuser
from tests.support.redis_server import RedisServer
from tests.testapp import tasks_locks
from tests.testapp.models import Execution, FencedCounter, Interval, LedgerEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

backend = locking.backend
make_lock = locking.make_lock
assert_runs_never_overlap = locking.assert_runs_never_overlap


def lock_env(backend: str, **extra: str) -> dict[str, str]:
    """Worker environment selecting the lock back end (tests/settings.py reads it)."""
    return {"JOBGUARD_TEST_LOCK_BACKEND": backend, **extra}


def succeeded(count: int) -> bool:
    """Whether ``count`` jobs succeeded; fails the test at once if any was dead-lettered."""
    dead = DeadLetter.objects.first()
    if dead is not None:
        pytest.fail(f"job {dead.job_id} was dead-lettered: {dead.error_class}: {dead.error_message}")
    return Job.objects.filter(status="succeeded").count() >= count


@pytest.mark.slow
def test_six_workers_never_run_two_jobs_of_one_resource_at_once(backend, workers):
    resources = [f"r{i}" for i in range(5)]
    tasks_locks.interval.bulk_enqueue([((resources[i % 5],), {}) for i in range(500)])
    procs = [workers.start("--concurrency", "2", env=lock_env(backend)) for _ in range(6)]
    wait_for(lambda: succeeded(500), timeout=900, interval=0.5, message="all 500 jobs to succeed")

    assert not DeadLetter.objects.exists()
    # Contention put jobs back without using attempts: every job succeeded on its first.
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    runs = assert_runs_never_overlap()
    assert sorted(runs) == resources
    assert Interval.objects.count() == 500
    assert all(run.fencing_token is not None for run in Interval.objects.all())
    # The downstream resource saw every write, each from a holder newer than the last.
    for counter in FencedCounter.objects.all():
        assert (counter.value, counter.rejected_writes) == (len(runs[counter.resource]), 0)
    assert len(set(Interval.objects.values_list("pid", flat=True))) > 1
    assert all(proc.poll() is None for proc in procs)


# slow, so the Django 6.x runs skip it: a SIGKILLed holder and its lock's TTL are the lock
# back end's and the worker's heartbeat's doing, not Django's; tests/integration/locks/test_locks.py
# proves expiry and takeover on every Django.
@pytest.mark.slow
def test_a_killed_holders_lock_is_free_after_its_ttl_and_work_continues(backend, workers):
    killed_job = tasks_locks.hold_then_record.enqueue("k", marker="killed", seconds=120)
    holder = workers.start("--worker-id", "holder", env=lock_env(backend))
    wait_for(
        lambda: Execution.objects.filter(marker="killed").exists(),
        timeout=60,
        message="the holder to start the handler",
    )
    probe = make_lock(backend, "res:k")
    # Held past its 3 s TTL: the holder's heartbeat renews it while the handler runs.
    time.sleep(4.5)
    assert probe.locked()

    holder.kill()  # SIGKILL: no release, no hand-back
    holder.wait(timeout=10)
    assert probe.locked()  # only the TTL frees it
    wait_for(lambda: not probe.locked(), timeout=30, message="the killed holder's lock to expire")

    next_job = tasks_locks.hold_then_record.enqueue("k", marker="next", seconds=0)
    workers.start("--worker-id", "successor", env=lock_env(backend))
    wait_for(lambda: succeeded(2), timeout=120, message="both jobs to succeed")
    for job in (killed_job, next_job):
        job.refresh_from_db()
    assert (killed_job.attempts, killed_job.reappearances, killed_job.worker_id) == (2, 1, "successor")
    assert next_job.worker_id == "successor"
    killed_token = int(Execution.objects.get(marker="killed", attempt=1).worker)
    runs = assert_runs_never_overlap()["k"]
    assert len(runs) == 2  # the killed attempt never finished its run
    assert all(run.fencing_token > killed_token for run in runs)


def test_a_frozen_holder_loses_its_lock_to_a_new_owner_and_is_not_acked(backend, workers):
    job = tasks_locks.wait_for_lock_loss.enqueue("f", marker="frozen")
    frozen = workers.start("--worker-id", "frozen", env=lock_env(backend))
    wait_for(
        lambda: Execution.objects.filter(marker="frozen").exists(),
        timeout=60,
        message="the worker to start the handler",
    )
    frozen_token = int(Execution.objects.get(marker="frozen").worker)
    frozen.send_signal(signal.SIGSTOP)  # no renewals: its 2 s lock TTL runs out

    thief = make_lock(backend, "res:f", ttl=300)
    wait_for(
        lambda: thief.acquire(blocking=False), timeout=60, message="the frozen holder's lock to be taken over"
    )
    assert thief.fencing_token > frozen_token
    frozen.send_signal(signal.SIGCONT)

    # Its next renewal fails: the handler is told, and the worker refuses the ack.
    wait_for(
        lambda: LedgerEntry.objects.filter(effect_key="frozen:lock_lost=True").exists(),
        timeout=60,
        message="the handler to see context.lock_lost",
    )
    lost_line = f"lock_lost job_id={job.pk} lock_key='res:f'; the job will not be acked"
    wait_for(
        lambda: lost_line in workers.log(frozen),
        timeout=30,
        message="the worker to log the lost lock",
    )
    # The retry finds the key taken: the frozen worker neither renewed nor released the new owner's lock.
    wait_for(
        lambda: Job.objects.get(pk=job.pk).lock_contentions >= 1,
        timeout=60,
        message="the retry to meet the new owner's lock",
    )
    assert thief.locked()
    assert thief.extend()
    job.refresh_from_db()
    assert job.status == "queued" and "was lost while the handler ran" in job.last_error

    thief.release()
    wait_for(lambda: succeeded(1), timeout=60, message="the retry to succeed once the new owner released")
    job.refresh_from_db()
    assert (job.attempts, job.result, job.worker_id) == (2, 2, "frozen")
    assert sorted(Execution.objects.values_list("attempt", flat=True)) == [1, 2]


@pytest.fixture
def redis_server(tmp_path: Path):
    if shutil.which("redis-server") is None:
        pytest.skip("needs the redis-server binary to run a Redis of the test's own")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


#: Seconds after Redis stopped by which a handler that got its lock just before must have started.
IN_FLIGHT_MARGIN_SECONDS = 5
#: Seconds Redis stays down: well past the margin, so the workers keep trying for a while.
OUTAGE_SECONDS = 10


@pytest.mark.redis
@pytest.mark.slow
def test_no_handler_runs_without_its_lock_while_redis_is_down_and_all_complete_after(redis_server, workers):
    total = 200
    resources = [f"r{i}" for i in range(5)]
    tasks_locks.interval.bulk_enqueue([((resources[i % 5],), {"hold": 0.02}) for i in range(total)])
    env = lock_env("redis", JOBGUARD_TEST_REDIS_URL=redis_server.url)
    procs = [workers.start("--concurrency", "2", env=env) for _ in range(3)]
    wait_for(lambda: succeeded(30), timeout=300, interval=0.2, message="the first jobs to succeed")

    redis_server.stop()
    down_at = time.time()
    wait_for(
        lambda: all("lock_unavailable job_id=" in workers.log(proc) for proc in procs),
        timeout=120,
        message="every worker to meet the outage",
    )
    wait_for(lambda: time.time() >= down_at + OUTAGE_SECONDS, timeout=120, message="the outage to last")
    during = Job.objects.filter(status="succeeded").count()
    assert during < total
    restart_at = time.time()  # before it answers: workers take locks the moment it does
    redis_server.start()

    wait_for(
        lambda: succeeded(total),
        timeout=600,
        interval=0.5,
        message="all jobs to succeed after Redis returned",
    )
    # No handler started while no lock could be taken (bar the ones that held one just before).
    started_in_outage = Interval.objects.filter(
        started__gt=down_at + IN_FLIGHT_MARGIN_SECONDS, started__lt=restart_at
    )
    assert not started_in_outage.exists(), list(started_in_outage)
    assert Interval.objects.filter(fencing_token__isnull=True).count() == 0
    # Tokens kept growing across the restart, though Redis came back empty.
    assert_runs_never_overlap()
    assert not DeadLetter.objects.exists()
    waited = Job.objects.filter(last_error__contains="LockUnavailable")
    assert waited.exists()
    # Waiting for the lock store used no attempts; only a run whose lock was lost at its ack can.
    assert set(waited.values_list("attempts", flat=True)) <= {1, 2}
    assert all(proc.poll() is None for proc in procs)


def test_the_lock_page_names_a_sigkilled_holder_and_marks_it_gone_not_the_contender(
    backend, workers, client, settings
):
    """The incident: a worker SIGKILLed while its job holds a long-TTL lock, a second job contending.

    The page used to name the contender (a running job with the same key) as the holder and
    say the holder was not gone.
    """
    from django.urls import reverse

    from django_jobguard.locks import holders

    locks = settings.JOBGUARD.get("LOCKS", {})
    alias = {"CACHE_ALIAS": "redis"} if backend == "redis" else {}
    settings.JOBGUARD = {**settings.JOBGUARD, "LOCKS": {**locks, "BACKEND": backend, **alias}}
    client.force_login(make_superuser("ops"))
    holder_job = tasks_locks.hold_long.enqueue("incident", marker="holder", seconds=600)
    holder = workers.start("--worker-id", "holder-worker", env=lock_env(backend))
    wait_for(
        lambda: Execution.objects.filter(marker="holder").exists(),
        timeout=120,
        message="the holder to start the handler",
    )
    holder.kill()  # SIGKILL: no release, no hand-back, no goodbye beat
    holder.wait(timeout=10)

    contender_job = tasks_locks.hold_long.enqueue("incident", marker="contender", seconds=0)
    workers.start("--worker-id", "contender-worker", env=lock_env(backend))
    wait_for(
        lambda: Job.objects.get(pk=contender_job.pk).lock_contentions >= 2,
        timeout=120,
        message="the second job to contend for the dead holder's lock",
    )
    name = make_lock(backend, "res:incident").name

    def holder_gone() -> bool:
        live = holders.live_lock(name)
        return live is not None and live.holder_gone is True

    from django_jobguard.models import WorkerBeat

    wait_for(
        holder_gone,
        timeout=60,
        message=f"the dead holder's worker to miss its beats: {holders.live_lock(name)!r} "
        f"{list(WorkerBeat.objects.values_list('worker_id', 'last_beat_at'))}",
    )
    live = holders.live_lock(name)
    assert live.holder.job_id == holder_job.pk and live.holder.worker_id == "holder-worker"
    assert re.search(r"holder-worker has (not beaten|written no beat)", live.holder.why)
    assert live.stuck and live.waiting == 1 and live.put_backs >= 2

    html = client.get(reverse("admin:jobguard_lock_changelist")).content.decode()
    if backend == "redis":
        row = re.search(rf'<tr[^>]*data-key="{re.escape(name)}".*?</tr>', html, re.S).group(0)
    else:
        row = re.search(rf"<tr>(?:(?!</tr>).)*{re.escape(name)}.*?</tr>", html, re.S).group(0)
    holder_cell = re.search(r'class="field-holder">(.*?)</td>', row, re.S).group(1)
    assert f"#{holder_job.pk}</a> holder-worker" in holder_cell
    assert f"#{contender_job.pk}" not in row
    gone_cell = re.search(r'class="field-holder_gone">(.*?)</td>', row, re.S).group(1)
    assert gone_cell == "yes" if backend == "redis" else 'alt="True"' in gone_cell
