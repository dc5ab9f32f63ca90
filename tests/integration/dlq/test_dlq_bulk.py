"""``dlq.decide_many``: a bulk replay step is set-based, checks each letter, and reports refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_jobguard import dlq, signals
from django_jobguard.dlq.transitions import RacedError, transition_many
from django_jobguard.models import DeadLetter, ReplayEvent, ReplayState
from tests.support.factories import make_dead_letters, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people():
    return SimpleNamespace(
        requester=make_user("rita", "request_replay", "view_payload", "view_deadletter"),
        approver=make_user("amir", "approve_replay", "view_deadletter"),
        reader=make_user("pia", "approve_replay", "view_deadletter", "view_payload"),
    )


def letters(count: int, **extra) -> list[int]:
    """Ids of ``count`` dead charges whose replay would succeed (an amount of 100)."""
    made = make_dead_letters(count, kwargs=lambda n: {"order_id": n, "amount": 100}, **extra)
    return [letter.pk for letter in made]


def statements(action, ids, user) -> tuple[int, dlq.BulkDecision]:
    with CaptureQueriesContext(connection) as ctx:
        decision = dlq.decide_many(action, ids, user, "the provider is back")
    return len(ctx.captured_queries), decision


def test_the_statements_of_a_bulk_step_do_not_grow_with_the_letters_in_a_chunk(people):
    few, many = letters(5), letters(200)
    small, _ = statements(dlq.REQUEST, few, people.requester)
    large, decision = statements(dlq.REQUEST, many, people.requester)
    assert decision.moved == many and decision.refused == []
    # The same statements for 200 letters as for 5 (plus the announcements' chunked reads).
    assert large <= small + 2, (small, large)
    assert ReplayEvent.objects.filter(dead_letter_id__in=many, action="requested").count() == 200
    assert set(DeadLetter.objects.filter(pk__in=many).values_list("replay_state", flat=True)) == {"requested"}
    approve, decision = statements(dlq.APPROVE, many, people.approver)
    assert len(decision.moved) == 200 and approve <= small + 2, (small, approve)


def test_refused_letters_are_reported_and_the_rest_move(people):
    ids = letters(6)
    dlq.decide_many(dlq.REQUEST, ids[:4], people.requester, "retry")
    dlq.approve_replay(ids[0], people.approver, "already")
    # A correction asked for by someone who may see payloads: an approver who may not is refused it.
    dlq.reject_replay(ids[1], people.approver, "redo with a fix")
    dlq.request_replay(ids[1], people.requester, "fixed amount", kwargs={"order_id": 1, "amount": 90})
    own = make_user("sam", "request_replay", "approve_replay", "view_deadletter", "view_payload")
    dlq.reject_replay(ids[2], people.approver, "redo")
    dlq.request_replay(ids[2], own, "mine")
    gone = ids[5]
    DeadLetter.objects.filter(pk=gone).delete()

    # The self-approval rule holds in bulk too.
    mine = dlq.decide_many(dlq.APPROVE, [ids[2]], own, "go")
    assert mine.moved == [] and "another user" in mine.refused[0][1]

    decision = dlq.decide_many(dlq.APPROVE, [*ids, ids[3]], people.approver, "go")
    assert decision.moved == [ids[2], ids[3]]
    why = dict(decision.refused)
    assert set(why) == {ids[0], ids[1], ids[4], gone}
    assert "approved" in why[ids[0]]  # its state allows no approval
    assert "jobguard.view_payload" in why[ids[1]]  # a correction the approver cannot see
    assert "requested" in why[ids[4]]  # never requested
    assert "no longer exists" in why[gone]
    # Someone who may see the correction approves it, bound to what it is now.
    seen = dlq.decide_many(dlq.APPROVE, [ids[1]], people.reader, "seen")
    assert seen.moved == [ids[1]]
    event = ReplayEvent.objects.get(dead_letter_id=ids[1], action="approved")
    assert event.data == {
        "payload_corrected": True,
        "correction_digest": dlq.correction_digest(DeadLetter.objects.get(pk=ids[1])),
    }


def test_each_moved_letter_sends_its_signal_after_the_commit(people):
    ids = letters(3)
    received = []

    def receiver(signal, dead_letter, user, **kwargs):
        received.append((dead_letter.pk, dead_letter.replay_state, user.username))

    signals.replay_requested.connect(receiver, weak=False, dispatch_uid="bulk-test")
    try:
        with transaction.atomic():
            dlq.decide_many(dlq.REQUEST, ids, people.requester, "retry")
            assert received == []  # nothing before the commit
    finally:
        signals.replay_requested.disconnect(dispatch_uid="bulk-test")
    assert sorted(received) == [(pk, "requested", "rita") for pk in ids]


def test_a_letter_moved_under_a_bulk_step_rolls_its_chunk_back(people):
    ids = letters(3)
    read = list(DeadLetter.objects.filter(pk__in=ids).order_by("pk"))
    # Another step moves one of them after the read (on a database without row locks).
    DeadLetter.objects.filter(pk=ids[1]).update(replay_state=ReplayState.REQUESTED)
    with pytest.raises(RacedError, match="1 of 3"), transaction.atomic():
        transition_many(
            "default",
            read,
            dlq.REQUEST,
            people.requester,
            "retry",
            lambda letter: {},
            replay_requested_by=people.requester,
        )
    assert not ReplayEvent.objects.filter(dead_letter_id__in=ids).exists()
    states = dict(DeadLetter.objects.filter(pk__in=ids).values_list("pk", "replay_state"))
    assert states == {ids[0]: "none", ids[1]: "requested", ids[2]: "none"}


@pytest.mark.parametrize("path", ["set-based", "one by one"])
def test_a_bulk_approval_is_bound_to_the_digest_of_each_letter_it_was_shown(people, path):
    from django_jobguard.dlq import replay

    ids = letters(5)
    dlq.decide_many(dlq.REQUEST, ids, people.requester, "retry")
    for pk in ids[:3]:  # three corrections, reviewed on the confirmation page
        dlq.reject_replay(pk, people.reader, "with a fix")
        dlq.request_replay(pk, people.requester, "fixed", kwargs={"order_id": pk, "amount": 90})
    page = {pk: dlq.correction_digest(DeadLetter.objects.get(pk=pk)) for pk in ids[:4]}
    # Between the page and its submit: ids[1]'s correction is swapped, ids[3] (original on the
    # page) gains one, and ids[2]'s correction is one the page did not list.
    DeadLetter.objects.filter(pk=ids[1]).update(replay_kwargs={"order_id": ids[1], "amount": 90_000})
    dlq.reject_replay(ids[3], people.reader, "with a fix")
    dlq.request_replay(ids[3], people.requester, "fixed", kwargs={"order_id": ids[3], "amount": 1})
    del page[ids[2]]

    if path == "set-based":
        decision = dlq.decide_many(dlq.APPROVE, ids, people.reader, "as reviewed", reviewed=page)
        moved, refused = decision.moved, decision.refused
    else:  # the path a chunk takes when another step moved one of its letters
        moved, refused = replay._decide_one_by_one(dlq.APPROVE, ids, people.reader, "as reviewed", page)
    # The letters as reviewed are approved: the original ids[4] (never changes) and ids[0].
    assert moved == [ids[0], ids[4]]
    why = dict(refused)
    assert set(why) == {ids[1], ids[2], ids[3]}
    assert f"#{ids[1]}'s replay payload changed since you reviewed it" in why[ids[1]]
    assert f"#{ids[3]}'s replay payload changed since you reviewed it" in why[ids[3]]
    assert "correction_digest" in why[ids[2]]
    states = dict(DeadLetter.objects.filter(pk__in=ids).values_list("pk", "replay_state"))
    assert [states[pk] for pk in ids] == ["approved", "requested", "requested", "requested", "approved"]


def test_a_bulk_approval_of_a_correction_by_an_approver_who_may_not_see_it_is_refused(people):
    ids = letters(2)
    dlq.decide_many(dlq.REQUEST, ids, people.requester, "retry")
    dlq.reject_replay(ids[0], people.reader, "with a fix")
    dlq.request_replay(ids[0], people.requester, "fixed", kwargs={"order_id": 0, "amount": 90})
    reviewed = {pk: dlq.correction_digest(DeadLetter.objects.get(pk=pk)) for pk in ids}
    decision = dlq.decide_many(dlq.APPROVE, ids, people.approver, "go", reviewed=reviewed)
    assert decision.moved == [ids[1]]
    assert "jobguard.view_payload" in dict(decision.refused)[ids[0]]
