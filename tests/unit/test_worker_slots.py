"""The held jobs' states, driven through the worker's slots alone: no database, no threads to wait on."""

import threading

from django_jobguard.outcome import HeldState
from django_jobguard.store import ClaimedJob
from django_jobguard.worker.slots import Slots


def job(job_id: int) -> ClaimedJob:
    return ClaimedJob(
        id=job_id,
        task_name="tests.task",
        queue_name="default",
        args=[],
        kwargs={},
        priority=0,
        attempts=1,
        max_attempts=3,
        lease_token=f"token-{job_id}",
        visibility_timeout=30.0,
        idempotency_key=None,
        lock_key="",
        handler_version="",
    )


def held_slots(*ids: int) -> Slots:
    slots = Slots()
    assert slots.add([job(i) for i in ids], now=0.0) == len(ids)
    return slots


def test_added_jobs_wait_in_claim_order_and_count_as_held():
    slots = held_slots(1, 2, 3)
    assert len(slots) == 3
    taken = [slots.next(), slots.next(), slots.next()]
    assert [h.job.id for h in taken if h] == [1, 2, 3]
    assert all(h.state is HeldState.WAITING for h in taken if h)
    assert [h.job.id for h in slots.active()] == [1, 2, 3]


def test_a_started_job_runs_on_its_connection_and_finishing_frees_its_slot():
    slots = held_slots(1)
    held = slots.next()
    assert held is not None
    connection = object()
    assert slots.start(held, connection)
    assert held.state is HeldState.RUNNING and held.connection is connection and held.started_at > 0
    slots.clear_freed()
    assert slots.finish(held) is False  # not replaced: the executor goes on
    assert held.state is HeldState.DONE
    assert len(slots) == 0 and slots.finished == 1
    assert slots.wait_freed(0)


def test_a_job_starts_once():
    slots = held_slots(1)
    held = slots.next()
    assert held is not None
    assert slots.start(held, object())
    assert not slots.start(held, object())


def test_closed_slots_start_nothing_and_release_waiting_executors():
    slots = held_slots(1)
    held = slots.next()
    assert held is not None
    slots.close()
    assert slots.closed
    assert not slots.start(held, object())
    assert held.state is HeldState.WAITING  # left for a hand-back
    slots.release_executors(2)
    assert slots.next() is None and slots.next() is None


def test_an_abandoned_job_is_settled_by_the_watchdog_not_by_its_thread():
    slots = held_slots(1)
    held = slots.next()
    assert held is not None
    slots.start(held, object())
    slots.clear_freed()
    assert slots.abandon(held)
    assert slots.wait_freed(0), "the abandoned job's slot goes to a replacement thread at once"
    assert held.state is HeldState.ABANDONED and slots.taken_over(held)
    assert len(slots) == 0 and slots.abandoned == 1
    # Its thread returns later: it must exit, and the job stays abandoned, counted once.
    assert slots.finish(held) is True
    assert held.state is HeldState.ABANDONED and slots.finished == 0
    assert not slots.abandon(held)
    assert slots.abandoned == 1


def test_only_a_running_job_can_be_abandoned():
    slots = held_slots(1)
    held = slots.next()
    assert held is not None
    assert not slots.abandon(held)
    assert held.state is HeldState.WAITING and len(slots) == 1


def test_drain_splits_running_from_waiting_and_marks_the_waiting_ones_as_going_back():
    slots = held_slots(1, 2, 3)
    first = slots.next()
    assert first is not None
    slots.start(first, object())
    running, waiting = slots.drain()
    assert [h.job.id for h in running] == [1]
    assert sorted(h.job.id for h in waiting) == [2, 3]
    assert all(h.state is HeldState.HANDING_BACK for h in waiting)
    # Being handed back, they no longer need their leases kept, nor may an executor start them.
    assert [h.job.id for h in slots.active()] == [1]
    assert not slots.start(waiting[0], object())
    for h in waiting:
        slots.handed_back(h)
        slots.remove(h)
    assert all(h.state is HeldState.HANDED_BACK for h in waiting)
    assert len(slots) == 1


