"""The async executor in one process: coroutines on the loop, sync tasks on threads, timeouts."""

import pytest

from django_jobguard.models import DeadLetter, Job
from django_jobguard.worker import Worker
from tests.testapp import tasks
from tests.testapp.models import Execution, LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)


def burst(**options):
    worker = Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, **options)
    assert worker.run() == 0
    return worker


def test_coroutines_run_on_the_loop_and_sync_tasks_on_the_threads():
    slow = [tasks.sleep_async.enqueue(f"s{i}", seconds=0.3) for i in range(40)]
    atomic = [tasks.record_async.enqueue(f"a{i}") for i in range(5)]
    sync = [tasks.add.enqueue(i, b=1) for i in range(5)]
    worker = burst(async_slots=50)
    assert sorted(Job.objects.values_list("status", flat=True).distinct()) == ["succeeded"]
    assert [job.result for job in Job.objects.filter(pk__in=[j.pk for j in sync]).order_by("pk")] == [
        i + 1 for i in range(5)
    ]
    assert Execution.objects.filter(marker__startswith="s").count() == 40
    assert sorted(LedgerEntry.objects.values_list("effect_key", flat=True)) == sorted(
        f"a{i}" for i in range(5)
    )
    assert worker.summary().startswith(f"jobs={len(slow) + len(atomic) + len(sync)} succeeded=50")


def test_a_timeout_cancels_only_its_own_coroutine():
    late = tasks.times_out_async.enqueue()
    others = [tasks.sleep_async.enqueue(f"t{i}", seconds=1.0) for i in range(10)]
    burst(async_slots=20)
    late.refresh_from_db()
    assert late.status == "dead"
    letter = DeadLetter.objects.get(job=late)
    assert letter.reason == "hard_timeout"
    assert "coroutine was cancelled" in letter.error_message
    assert set(Job.objects.filter(pk__in=[j.pk for j in others]).values_list("status", flat=True)) == {
        "succeeded"
    }


def test_a_keyed_and_locked_coroutine_takes_its_key_and_lock_and_a_duplicate_gets_the_result():
    from django_jobguard import locks

    first = tasks.keyed_async.enqueue(7)
    burst(async_slots=5)
    first.refresh_from_db()
    assert (first.status, first.result) == ("succeeded", {"n": 7, "fencing": True})
    assert not locks.lock("keyed-async-lock:7", ttl=5).locked()  # released after the ack
    again = tasks.keyed_async.enqueue(7)  # the same key: the stored result, no second run
    assert again.pk == first.pk or again.result == first.result


def test_a_paused_queue_is_not_claimed_by_an_async_worker_until_resumed():
    from django_jobguard.operations import queues

    job = tasks.add_async.enqueue(1, b=1)
    queues.pause(job.queue_name, actor="test", reason="maintenance")
    burst(async_slots=5)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("queued", 0)
    queues.resume(job.queue_name, actor="test")
    burst(async_slots=5)
    job.refresh_from_db()
    assert (job.status, job.result) == ("succeeded", 2)
