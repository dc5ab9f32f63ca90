"""The worker run in this process (burst mode), for outcomes that need no crash."""

import threading
import time

import pytest

from django_jobguard import store
from django_jobguard.models import DeadLetter, Job
from django_jobguard.worker import Worker
from django_jobguard.worker.loop import PREFETCH_MAX_JOBS, PREFETCH_TARGET_SECONDS
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)


def run_until(job, status, attempts=100):
    """Burst repeatedly (retries come due after a short backoff) until ``job`` reaches ``status``."""
    for _ in range(attempts):
        assert run_burst() == 0
        job.refresh_from_db()
        if job.status == status:
            return
        time.sleep(0.05)


def run_burst(**options):
    options.setdefault("concurrency", 2)
    return Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, **options).run()


def test_burst_runs_every_due_job_once_and_stores_results():
    jobs = [tasks.add.enqueue(i, b=1) for i in range(10)]
    assert run_burst() == 0
    for job in jobs:
        job.refresh_from_db()
        assert (job.status, job.result, job.attempts) == ("succeeded", job.args[0] + 1, 1)
        assert job.finished_at is not None and job.lease_token is None


def test_context_describes_the_run_and_its_database_alias():
    job = tasks.describe_context.enqueue()
    assert run_burst(queues=["context"], worker_id="context-worker") == 0
    job.refresh_from_db()
    assert job.result == {
        "job_id": job.pk,
        "attempt": 1,
        "queue_name": "context",
        "worker_id": "context-worker",
        "using": "default",
    }


def test_atomic_task_writes_and_ack_commit_together():
    job = tasks.record.enqueue("alpha", amount=5)
    run_burst()
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert LedgerEntry.objects.get(effect_key="alpha").job_id == job.pk


def test_failing_atomic_task_rolls_back_its_writes_before_retrying():
    # The same marker twice: the second job's ledger insert violates the unique key.
    tasks.record.enqueue("dup")
    second = tasks.record.enqueue("dup")
    Job.objects.filter(pk=second.pk).update(max_attempts=1)
    run_burst(concurrency=1)
    second.refresh_from_db()
    assert second.status == "dead"
    # Its Execution row was written in the same transaction, so it rolled back too.
    assert Execution.objects.filter(job_id=second.pk).count() == 0
    assert LedgerEntry.objects.count() == 1


def test_unknown_task_is_never_run_and_goes_to_the_dead_letter_queue():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(task_name="tests.testapp.tasks.removed")
    run_burst()
    job.refresh_from_db()
    assert job.status == "dead"
    letter = DeadLetter.objects.get(job=job)
    assert (letter.reason, letter.category, letter.error_class) == (
        "unknown_task",
        "permanent",
        "UnknownTaskError",
    )
    assert "tests.testapp.tasks.removed" in letter.error_message
    assert "tests.testapp.tasks is imported here but has no task of that name" in letter.error_message


@pytest.mark.parametrize(
    ("task_name", "advice"),
    [
        (
            "tests.testapp.jobs.send",
            "tests.testapp.jobs is not one of them: move the task into tests.testapp.tasks, or import "
            "tests.testapp.jobs from tests.testapp.tasks (or from the ready() of tests.testapp's AppConfig).",
        ),
        (
            "elsewhere.jobs.send",
            "elsewhere.jobs belongs to no installed app: add its app to INSTALLED_APPS, or move the task "
            "into an app's tasks module.",
        ),
    ],
)
def test_an_unknown_tasks_dead_letter_says_where_tasks_are_looked_for(task_name, advice):
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(task_name=task_name)
    run_burst()
    error = DeadLetter.objects.get(job=job).error_message
    assert error.startswith(f"no task is registered as {task_name!r} in this worker; it was never run.")
    assert "the tasks module of each app in INSTALLED_APPS (" in error and "tests.testapp.tasks" in error
    assert advice in error
    assert "restart it, then replay the dead letter" in error


def test_payload_that_no_longer_binds_is_dead_lettered_as_invalid():
    job = tasks.add.enqueue(1)
    Job.objects.filter(pk=job.pk).update(kwargs={"c": 3})
    run_burst()
    letter = DeadLetter.objects.get(job=job)
    assert (letter.reason, letter.category) == ("invalid_payload", "permanent")
    assert "unexpected keyword argument 'c'" in letter.error_message
    assert letter.kwargs == {"c": 3}


def test_non_json_return_value_is_dead_lettered():
    job = tasks.returns_object.enqueue()
    run_burst()
    letter = DeadLetter.objects.get(job=job)
    assert letter.reason == "invalid_result"
    assert "return value" in letter.error_message


def test_a_return_value_postgresql_cannot_store_is_dead_lettered_saying_why():
    """Refused before the ack on both databases (on PostgreSQL it failed the ack with a DataError)."""
    job = tasks.returns_nul.enqueue()
    run_burst()
    letter = DeadLetter.objects.get(job=job)
    assert (letter.reason, letter.category) == ("invalid_result", "permanent")
    assert letter.error_message.startswith("return value['note'] holds a NUL character (\\x00) at position 1")
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result) == ("dead", 1, None)


def test_transient_failures_are_retried_then_succeed():
    job = tasks.flaky.enqueue("t", failures=2)
    run_until(job, "succeeded")
    assert (job.status, job.attempts, job.result) == ("succeeded", 3, 3)
    assert "planned failure 2/2" in job.last_error
    assert Execution.objects.filter(marker="t").count() == 3


