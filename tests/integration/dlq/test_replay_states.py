"""The replay state machine from every state, and what one redrive pass reports."""

import datetime
import threading

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_jobguard import dlq
from django_jobguard.exceptions import ReplayError
from django_jobguard.models import (
    DeadLetter,
    Job,
    Lock,
    ReplayEvent,
    ReplayState,
)
from tests.support.factories import make_dead_letter, make_user
from tests.testapp import tasks_dlq

pytestmark = pytest.mark.django_db(transaction=True)

#: The machine, written out: (transition, state it starts from) → the state it leads to.
#: Every pair not listed is refused.
ALLOWED = {
    ("request", "none"): "requested",
    ("request", "rejected"): "requested",
    ("approve", "requested"): "approved",
    ("reject", "requested"): "rejected",
    ("reject", "approved"): "rejected",
}
#: What each refusal names as the states the transition may start from.
ALLOWED_FROM_TEXT = {"request": "none or rejected", "approve": "requested", "reject": "requested or approved"}
STATES = ["none", "requested", "approved", "rejected", "replayed"]


@pytest.fixture
def requester():
    return make_user("rita", "request_replay", "view_payload", "view_deadletter")


@pytest.fixture
def approver():
    return make_user("amir", "approve_replay", "view_deadletter")


def letter_in(state, requester=None, *, key=None, decided_at=None, order_id=1):
    """A dead letter of a charge, put straight into ``state`` (a replayed one with its job)."""
    now = timezone.now()
    replay_job = tasks_dlq.charge.enqueue(order_id=order_id, amount=5) if state == "replayed" else None
    return make_dead_letter(
        kwargs={"order_id": order_id, "amount": 0},
        max_attempts=3,
        idempotency_key=key,
        replay_state=state,
        replay_requested_by=requester if state != "none" else None,
        replay_decided_at=decided_at or (now if state in ("approved", "rejected", "replayed") else None),
        replay_job=replay_job,
        replayed_at=now if state == "replayed" else None,
    )


def make(transition, letter, requester, approver):
    if transition == "request":
        return dlq.request_replay(letter, requester, "from the state machine test")
    if transition == "approve":
        return dlq.approve_replay(letter, approver, "from the state machine test")
    return dlq.reject_replay(letter, approver, "from the state machine test")


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("transition", ["request", "approve", "reject"])
def test_a_transition_moves_only_the_states_the_machine_allows(transition, state, requester, approver):
    letter = letter_in(state, requester)
    expected = ALLOWED.get((transition, state))
    if expected is None:
        detail = (
            f"it was replayed already as job #{letter.replay_job_id}"
            if state == "replayed"
            else f"its replay is {state}"
        )
        message = (
            f"Cannot {transition} a replay of dead letter #{letter.pk}: {detail} "
            f"(allowed from {ALLOWED_FROM_TEXT[transition]})."
        )
        with pytest.raises(ReplayError) as refused:
            make(transition, letter, requester, approver)
        assert str(refused.value) == message
        letter.refresh_from_db()
        assert letter.replay_state == state
        assert not ReplayEvent.objects.filter(dead_letter=letter).exists()
    else:
        make(transition, letter, requester, approver)
        letter.refresh_from_db()
        assert letter.replay_state == expected
        [event] = ReplayEvent.objects.filter(dead_letter=letter)
        actor = requester if transition == "request" else approver
        assert (event.action, event.actor_name) == (expected, actor.get_username())


@pytest.mark.parametrize("state", STATES)
def test_only_an_approved_replay_is_redriven(state, requester):
    letter = letter_in(state, requester)
    jobs_before = Job.objects.count()
    result = dlq.redrive_once(worker_id="w1")
    letter.refresh_from_db()
    if state == "approved":
        [job] = result.jobs
        assert (letter.replay_state, letter.replay_job_id) == ("replayed", job.pk)
        assert ReplayEvent.objects.get(dead_letter=letter).action == "replayed"
    else:
        assert result == dlq.RedrivePass(skipped=dlq.RedriveSkip.NOTHING_APPROVED)
        assert letter.replay_state == state
        assert Job.objects.count() == jobs_before


def test_the_enum_and_the_old_constants_name_the_same_transitions():
    assert [dlq.REQUEST, dlq.APPROVE, dlq.REJECT] == ["request", "approve", "reject"]
    assert list(dlq.Transition) == [dlq.REQUEST, dlq.APPROVE, dlq.REJECT]
    assert {ReplayState(to) for to in dlq.LEADS_TO.values()} == {"requested", "approved", "rejected"}


def approved_letters(requester, count):
    start = timezone.now() - datetime.timedelta(minutes=5)
    return [
        letter_in("approved", requester, decided_at=start + datetime.timedelta(seconds=i), order_id=i)
        for i in range(count)
    ]


def test_a_pass_reports_its_budget_and_jobs_then_that_the_throttle_is_spent(requester, settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "REPLAY": {"RATE_PER_MINUTE": 7}}
    letters = approved_letters(requester, 3)

    first = dlq.redrive_once()
    assert (first.budget, first.deferred, first.skipped, len(first.jobs)) == (2, 0, None, 2)  # ceil(7 / 6)
    assert [job.replayed_from for job in first.jobs] == letters[:2]  # oldest approval first

    second = dlq.redrive_once()
    assert second == dlq.RedrivePass(budget=0, skipped=dlq.RedriveSkip.THROTTLED)
    assert DeadLetter.objects.get(pk=letters[2].pk).replay_state == "approved"


def test_a_batch_size_of_zero_is_reported_as_throttled(requester):
    approved_letters(requester, 1)
    assert dlq.redrive_once(batch_size=0) == dlq.RedrivePass(budget=0, skipped=dlq.RedriveSkip.THROTTLED)
    assert len(dlq.redrive_once(batch_size=1).jobs) == 1


def test_a_replay_whose_key_another_live_job_owns_is_reported_as_deferred(requester):
    letter_in("approved", requester, key="charge:order:7", order_id=7)
    owner = tasks_dlq.charge.using(idempotency_key="charge:order:7").enqueue(order_id=7, amount=700)

    result = dlq.redrive_once()
    assert (result.jobs, result.deferred, result.skipped) == ((), 1, None)
    assert result.budget > 0
    assert list(Job.objects.values_list("pk", flat=True)) == [owner.pk]


@pytest.mark.server_db
def test_a_pass_that_finds_the_throttle_held_elsewhere_is_reported_as_busy(requester):
    approved_letters(requester, 1)
    dlq.redrive_once(batch_size=0)  # creates the throttle row
    held, release = threading.Event(), threading.Event()

    def hold_the_throttle():
        try:
            with transaction.atomic():
                list(Lock.objects.select_for_update().filter(key=dlq.THROTTLE_LOCK_KEY))
                held.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_throttle)
    holder.start()
    try:
        assert held.wait(timeout=30)
        assert dlq.redrive_once() == dlq.RedrivePass(skipped=dlq.RedriveSkip.BUSY)
    finally:
        release.set()
        holder.join(timeout=30)
    assert len(dlq.redrive_once().jobs) == 1
