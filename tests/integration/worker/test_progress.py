"""Reported progress through the worker: the heartbeat's fenced, rate-limited writes, the last
report written when the handler returns, and ``Job.watch()``. Real rows; the worker in this
process (burst mode) or its lease keeper called directly with the time it is given."""

import threading
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from django_jobguard import store
from django_jobguard.context import PROGRESS_WRITE_SECONDS
from django_jobguard.exceptions import JobNotFound, WaitTimeout
from django_jobguard.models import Job
from django_jobguard.outcome import HeldState
from django_jobguard.worker import Worker, pipeline
from django_jobguard.worker.completer import Completer
from django_jobguard.worker.held import Held
from django_jobguard.worker.leases import LeaseKeeper, write_last_progress
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "default"
WORKER_ID = "progress-test"


def run_burst(**options) -> int:
    options.setdefault("concurrency", 2)
    return Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, **options).run()


def claim_all(count: int) -> list[Held]:
    """Claim ``count`` jobs and give each the context its handler would get."""
    claimed = store.claim(ALIAS, None, count, WORKER_ID)
    assert len(claimed) == count
    rt = pipeline.Runtime(ALIAS, WORKER_ID, Completer(ALIAS, WORKER_ID))
    now = time.monotonic()
    held = []
    for job in claimed:
        h = Held(job=job, renewed_at=now, state=HeldState.RUNNING, started_at=now)
        pipeline.make_context(rt, h, tasks.counts_with_progress)
        held.append(h)
    return held


def burst_in_thread() -> threading.Thread:
    def run() -> None:
        try:
            run_burst()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def stored(job) -> dict | None:
    return Job.objects.get(pk=job.id).progress


def test_a_handler_reporting_in_a_tight_loop_leaves_its_last_report_on_the_job():
    job = tasks.counts_with_progress.enqueue(total=5000)
    plain = tasks.add.enqueue(1, b=2)
    assert run_burst() == 0
    job.refresh_from_db()
    assert (job.status, job.result) == ("succeeded", 5000)
    assert {k: job.progress[k] for k in ("done", "total", "message")} == {
        "done": 5000,
        "total": 5000,
        "message": "step 5000",
    }
    assert job.progress["at"].endswith("+00:00")
    assert Job.objects.get(pk=plain.pk).progress is None  # a job that never reports has none


@pytest.mark.parametrize("atomic", [False, True])
def test_a_handler_that_never_reports_costs_no_statement_and_one_that_reports_one(atomic):
    """The ack path's statements, counted on the executor's connection (the pipeline runs here)."""
    handler = tasks.counts_with_progress_atomic if atomic else tasks.counts_with_progress
    rt = pipeline.Runtime(ALIAS, WORKER_ID, Completer(ALIAS, WORKER_ID))
    sent = {}
    # A first run prepares the ack's statement on PostgreSQL: not counted.
    for report in (False, False, True):
        job = handler.enqueue(total=20, report=report)
        (held,) = claim_all(1)
        assert held.job.id == job.pk
        with CaptureQueriesContext(connection) as queries:
            outcome = pipeline.run(held, rt)
        assert outcome.result == 20
        sent[report] = [q["sql"] for q in queries.captured_queries]
    assert not any("progress" in sql for sql in sent[False])
    assert len(sent[True]) == len(sent[False]) + 1
    assert sum("progress" in sql for sql in sent[True]) == 1


def test_an_atomic_handlers_last_report_commits_with_its_ack():
    job = tasks.counts_with_progress_atomic.enqueue(total=40)
    assert run_burst() == 0
    job.refresh_from_db()
    assert (job.status, job.progress["done"], job.progress["total"]) == ("succeeded", 40, 40)


def test_a_coroutine_handlers_last_report_is_written_by_the_async_executor():
    job = tasks.counts_with_progress_async.enqueue(total=30)
    assert run_burst(async_slots=4) == 0
    job.refresh_from_db()
    assert (job.status, job.progress["done"], job.progress["message"]) == ("succeeded", 30, "step 30")


def test_the_keeper_writes_every_due_report_in_one_statement_at_most_once_a_second_per_job():
    for _ in range(3):
        tasks.counts_with_progress.enqueue()
    held = claim_all(3)
    keeper = LeaseKeeper(ALIAS, WORKER_ID)
    now = time.monotonic()
    with CaptureQueriesContext(connection) as nothing_reported:
        keeper.write_progress(held, now)
    assert len(nothing_reported) == 0  # handlers that never report cost the heartbeat nothing

    for n, h in enumerate(held):
        for done in range(1000):  # a tight loop: only kept in memory
            h.context.report_progress(done + n, 2000, f"job {n}")
    with CaptureQueriesContext(connection) as first:
        keeper.write_progress(held, now)
    assert len(first) == 1  # all three in one statement
    assert [stored(h.job)["done"] for h in held] == [999, 1000, 1001]

    for h in held:
        h.context.report_progress(1500, 2000, "later")
    with CaptureQueriesContext(connection) as too_soon:
        keeper.write_progress(held, now + PROGRESS_WRITE_SECONDS / 2)
    assert len(too_soon) == 0
    assert stored(held[0].job)["done"] == 999
    with CaptureQueriesContext(connection) as due_again:
        keeper.write_progress(held, now + PROGRESS_WRITE_SECONDS)
    assert len(due_again) == 1
    assert [stored(h.job)["message"] for h in held] == ["later"] * 3
    with CaptureQueriesContext(connection) as unchanged:
        keeper.write_progress(held, now + 5 * PROGRESS_WRITE_SECONDS)
    assert len(unchanged) == 0  # nothing new reported: nothing written


