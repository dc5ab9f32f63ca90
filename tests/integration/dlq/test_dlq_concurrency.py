"""Concurrent approvals and redrives from threads, each on its own database connection."""

import threading
from collections import Counter

import pytest
from django.db import connections

from django_jobguard import dlq
from django_jobguard.exceptions import ReplayError
from django_jobguard.models import DeadLetter, ReplayEvent
from tests.support.dlq import dead_charge, replay_jobs
from tests.support.factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)


def race(count, target):
    """Run ``target(index)`` in ``count`` threads released together; their results or exceptions."""
    barrier = threading.Barrier(count)
    results = [None] * count

    def run(index):
        try:
            barrier.wait(timeout=30)
            results[index] = target(index)
        except Exception as exc:  # the test inspects what each thread got
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_concurrent_approvals_make_one_approval_and_one_replay_job():
    requester = make_user("rita", "request_replay", "view_deadletter")
    approvers = [make_user(f"approver{i}", "approve_replay", "view_deadletter") for i in range(6)]
    letter = dead_charge(order_id=1)
    dlq.request_replay(letter, requester, "after the fix")

    results = race(len(approvers), lambda i: dlq.approve_replay(letter.pk, approvers[i], f"ok from {i}"))
    approved = [r for r in results if isinstance(r, DeadLetter)]
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(approved) == 1, results
    assert all(isinstance(r, ReplayError) and "approved" in str(r) for r in refused), refused
    assert ReplayEvent.objects.filter(dead_letter=letter, action="approved").count() == 1

    made = race(4, lambda i: dlq.redrive(worker_id=f"w{i}"))
    assert not [r for r in made if isinstance(r, Exception)], made
    assert sum(len(r) for r in made) == 1
    [job] = replay_jobs()
    letter.refresh_from_db()
    assert (letter.replay_state, letter.replay_job_id) == ("replayed", job.pk)
    assert ReplayEvent.objects.filter(dead_letter=letter, action="replayed").count() == 1


def test_concurrent_redrives_of_many_letters_make_exactly_one_job_each(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "REPLAY": {"RATE_PER_MINUTE": 600}}
    requester = make_user("rita", "request_replay", "view_deadletter")
    approver = make_user("amir", "approve_replay", "view_deadletter")
    letters = [dead_charge(order_id=10 + i) for i in range(12)]
    for letter in letters:
        dlq.request_replay(letter, requester, "mass replay")
        dlq.approve_replay(letter, approver, "ok")

    def drain(index):
        jobs = []
        # A pass skipped because another thread holds the throttle makes nothing; keep going.
        for _ in range(200):
            jobs += dlq.redrive(worker_id=f"w{index}")
            if not DeadLetter.objects.filter(replay_state="approved").exists():
                break
        return jobs

    results = race(6, drain)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(len(r) for r in results) == 12
    jobs = replay_jobs()
    assert len(jobs) == 12
    assert Counter(job.replayed_from.pk for job in jobs) == Counter(letter.pk for letter in letters)
    assert ReplayEvent.objects.filter(action="replayed").count() == 12


def test_simultaneous_redrive_passes_stay_within_the_throttle(settings):
    # 12 a minute allows 2 in any 10 s: eight passes at once must still make 2 jobs, not 16.
    settings.JOBGUARD = {**settings.JOBGUARD, "REPLAY": {"RATE_PER_MINUTE": 12}}
    requester = make_user("rita", "request_replay", "view_deadletter")
    approver = make_user("amir", "approve_replay", "view_deadletter")
    # Dead-letter them all first: the in-process worker making them would redrive approved ones.
    for letter in [dead_charge(order_id=order_id) for order_id in range(30, 40)]:
        dlq.request_replay(letter, requester, "mass replay")
        dlq.approve_replay(letter, approver, "ok")

    results = race(8, lambda i: dlq.redrive(worker_id=f"w{i}"))
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sum(len(r) for r in results) == 2
    assert len(replay_jobs()) == 2
    assert DeadLetter.objects.filter(replay_state="approved").count() == 8
