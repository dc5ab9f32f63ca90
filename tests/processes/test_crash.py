"""Crashed, frozen and stopped workers: leases expire, jobs come back, stale acks are refused."""

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def status_of(job):
    job.refresh_from_db()
    return job.status


def test_a_job_killed_mid_run_is_reclaimed_after_its_lease_and_completed_by_another_worker(workers):
    job = tasks.short_lease.enqueue("crash", seconds=30)
    first = workers.start("--worker-id", "first")
    wait_for(lambda: status_of(job) == "running", message="the first worker to claim the job")
    first.kill()  # SIGKILL mid-job: no chance to clean up
    first.wait(timeout=10)
    second = workers.start("--worker-id", "second")
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="the second worker to finish it")
    assert (job.attempts, job.reappearances, job.worker_id) == (2, 1, "second")
    assert job.result == second.pid
    # The killed attempt's transaction never committed: one execution, one effect.
    assert list(Execution.objects.values_list("attempt", flat=True)) == [2]
    assert LedgerEntry.objects.get(effect_key="crash").job_id == job.pk


def freeze_until_another_worker_finishes(workers, job, handler_started=None):
    frozen = workers.start("--worker-id", "frozen")
    wait_for(lambda: status_of(job) == "running", message="the first worker to claim the job")
    if handler_started is not None:
        wait_for(handler_started, message="the first attempt's handler to start")
    frozen.send_signal(signal.SIGSTOP)  # no heartbeat: its 2 s lease runs out
    workers.start("--worker-id", "healthy")
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="the healthy worker to finish it")
    assert job.worker_id == "healthy"
    frozen.send_signal(signal.SIGCONT)
    # The frozen worker wakes, finishes its handler, and its fenced ack finds the token gone.
    wait_for(lambda: "ack_rejected" in workers.log(frozen), timeout=30, message="the stale ack to be refused")
    assert frozen.poll() is None  # the stale worker carries on serving
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker_id) == ("succeeded", 2, "healthy")


@pytest.mark.server_db
def test_a_frozen_workers_late_atomic_ack_is_refused_and_its_writes_roll_back(workers):
    # PostgreSQL only: on SQLite a writer frozen inside its transaction blocks every other writer.
    job = tasks.short_lease.enqueue("stale", seconds=4, per_attempt=True)
    freeze_until_another_worker_finishes(workers, job)
    # Only the healthy attempt's effect exists; the stale attempt's writes rolled back with its ack.
    assert list(LedgerEntry.objects.values_list("effect_key", flat=True)) == ["stale:2"]
    assert list(Execution.objects.values_list("attempt", flat=True)) == [2]


def test_a_frozen_workers_late_ack_is_refused(workers):
    job = tasks.short_lease_plain.enqueue("stale-plain", seconds=4)
    # Stop it once its handler's first write has committed: on SQLite a worker stopped inside
    # that INSERT would keep the database's write lock, and no other worker could claim.
    first_written = lambda: Execution.objects.filter(job_id=job.pk, attempt=1).exists()  # noqa: E731
    freeze_until_another_worker_finishes(workers, job, handler_started=first_written)
    # Both attempts ran (at-least-once), but only the healthy one's ack counted.
    assert sorted(Execution.objects.values_list("attempt", flat=True)) == [1, 2]