def test_a_finish_racing_an_abandon_settles_the_job_exactly_once():
    # Many rounds of the executor finishing while the watchdog abandons the same job: each
    # job ends either done (its thread settled it) or abandoned (the watchdog did), never both.
    for _ in range(200):
        slots = held_slots(1)
        held = slots.next()
        assert held is not None
        slots.start(held, object())
        results: dict[str, bool] = {}
        barrier = threading.Barrier(2)

        def finish(slots=slots, held=held, results=results, barrier=barrier):
            barrier.wait()
            results["replaced"] = slots.finish(held)

        def abandon(slots=slots, held=held, results=results, barrier=barrier):
            barrier.wait()
            results["abandoned"] = slots.abandon(held)

        threads = [threading.Thread(target=finish), threading.Thread(target=abandon)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert results["replaced"] == results["abandoned"]
        assert slots.finished + slots.abandoned == 1
        assert len(slots) == 0


def test_routed_jobs_go_to_the_loop_and_are_counted_apart_from_the_threads():
    slots = Slots()
    sent = []
    slots.route(lambda claimed: claimed.id % 2 == 0, sent.extend)
    slots.add([job(i) for i in range(1, 7)], now=0.0)
    assert [h.job.id for h in sent] == [2, 4, 6]
    assert all(h.on_loop for h in sent)
    assert (len(slots), slots.on_loop, slots.on_threads) == (6, 3, 3)
    assert [slots.next().job.id for _ in range(3)] == [1, 3, 5]  # the threads get only the rest
    assert slots.start(sent[0], None)
    slots.finish(sent[0])
    assert slots.abandon(sent[1]) is False  # not running: nothing to give up on
    assert slots.start(sent[1], None) and slots.abandon(sent[1])
    assert (len(slots), slots.on_loop, slots.on_threads) == (4, 1, 3)
    slots.remove(sent[2])
    assert (slots.on_loop, slots.on_threads) == (0, 3)


def finish_one(slots: Slots) -> None:
    held = slots.next()
    assert held is not None and slots.start(held, object())
    assert slots.finish(held) is False


def test_finishes_wake_the_claimer_only_once_they_free_the_room_it_waits_for():
    # Waking the claim loop on every finish cost short jobs half a loop round per job (issue 57).
    slots = held_slots(*range(1, 9))
    slots.clear_freed()
    assert not slots.wait_freed(0, finishes=4)
    for _ in range(3):
        finish_one(slots)
        assert not slots.wait_freed(0, finishes=4), "a finish short of the room asked for woke the claimer"
    finish_one(slots)
    assert slots.wait_freed(0, finishes=None), "the fourth finish gave no notice"
    # A new look starts a new count.
    slots.clear_freed()
    assert not slots.wait_freed(0, finishes=2)
    finish_one(slots)
    assert not slots.wait_freed(0, finishes=2)


def test_finishes_before_the_wait_count_toward_it():
    # The claimer looks, then decides how many finishes to wait for: those in between count.
    slots = held_slots(1, 2, 3, 4)
    slots.clear_freed()
    assert not slots.wait_freed(0, finishes=None)
    finish_one(slots)
    finish_one(slots)
    assert not slots.wait_freed(0, finishes=3)
    assert slots.wait_freed(0, finishes=2)


def test_the_last_finish_and_written_acks_always_wake_the_claimer():
    slots = held_slots(1, 2, 3)
    slots.clear_freed()
    assert not slots.wait_freed(0, finishes=None)  # only acks written, or nothing held, wake it
    finish_one(slots)
    finish_one(slots)
    assert not slots.wait_freed(0, finishes=None)
    slots.freed()  # what the ack thread calls once it wrote a batch
    assert slots.wait_freed(0, finishes=None)
    slots.clear_freed()
    assert not slots.wait_freed(0, finishes=50)
    finish_one(slots)
    assert len(slots) == 0
    assert slots.wait_freed(0, finishes=None), "an empty worker must look for jobs at once"