def test_permanent_error_goes_to_the_dead_letter_queue_at_once_with_its_traceback():
    job = tasks.flaky.enqueue("p", failures=5, error="invalid_order")
    run_burst()
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("dead", 1)
    letter = DeadLetter.objects.get(job=job)
    assert letter.reason == "permanent_error"
    assert letter.error_class == "tests.testapp.tasks.InvalidOrder"
    assert "Traceback" in letter.traceback and "planned failure 1/5" in letter.traceback
    assert letter.first_failed_at == letter.last_failed_at == job.finished_at


def test_system_exit_in_a_handler_fails_the_job_not_the_worker():
    job = tasks.flaky.enqueue("s", failures=1, error="system_exit")
    run_until(job, "succeeded")
    assert (job.status, job.attempts) == ("succeeded", 2)


def test_a_signal_receiver_that_raises_is_logged_and_breaks_nothing(caplog):
    from django_jobguard import signals

    def broken(**kwargs):
        raise RuntimeError("receiver bug")

    signals.job_started.connect(broken)
    signals.job_succeeded.connect(broken)
    try:
        job = tasks.add.enqueue(1, b=1)
        assert run_burst() == 0
    finally:
        signals.job_started.disconnect(broken)
        signals.job_succeeded.disconnect(broken)
    job.refresh_from_db()
    assert (job.status, job.result) == ("succeeded", 2)
    failures = [r for r in caplog.records if r.getMessage().startswith("signal_receiver_failed")]
    assert len(failures) == 2
    assert "receiver bug" in str(failures[0].exc_info[1])


def test_a_worker_stops_prefetching_once_its_jobs_run_long():
    worker = Worker(concurrency=3, install_signal_handlers=False)
    assert worker.capacity_now() == 6  # short (or unknown) jobs: a batch of twice the concurrency
    for _ in range(50):
        worker.note_run_time(5.0)
    assert worker.capacity_now() == 3  # long jobs: only what the executors can start
    pinned = Worker(concurrency=3, batch_size=10, install_signal_handlers=False)
    for _ in range(50):
        pinned.note_run_time(5.0)
    assert pinned.capacity_now() == 10  # an explicit --batch-size is kept
    first_long = Worker(concurrency=3, install_signal_handlers=False)
    first_long.note_run_time(5.0)
    assert first_long.capacity_now() == 3  # the first run seeds the mean: one long job is enough


def test_a_worker_holds_more_short_jobs_once_it_has_seen_enough_of_them():
    worker = Worker(concurrency=2, install_signal_handlers=False)
    for _ in range(3):
        worker.note_run_time(0.0001)
    assert worker.capacity_now() == 4  # still learning: twice the concurrency
    worker.note_run_time(0.0001)
    assert worker.capacity_now() == PREFETCH_MAX_JOBS  # 20 ms of 0.1 ms jobs is more than the cap
    medium = Worker(concurrency=2, install_signal_handlers=False)
    for _ in range(10):
        medium.note_run_time(0.004)
    assert medium.capacity_now() == 2 * int(PREFETCH_TARGET_SECONDS / 0.004)  # 5 per thread
    slower = Worker(concurrency=2, install_signal_handlers=False)
    for _ in range(10):
        slower.note_run_time(0.05)
    assert slower.capacity_now() == 4  # past 10 ms a job: never less than twice the concurrency
    pinned = Worker(concurrency=2, batch_size=3, install_signal_handlers=False)
    for _ in range(10):
        pinned.note_run_time(0.0001)
    assert pinned.capacity_now() == 3


def test_a_burst_of_short_jobs_is_claimed_in_growing_batches(monkeypatch):
    asked = []
    claim = store.claim

    def counted(alias, queues, limit, *args):
        asked.append(limit)
        return claim(alias, queues, limit, *args)

    monkeypatch.setattr(store, "claim", counted)
    jobs = tasks.noop.bulk_enqueue([((), {}) for _ in range(300)])
    assert run_burst(concurrency=2) == 0
    assert set(Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("status", flat=True)) == {
        "succeeded"
    }
    assert asked[0] == 4  # a new worker asks for twice its concurrency
    assert max(asked) > 4 * 4, asked  # then, knowing the jobs are short, for many more at once
    assert len(asked) < 300 / 4, asked  # so far fewer claims than one per two jobs


@pytest.mark.parametrize("ack_window", [0.0, 0.005])
def test_a_full_worker_is_woken_by_the_finishes_that_make_room_not_by_its_poll(settings, ack_window):
    # The claimer sleeps until enough jobs finished for a claim, or the last one, or acks were
    # written. With a poll of ten minutes, a wake-up it missed would keep it idle past the
    # deadline: 5 jobs of max_jobs take a claim of 4, one at half the room and one once empty.
    settings.JOBGUARD = {**settings.JOBGUARD, "ACK_WINDOW": ack_window}
    jobs = [tasks.add.enqueue(i, b=1) for i in range(10)]
    worker = Worker(
        burst=True, max_jobs=5, batch_size=4, concurrency=2, install_signal_handlers=False, poll_interval=600
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the worker sat idle with room and jobs waiting"
    assert worker.exit_code == 0 and worker.processed == 5
    statuses = sorted(Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("status", flat=True))
    assert statuses == ["queued"] * 5 + ["succeeded"] * 5