def test_a_report_falling_due_takes_the_other_new_reports_with_it_so_a_worker_sends_one_statement_a_second():
    for _ in range(2):
        tasks.counts_with_progress.enqueue()
    first, second = claim_all(2)
    keeper = LeaseKeeper(ALIAS, WORKER_ID)
    now = time.monotonic()
    first.context.report_progress(1, 10)
    keeper.write_progress([first, second], now)  # the first report: due at once
    second.context.report_progress(2, 10)  # a new job's first report, due at once too...
    first.context.report_progress(3, 10)  # ...takes this one with it, half a second early
    with CaptureQueriesContext(connection) as carried:
        keeper.write_progress([first, second], now + PROGRESS_WRITE_SECONDS / 2)
    assert len(carried) == 1
    assert [stored(h.job)["done"] for h in (first, second)] == [3, 2]
    # From then on the two are written together, once a second.
    for h in (first, second):
        h.context.report_progress(5, 10)
    with CaptureQueriesContext(connection) as queries:
        keeper.write_progress([first, second], now + PROGRESS_WRITE_SECONDS)
        keeper.write_progress([first, second], now + PROGRESS_WRITE_SECONDS * 3 / 2)
    assert len(queries) == 1
    assert [stored(h.job)["done"] for h in (first, second)] == [5, 5]


def test_a_stale_worker_cannot_overwrite_the_progress_of_a_job_that_moved_on():
    tasks.counts_with_progress.enqueue()
    tasks.counts_with_progress.enqueue()
    stale, kept = claim_all(2)
    moved_on = {"done": 1, "total": None}
    Job.objects.filter(pk=stale.job.id).update(lease_token="another-worker", progress=moved_on)  # noqa: S106
    stale.context.report_progress(9, 10, "from the stale worker")
    kept.context.report_progress(4, 10)
    LeaseKeeper(ALIAS, WORKER_ID).write_progress([stale, kept], time.monotonic())
    assert stored(stale.job) == moved_on
    assert stored(kept.job)["done"] == 4
    # Nor the last report of a handler that returned after losing its lease.
    stale.context.report_progress(10, 10, "last")
    write_last_progress(ALIAS, stale)
    assert stored(stale.job) == moved_on


def test_the_last_report_waits_for_a_heartbeat_write_in_flight_and_lands_after_it():
    tasks.counts_with_progress.enqueue()
    (held,) = claim_all(1)
    report_context = held.context
    report_context.report_progress(1, 3, "first")
    report = report_context.reported_progress
    report.lock.acquire()  # a heartbeat write in flight
    report_context.report_progress(3, 3, "last")
    finished = threading.Event()

    def handler_returns() -> None:
        try:
            write_last_progress(ALIAS, held)
        finally:
            connections.close_all()
            finished.set()

    thread = threading.Thread(target=handler_returns)
    thread.start()
    assert not finished.wait(0.2)  # it waits for the write in flight
    report.lock.release()  # the heartbeat's write is done
    thread.join(30)
    assert finished.is_set()
    assert stored(held.job)["message"] == "last"
    # The heartbeat has nothing left to write.
    with CaptureQueriesContext(connection) as after:
        LeaseKeeper(ALIAS, WORKER_ID).write_progress([held], time.monotonic() + 60)
    assert len(after) == 0


def test_watch_yields_each_new_report_until_the_job_finishes():
    job = tasks.counts_with_progress.enqueue(total=10)
    Job.objects.filter(pk=job.pk).update(progress={"done": 2, "total": 10, "message": "", "at": None})
    seen = []
    runner = None
    for progress in job.watch(timeout=60, interval=0.02):
        seen.append(progress["done"])
        if runner is None:
            # The first report seen: let a worker run the job to its end.
            runner = burst_in_thread()
    runner.join(60)
    assert seen[0] == 2 and seen[-1] == 10
    assert job.status == "succeeded" and job.result == 10  # the job's fields read again at the end


def test_watch_raises_wait_timeout_if_the_job_does_not_finish_in_time():
    job = tasks.counts_with_progress.enqueue(total=10)
    with pytest.raises(
        WaitTimeout, match=f"Job {job.pk} did not finish within 0.1 s; it may still run"
    ) as raised:
        list(job.watch(timeout=0.1, interval=0.02))
    assert isinstance(raised.value, TimeoutError) and raised.value.job_id == job.pk


def test_watch_of_a_finished_job_yields_its_last_report_and_ends():
    job = tasks.counts_with_progress.enqueue(total=3)
    assert run_burst() == 0
    fresh = Job.objects.defer("progress").get(pk=job.pk)
    fresh.progress = None
    assert [p["done"] for p in fresh.watch(timeout=0)] == [3]
    assert list(Job.objects.get(pk=job.pk).watch(timeout=0))[-1]["done"] == 3


def test_watch_of_a_deleted_job_says_so():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).delete()
    with pytest.raises(JobNotFound, match=f"Job {job.pk} was deleted while watched"):
        list(job.watch(timeout=1))


def test_awatch_follows_the_job_from_async_code_until_it_finishes():
    job = tasks.counts_with_progress.enqueue(total=7)
    Job.objects.filter(pk=job.pk).update(progress={"done": 1, "total": 7, "message": "", "at": None})

    async def follow() -> list[int]:
        seen = []
        async for progress in job.awatch(timeout=60, interval=0.02):
            seen.append(progress["done"])
            if len(seen) == 1:
                await sync_to_async(run_burst, thread_sensitive=False)()
        return seen

    seen = async_to_sync(follow)()
    assert seen == [1, 7]
    assert (job.status, job.result) == ("succeeded", 7)
    queued = tasks.add.enqueue(1)

    async def first_report() -> dict:
        return await queued.awatch(timeout=0).__anext__()

    with pytest.raises(WaitTimeout):
        async_to_sync(first_report)()
