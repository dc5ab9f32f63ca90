"""How much the claimer asks for: threads refill at half their capacity, async slots a tenth at a time."""

from __future__ import annotations

import pytest

from django_jobguard.worker.loop import ASYNC_REFILL_MIN_JOBS, Worker, claim_size, finishes_to_wait


def test_a_worker_claims_once_half_its_capacity_is_free_or_whatever_it_has_room_for_when_empty():
    assert claim_size(16, 7, holding=True) == 0
    assert claim_size(16, 8, holding=True) == 8
    assert claim_size(16, 3, holding=False) == 3
    assert claim_size(16, 0, holding=False) == 0


def test_a_full_worker_waits_for_as_many_finishes_as_a_claim_needs_not_one():
    assert finishes_to_wait(128, 128) == 64
    assert finishes_to_wait(128, 100) == 36
    assert finishes_to_wait(16, 9) == 1
    assert finishes_to_wait(1, 1) == 1
    # The capacity shrank below what is held (the jobs got long): a claim needs room for one.
    assert finishes_to_wait(2, 100) == 99
    # The room is there (acks awaited hold it, or max_jobs): only acks written or an empty
    # worker can change the claimer's mind, not a finish.
    assert finishes_to_wait(16, 8) is None
    assert finishes_to_wait(16, 0) is None
    for capacity in (1, 2, 3, 16, 128):
        for held in range(capacity + 1):
            needed = finishes_to_wait(capacity, held)
            if needed is None:
                assert claim_size(capacity, capacity - held, holding=held > 0) > 0
            else:
                # One finish fewer leaves no claim; that many make one.
                assert claim_size(capacity, capacity - held + needed - 1, holding=True) == 0
                assert claim_size(capacity, capacity - held + needed, holding=True) > 0


@pytest.mark.parametrize(("slots", "step"), [(500, 50), (2000, 200), (100, ASYNC_REFILL_MIN_JOBS)])
def test_async_slots_refill_a_tenth_at_a_time_not_half(slots, step):
    # Refilling only once half of 500 slots were free started 250 coroutines at once and left
    # a quarter of the slots empty on average (benchmarks/bench_slow_calls.py).
    worker = Worker(async_slots=slots, concurrency=1, install_signal_handlers=False)
    worker.slots.on_loop = slots - step
    capacity, free = worker._room()
    assert free == step
    assert claim_size(capacity, free, holding=True) == step
    worker.slots.on_loop = slots - step + 1
    capacity, free = worker._room()
    assert claim_size(capacity, free, holding=True) == 0


def test_unacked_coroutines_still_count_against_the_slots():
    worker = Worker(async_slots=500, concurrency=1, install_signal_handlers=False)
    worker.slots.on_loop = 400
    worker.completer.awaiting_acks = 60  # done, but their acks are not written yet
    capacity, free = worker._room()
    assert free == 40
    assert claim_size(capacity, free, holding=True) == 0