def test_sigterm_lets_the_running_job_finish_and_exits_zero(workers, tmp_path):
    started = tmp_path / "work"
    job = tasks.works_for.enqueue("graceful", path=str(started), seconds=1.5)
    proc = workers.start("--shutdown-grace", "60")
    # Started, not only claimed: a job claimed but not yet started when SIGTERM comes is handed
    # back (on a loaded host the claim's "running" can come well before the handler starts).
    wait_for(lambda: Path(f"{started}.started").exists(), message="the handler to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 0
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert LedgerEntry.objects.filter(effect_key="graceful").count() == 1
    assert "job_handed_back" not in workers.log(proc)


@pytest.mark.parametrize("task", [tasks.blocks_atomic, tasks.blocks_plain], ids=["atomic", "plain"])
def test_jobs_past_the_grace_period_are_handed_back_at_once_and_run_again(workers, tmp_path, task):
    # On SQLite too: the running job's own transaction used to block the hand-back, leaving
    # the job "running" until its lease (30 s here) expired.
    release = tmp_path / "release"
    job = task.enqueue("handback", path=str(release))
    proc = workers.start("--shutdown-grace", "0.5")
    wait_for(lambda: Path(f"{release}.started").exists(), message="the handler to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    job.refresh_from_db()
    # Handed back as the worker exited, the attempt refunded: the worker stopped it, it did not fail.
    assert (job.status, job.attempts, job.lease_token, job.worker_id) == ("queued", 0, None, "")
    assert "job_handed_back" in workers.log(proc)
    assert "job_abandoned" not in workers.log(proc)
    assert not LedgerEntry.objects.exists()
    # An atomic attempt's writes rolled back; a plain one's committed as it went.
    assert Execution.objects.filter(job_id=job.pk).exists() is (task is tasks.blocks_plain)
    release.touch()
    workers.start()
    wait_for(lambda: status_of(job) == "succeeded", timeout=60, message="another worker to run it")
    assert job.attempts == 1
    assert LedgerEntry.objects.filter(effect_key="handback").count() == 1


def test_every_running_job_is_handed_back_when_one_holds_an_open_transaction(workers, tmp_path):
    # SQLite: the atomic job's transaction holds the only write lock, which the plain job's
    # hand-back needs as much as its own.
    atomic = tasks.blocks_atomic.enqueue("both-atomic", path=str(tmp_path / "atomic"))
    plain = tasks.blocks_plain.enqueue("both-plain", path=str(tmp_path / "plain"))
    proc = workers.start("--concurrency", "2", "--shutdown-grace", "0.5")
    # On SQLite the plain handler's first write waits for the atomic one's lock: both are
    # claimed, and at least the atomic one is inside its handler.
    wait_for(
        lambda: (tmp_path / "atomic.started").exists() and status_of(plain) == "running",
        message="both jobs to be claimed and the atomic handler to start",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    for job in (atomic, plain):
        job.refresh_from_db()
        assert (job.status, job.attempts, job.lease_token) == ("queued", 0, None), job.task_name
    assert workers.log(proc).count("job_handed_back") == 2


def test_a_job_cut_off_between_its_statements_is_handed_back_and_the_worker_exits_zero(workers, tmp_path):
    # At the end of the grace period a SQLite worker closes each running job's connection
    # from its main thread. Closed under a statement the job's thread is running, sqlite3
    # crashes the process (SIGSEGV), so the close waits for the job to be between statements.
    # This handler is almost never between them: each round is one more chance to crash.
    for round_ in range(5):
        marker = f"cut-{round_}"
        job = tasks.writes_until.enqueue(marker, path=str(tmp_path / f"never-{round_}"))
        proc = workers.start("--shutdown-grace", "0.2")
        wait_for(
            lambda marker=marker: Execution.objects.filter(marker=marker).count() >= 20,
            message="the handler to be writing",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, workers.log(proc)[-2000:]
        job.refresh_from_db()
        assert (job.status, job.attempts, job.lease_token) == ("queued", 0, None)
        assert "job_handed_back" in workers.log(proc)
        job.delete()  # the next round's worker runs only that round's job


def test_double_sigint_skips_the_grace_period(workers, tmp_path):
    # The handler blocks until released (never, here) under the default lease: a 2 s lease can
    # lapse on a loaded machine, and a job run again and finished would leave nothing to cut short.
    job = tasks.blocks_atomic.enqueue("impatient", path=str(tmp_path / "never"))
    proc = workers.start("--shutdown-grace", "600")
    wait_for(lambda: (tmp_path / "never.started").exists(), message="the handler to start")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "worker_stopping" in workers.log(proc), message="the first SIGINT to be seen")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, workers.log(proc)[-2000:]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.lease_token) == ("queued", 0, None)
    assert not LedgerEntry.objects.exists()


def test_stop_signals_that_keep_coming_while_the_worker_exits_leave_its_exit_clean(workers):
    # Python restores the default handlers as the interpreter exits: a SIGINT landing then
    # killed an idle worker that had already stopped cleanly (exit status -2 instead of 0).
    proc = workers.start()
    workers.wait_started(proc)
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "worker_stopping" in workers.log(proc), message="the first SIGINT to be seen")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=0.001)  # the exit, waited on between signals
        except subprocess.TimeoutExpired:
            continue
    assert proc.wait(timeout=60) == 0, workers.log(proc)[-2000:]
    assert "worker_stopped" in workers.log(proc)


def test_jobs_not_yet_started_are_handed_back_on_sigterm(workers, tmp_path):
    # "running" is set at the claim, before the handler starts: wait on the handler's own
    # marker, or a SIGTERM landing between the claim and the start hands back both jobs.
    release = tmp_path / "blocker"
    blocker = tasks.blocks_plain.enqueue("blocker", path=str(release))
    waiting = tasks.add.enqueue(1)
    proc = workers.start("--concurrency", "1", "--batch-size", "2", "--shutdown-grace", "60")
    wait_for(
        lambda: Path(f"{release}.started").exists() and status_of(waiting) == "running",
        message="the blocker to start and the other job to be claimed",
    )
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "worker_stopping" in workers.log(proc), message="the SIGTERM to be seen")
    release.touch()
    assert proc.wait(timeout=60) == 0, workers.log(proc)[-2000:]
    assert status_of(blocker) == "succeeded"
    waiting.refresh_from_db()
    assert (waiting.status, waiting.attempts) == ("queued", 0)


@pytest.mark.postgres
def test_an_idle_worker_wakes_on_notify_without_polling(workers):
    proc = workers.start("--poll-interval", "600", "--reaper-interval", "600")
    workers.wait_started(proc)
    job = tasks.add.enqueue(2, b=3)
    # With polling and reaping set to 10 minutes only the NOTIFY can wake the worker in time.
    wait_for(lambda: status_of(job) == "succeeded", timeout=20, message="the NOTIFY to wake the worker")
    assert job.result == 5
