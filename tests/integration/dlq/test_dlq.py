"""The replay workflow's service layer: states, permissions, payload checks, idempotency keys, throttle."""

from types import SimpleNamespace

import pytest
from django.db.models import F

from django_jobguard import dlq, idempotency, signals, store
from django_jobguard.exceptions import (
    IdempotencyConflict,
    InvalidArgumentsError,
    ReplayError,
    ReplayPermissionDenied,
)
from django_jobguard.models import DeadLetter, IdempotencyKey, Job, ReplayEvent
from tests.support.dlq import dead_charge, replay_jobs, run_burst
from tests.support.factories import make_user
from tests.testapp import tasks, tasks_dlq
from tests.testapp.models import Execution, LedgerEntry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def people():
    return SimpleNamespace(
        requester=make_user("rita", "request_replay", "view_payload", "view_deadletter"),
        # Approving a corrected payload needs view_payload: amir may see what he approves.
        approver=make_user("amir", "approve_replay", "view_deadletter", "view_payload"),
        outsider=make_user("olga", "view_deadletter", "view_payload"),
        blind=make_user("bob", "request_replay", "view_deadletter"),
    )


def trail(letter):
    return list(ReplayEvent.objects.filter(dead_letter=letter).values_list("action", "actor_name", "reason"))


def snapshot(letter):
    """Everything a refused transition must leave as it was."""
    letter.refresh_from_db()
    return (
        letter.replay_state,
        letter.replay_args,
        letter.replay_kwargs,
        letter.replay_requested_by_id,
        letter.replay_decided_by_id,
        letter.replay_job_id,
        ReplayEvent.objects.filter(dead_letter=letter).count(),
        Job.objects.count(),
    )


def test_request_approve_redrive_runs_the_corrected_payload_under_the_same_key(people):
    letter = dead_charge(order_id=1, amount=0, key="charge:order:1")
    assert (letter.reason, letter.category, letter.replay_state) == ("permanent_error", "permanent", "none")
    key = IdempotencyKey.objects.get(key="charge:order:1")
    assert (key.status, key.job_id) == ("failed", letter.job_id)

    dlq.request_replay(
        letter, people.requester, "amount was typed in euros", kwargs={"order_id": 1, "amount": 1250}
    )
    assert (letter.replay_state, letter.replay_kwargs, letter.replay_args) == (
        "requested",
        {"order_id": 1, "amount": 1250},
        [],
    )
    dlq.approve_replay(letter, people.approver, "checked with finance")
    assert (letter.replay_state, letter.replay_decided_by) == ("approved", people.approver)

    [job] = dlq.redrive(worker_id="test")
    letter.refresh_from_db()
    assert (letter.replay_state, letter.replay_job) == ("replayed", job)
    assert letter.replayed_at is not None
    assert (job.status, job.kwargs, job.idempotency_key, job.attempts) == (
        "queued",
        {"order_id": 1, "amount": 1250},
        "charge:order:1",
        0,
    )
    key.refresh_from_db()
    assert (key.status, key.job_id) == ("in_progress", job.pk)

    run_burst()
    job.refresh_from_db()
    assert (job.status, job.result) == ("succeeded", 1250)
    assert LedgerEntry.objects.get(effect_key="charge:1").amount == 1250
    key.refresh_from_db()
    assert (key.status, key.job_id, key.result) == ("succeeded", job.pk, 1250)
    assert trail(letter) == [
        ("requested", "rita", "amount was typed in euros"),
        ("approved", "amir", "checked with finance"),
        ("replayed", "", "redriven by worker test"),
    ]
    request_event = ReplayEvent.objects.get(dead_letter=letter, action="requested")
    assert request_event.data == {
        "payload_corrected": True,
        "args": [],
        "kwargs": {"order_id": 1, "amount": 1250},
    }
    assert request_event.actor == people.requester and request_event.created_at is not None


def test_each_transition_sends_its_signal_after_commit(people):
    received = []

    def receiver(signal, **kwargs):
        received.append((kwargs["dead_letter"].replay_state, getattr(kwargs["user"], "username", None)))

    for signal in (signals.replay_requested, signals.replay_approved, signals.replay_rejected):
        signal.connect(receiver, weak=False, dispatch_uid=f"test-{id(signal)}")
    jobs = []
    signals.replay_redriven.connect(
        lambda **kw: jobs.append((kw["dead_letter"].replay_state, kw["job"].pk)),
        weak=False,
        dispatch_uid="t-r",
    )
    try:
        first, second = dead_charge(order_id=2), dead_charge(order_id=3)
        dlq.request_replay(first, people.requester, "retry it")
        dlq.request_replay(second, people.requester, "retry it")
        dlq.reject_replay(second, people.approver, "no: the customer cancelled")
        dlq.approve_replay(first, people.approver, "ok")
        [job] = dlq.redrive()
    finally:
        for signal in (signals.replay_requested, signals.replay_approved, signals.replay_rejected):
            signal.disconnect(dispatch_uid=f"test-{id(signal)}")
        signals.replay_redriven.disconnect(dispatch_uid="t-r")
    assert received == [
        ("requested", "rita"),
        ("requested", "rita"),
        ("rejected", "amir"),
        ("approved", "amir"),
    ]
    assert jobs == [("replayed", job.pk)]


def test_a_user_without_the_request_permission_is_refused_and_nothing_changes(people):
    letter = dead_charge(order_id=4)
    before = snapshot(letter)
    with pytest.raises(
        ReplayPermissionDenied, match=r"amir may not request replays: that needs the jobguard\.request_replay"
    ):
        dlq.request_replay(letter, people.approver, "please")
    assert snapshot(letter) == before


def test_approving_and_rejecting_need_the_approve_permission(people):
    letter = dead_charge(order_id=5)
    dlq.request_replay(letter, people.requester, "please")
    before = snapshot(letter)
    for service in (dlq.approve_replay, dlq.reject_replay):
        with pytest.raises(
            ReplayPermissionDenied, match=r"olga may not .* jobguard\.approve_replay permission"
        ):
            service(letter, people.outsider, "let me")
    assert snapshot(letter) == before


def test_the_requester_cannot_approve_their_own_request_unless_the_setting_allows_it(people, settings):
    both = make_user("sam", "request_replay", "approve_replay", "view_deadletter")
    letter = dead_charge(order_id=6)
    dlq.request_replay(letter, both, "mine")
    before = snapshot(letter)
    with pytest.raises(
        ReplayPermissionDenied, match=r"sam requested this replay, so another user .*ALLOW_SELF_APPROVAL"
    ):
        dlq.approve_replay(letter, both, "approving my own")
    assert snapshot(letter) == before
    assert dlq.available_actions(letter, both) == ["reject"]  # withdrawing one's own request is fine

    settings.JOBGUARD = {**settings.JOBGUARD, "REPLAY": {"ALLOW_SELF_APPROVAL": True}}
    dlq.approve_replay(letter, both, "small team")
    assert letter.replay_state == "approved"


def test_correcting_a_payload_needs_the_view_payload_permission(people):
    letter = dead_charge(order_id=7)
    before = snapshot(letter)
    with pytest.raises(
        ReplayPermissionDenied, match=r"bob may not correct payloads: .*jobguard\.view_payload"
    ):
        dlq.request_replay(letter, people.blind, "fix", kwargs={"order_id": 7, "amount": 5})
    assert snapshot(letter) == before
    dlq.request_replay(letter, people.blind, "replay as it was")  # the original payload needs no view
    assert (letter.replay_state, letter.replay_kwargs) == ("requested", None)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (None, {"order_id": 8, "amount": 5, "currency": "EUR"}, "unexpected keyword argument 'currency'"),
        (None, {"order_id": 8}, "missing a required argument: 'amount'"),
        ([8], {"order_id": 8, "amount": 5}, "multiple values for argument 'order_id'"),
        (
            None,
            {"order_id": 8, "amount": {1, 2}},
            r"kwargs\['amount'\]: Unsupported type: builtins\.set is not JSON-serialisable",
        ),
        ("8", None, "args must be a JSON array, not str"),
        (None, ["order_id"], "kwargs must be a JSON object, not list"),
    ],
)
def test_a_corrected_payload_must_fit_the_handler_and_be_json(people, args, kwargs, message):
    letter = dead_charge(order_id=8)
    before = snapshot(letter)
    with pytest.raises(InvalidArgumentsError, match=message):
        dlq.request_replay(letter, people.requester, "fix", args=args, kwargs=kwargs)
    assert snapshot(letter) == before


def test_a_correction_equal_to_the_original_replays_the_original(people):
    letter = dead_charge(order_id=9)
    dlq.request_replay(letter, people.requester, "same", args=[], kwargs={"amount": 0, "order_id": 9})
    assert (letter.replay_args, letter.replay_kwargs) == (None, None)
    assert ReplayEvent.objects.get(dead_letter=letter).data == {"payload_corrected": False}


def test_every_transition_needs_a_reason(people):
    letter = dead_charge(order_id=10)
    before = snapshot(letter)
    with pytest.raises(ReplayError, match="A reason is required to request a replay"):
        dlq.request_replay(letter, people.requester, "   ")
    assert snapshot(letter) == before


def test_transitions_follow_the_state_machine(people):
    letter = dead_charge(order_id=11)
    with pytest.raises(
        ReplayError, match=r"Cannot approve .*: its replay is none \(allowed from requested\)"
    ):
        dlq.approve_replay(letter, people.approver, "early")
    dlq.request_replay(letter, people.requester, "first")
    with pytest.raises(ReplayError, match=r"Cannot request .*: its replay is requested"):
        dlq.request_replay(letter, people.requester, "again")
    dlq.approve_replay(letter, people.approver, "ok")
    # An approved replay not yet redriven can still be withdrawn...
    dlq.reject_replay(letter, people.approver, "wrong one, sorry")
    assert letter.replay_state == "rejected"
    assert dlq.redrive() == []
    # ...and requested again.
    dlq.request_replay(letter, people.requester, "second try", kwargs={"order_id": 11, "amount": 3})
    dlq.approve_replay(letter, people.approver, "ok now")
    [job] = dlq.redrive()
    with pytest.raises(ReplayError, match=rf"it was replayed already as job #{job.pk}"):
        dlq.request_replay(letter, people.requester, "third")
    with pytest.raises(ReplayError, match="Cannot reject"):
        dlq.reject_replay(letter, people.approver, "too late")
    assert [action for action, _, _ in trail(letter)] == [
        "requested",
        "approved",
        "rejected",
        "requested",
        "approved",
        "replayed",
    ]


def test_a_dead_letter_is_replayed_once_however_often_redrive_runs(people):
    letter = dead_charge(order_id=12)
    dlq.request_replay(letter, people.requester, "go")
    dlq.approve_replay(letter, people.approver, "go")
    made = [job for _ in range(3) for job in dlq.redrive()]
    assert len(made) == 1
    assert replay_jobs() == made


def test_the_payload_is_checked_again_at_approval(people):
    letter = dead_charge(order_id=13)
    dlq.request_replay(letter, people.requester, "go", kwargs={"order_id": 13, "amount": 7})
    # The handler changed between request and approval (simulated by a stale stored correction).
    DeadLetter.objects.filter(pk=letter.pk).update(replay_kwargs={"order": 13})
    before = snapshot(letter)
    with pytest.raises(
        InvalidArgumentsError,
        match="unexpected keyword argument 'order'; missing required arguments: 'order_id', 'amount'",
    ):
        dlq.approve_replay(letter, people.approver, "ok")
    assert snapshot(letter) == before


def test_a_replay_waits_while_another_live_job_owns_the_key_and_is_acked_as_a_duplicate_after(people):
    letter = dead_charge(order_id=14, key="charge:order:14")
    # The key expired and a producer resent the action with a good amount: a new job owns the key.
    IdempotencyKey.objects.filter(key="charge:order:14").update(expires_at=F("created_at"))
    resent = tasks_dlq.charge.using(idempotency_key="charge:order:14").enqueue(order_id=14, amount=900)
    assert resent.pk != letter.job_id
    dlq.request_replay(letter, people.requester, "replay it")
    dlq.approve_replay(letter, people.approver, "ok")

    assert dlq.redrive() == []  # the resent job is queued: it owns the action now
    letter.refresh_from_db()
    assert letter.replay_state == "approved"

    assert run_burst() == 0  # runs the resent job (the redrive at its start still defers)
    resent.refresh_from_db()
    assert resent.status == "succeeded"
    [job] = dlq.redrive()
    assert ReplayEvent.objects.get(dead_letter=letter, action="replayed").data["idempotency_key"] == (
        "already_succeeded"
    )
    run_burst()
    job.refresh_from_db()
    # The action had succeeded: the replay returns the stored result without running the handler.
    assert (job.status, job.result) == ("succeeded", 900)
    assert not Execution.objects.filter(job_id=job.pk).exists()
    assert LedgerEntry.objects.get(effect_key="charge:14").job_id == resent.pk


def test_a_pruned_key_is_recreated_so_the_action_stays_deduplicated(people):
    letter = dead_charge(order_id=15, key="charge:order:15")
    IdempotencyKey.objects.filter(key="charge:order:15").delete()
    dlq.request_replay(letter, people.requester, "go", kwargs={"order_id": 15, "amount": 10})
    dlq.approve_replay(letter, people.approver, "go")
    [job] = dlq.redrive()
    key = IdempotencyKey.objects.get(key="charge:order:15")
    assert (key.scope, key.job_id, key.status) == ("tests.testapp.tasks_dlq.charge", job.pk, "in_progress")
    # The fingerprint of the call the replay runs: a producer sending it gets the replay job back.
    assert key.fingerprint == idempotency.fingerprint(tasks_dlq.charge, [], {"order_id": 15, "amount": 10})
    again = tasks_dlq.charge.using(idempotency_key="charge:order:15").enqueue(order_id=15, amount=10)
    assert again.pk == job.pk


def test_a_corrected_replay_takes_its_key_over_so_the_original_arguments_conflict_instead_of_returning_it(
    people,
):
    letter = dead_charge(order_id=4, key="charge:order:4")
    dlq.request_replay(letter, people.requester, "it was order 1", kwargs={"order_id": 1, "amount": 700})
    dlq.approve_replay(letter, people.approver, "ok")
    [job] = dlq.redrive()
    key = IdempotencyKey.objects.get(key="charge:order:4")
    assert key.fingerprint == idempotency.fingerprint(tasks_dlq.charge, [], {"order_id": 1, "amount": 700})
    run_burst()
    key.refresh_from_db()
    assert (key.status, key.job_id, key.result) == ("succeeded", job.pk, 700)
    jobs_before = Job.objects.count()
    # The original action is not silently answered with the corrected job: the producer is told.
    with pytest.raises(IdempotencyConflict) as refused:
        tasks_dlq.charge.using(idempotency_key="charge:order:4").enqueue(order_id=4, amount=0)
    assert "charge:order:4" in str(refused.value) and "different arguments" in str(refused.value)
    assert Job.objects.count() == jobs_before
    # The corrected call is the key's action now: sending it again is a duplicate.
    again = tasks_dlq.charge.using(idempotency_key="charge:order:4").enqueue(order_id=1, amount=700)
    assert again.pk == job.pk
    assert LedgerEntry.objects.get(effect_key="charge:1").job_id == job.pk
    assert not LedgerEntry.objects.filter(effect_key="charge:4").exists()


def test_a_replay_without_correction_keeps_answering_the_original_arguments_as_a_duplicate(people):
    letter = dead_charge(order_id=16, key="charge:order:16")
    dlq.request_replay(letter, people.requester, "transient outage, replay as is")
    dlq.approve_replay(letter, people.approver, "ok")
    [job] = dlq.redrive()
    again = tasks_dlq.charge.using(idempotency_key="charge:order:16").enqueue(order_id=16, amount=0)
    assert again.pk == job.pk


def test_the_review_of_a_correction_names_the_changed_arguments_and_warns_about_key_and_lock(people):
    letter = dead_charge(order_id=4, key="charge:order:4")
    review = dlq.review_correction(letter, kwargs={"order_id": 1, "amount": 700})
    assert review.corrected and review.key_affected
    assert [(c.name, c.original, c.corrected) for c in review.changes] == [
        ("order_id", 4, 1),
        ("amount", 0, 700),
    ]
    assert review.changed_fields == ["order_id", "amount"]
    [key_warning] = review.warnings  # charge has no lock template
    assert "changes order_id, amount" in key_warning
    # The key is made of arguments: approvers without view_payload read the warning too.
    assert "charge:order:4" not in key_warning and "raises IdempotencyConflict" in key_warning
    # Warnings name arguments, never values: users without view_payload see them too.
    assert "700" not in key_warning
    # Nothing stored yet: the review of the dead letter itself finds no correction.
    assert not dlq.review_correction(letter).corrected
    dlq.request_replay(letter, people.requester, "fix", args=[], kwargs={"amount": 700, "order_id": 4})
    letter.refresh_from_db()
    stored = dlq.review_correction(letter)
    assert [(c.name, c.original, c.corrected) for c in stored.changes] == [("amount", 0, 700)]


def test_the_review_warns_when_a_correction_moves_the_lock_to_another_resource():
    job = tasks_dlq.ship.enqueue(order_id=5)
    run_burst()
    letter = DeadLetter.objects.get(job=job)
    review = dlq.review_correction(letter, kwargs={"order_id": 6})
    assert review.lock_fields == ("order_id",)
    assert (review.original_lock_key, review.corrected_lock_key) == ("order:5", "order:6")
    assert review.key_affected is False  # no idempotency key on this job
    [lock_warning] = review.warnings
    assert "from which the lock key derives (lock template 'order:{order_id}')" in lock_warning
    # Passing an argument by position instead of by name is no change.
    assert not dlq.review_correction(letter, args=[5], kwargs={}).corrected


def test_the_review_refuses_a_payload_that_does_not_fit_the_handler():
    letter = dead_charge(order_id=4, key="charge:order:4")
    with pytest.raises(InvalidArgumentsError) as refused:
        dlq.review_correction(letter, kwargs={"order": 1})
    assert "unexpected keyword argument 'order'; missing required arguments: 'order_id'" in str(refused.value)


def test_dead_lettering_without_a_task_marks_the_key_failed_in_the_tasks_own_scope():
    job = tasks_dlq.scoped_refund.using(idempotency_key="refund:1").enqueue(order_id=1)
    assert IdempotencyKey.objects.get(key="refund:1").scope == "payments"
    [claimed] = store.claim("default", None, 1, "reaper-test")
    # What the reaper does for an expired lease: it has no task object, only the job id.
    dlq.dead_letter(
        "default",
        claimed.id,
        claimed.lease_token,
        reason="lease_expired",
        category="transient",
        error_class="X",
    )
    key = IdempotencyKey.objects.get(key="refund:1")
    assert (key.status, key.job_id) == ("failed", job.pk)


def approve_many(people, count, first_order=100):
    letters = [dead_charge(order_id=first_order + i) for i in range(count)]
    for letter in letters:
        dlq.request_replay(letter, people.requester, "mass replay after the outage")
        dlq.approve_replay(letter, people.approver, "ok")
    return letters


def age_replays(seconds):
    """Move every replay's ``replayed_at`` back in time, as if the windows had passed."""
    import datetime

    DeadLetter.objects.filter(replay_state="replayed").update(
        replayed_at=F("replayed_at") - datetime.timedelta(seconds=seconds)
    )


def test_the_throttle_allows_a_sixth_of_the_rate_per_ten_seconds_and_the_rate_per_minute(people, settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "REPLAY": {"RATE_PER_MINUTE": 7}}
    approve_many(people, 10)
    assert len(dlq.redrive()) == 2  # ceil(7 / 6) in any 10 s
    assert dlq.redrive() == []
    made = [2]
    for _ in range(4):
        age_replays(10.5)  # out of the 10 s window, still inside the minute
        made.append(len(dlq.redrive()))
    # 2 + 2 + 2 + 1 = 7 in the minute, then nothing although the 10 s window is clear.
    assert made == [2, 2, 2, 1, 0]
    age_replays(60)
    assert len(dlq.redrive()) == 2
    assert dlq.redrive(batch_size=5) == []  # a batch size never raises the budget
    assert DeadLetter.objects.filter(replay_state="replayed").count() == len(replay_jobs()) == 9


def test_redrive_takes_the_oldest_approvals_first_and_honours_a_batch_size(people):
    letters = approve_many(people, 3)
    [job] = dlq.redrive(batch_size=1)
    assert job.replayed_from == letters[0]


def test_redrive_still_takes_the_deprecated_limit_keyword_with_a_warning(people):
    letters = approve_many(people, 3)
    deprecated = r"dlq\.redrive\(limit=\.\.\.\) is deprecated: pass batch_size"
    with pytest.warns(DeprecationWarning, match=deprecated) as record:
        [job] = dlq.redrive(limit=1)
    assert job.replayed_from == letters[0]
    assert record[0].filename == __file__  # the warning names the caller's line
    with pytest.raises(TypeError, match="batch_size or its deprecated name limit"):
        dlq.redrive(batch_size=1, limit=1)
    assert DeadLetter.objects.filter(replay_state="replayed").count() == 1


def test_error_text_that_echoes_a_big_payload_is_capped_everywhere_it_is_stored():
    limit = 8192
    job = tasks.echoes_payload.enqueue("B" * 240_000)
    run_burst()
    job.refresh_from_db()
    assert job.status == "dead"
    assert len(job.last_error) <= limit + 100  # the error class name is put before it
    for entry in job.attempt_history:
        assert len(entry["error"]) <= limit and len(entry["traceback"]) <= limit
        assert "characters cut" in entry["error"]
    letter = DeadLetter.objects.get(job=job)
    assert len(letter.error_message) <= limit and len(letter.traceback) <= limit
    # The head says what failed, the tail keeps the traceback's last line.
    assert letter.error_message.startswith("could not parse BBB") and letter.error_message.endswith("BBB")
    assert letter.traceback.startswith("Traceback") and letter.traceback.rstrip().endswith("BBB")


def test_an_approval_is_bound_to_the_correction_the_approver_reviewed(people):
    from django_jobguard.exceptions import ReplayConflict

    letter = dead_charge(order_id=3, amount=0)
    dlq.request_replay(letter, people.requester, "fix", kwargs={"order_id": 3, "amount": 100})
    reviewed = dlq.correction_digest(DeadLetter.objects.get(pk=letter.pk))
    # The payload changes after the approver looked at it (by the requester, or by hand).
    DeadLetter.objects.filter(pk=letter.pk).update(replay_kwargs={"order_id": 3, "amount": 100_000})
    with pytest.raises(ReplayConflict, match="changed since you reviewed it"):
        dlq.approve_replay(letter.pk, people.approver, "looks right", reviewed=reviewed)
    assert DeadLetter.objects.get(pk=letter.pk).replay_state == "requested"
    now = dlq.correction_digest(DeadLetter.objects.get(pk=letter.pk))
    approved = dlq.approve_replay(letter.pk, people.approver, "checked again", reviewed=now)
    assert approved.replay_state == "approved"
    event = ReplayEvent.objects.filter(dead_letter_id=letter.pk, action="approved").get()
    assert event.data["correction_digest"] == now != reviewed


def test_a_replay_reason_is_capped_and_a_longer_one_changes_nothing(people):
    letter = dead_charge(order_id=77, amount=0)
    with pytest.raises(ReplayError, match="at most 10000 characters, not 10001"):
        dlq.request_replay(letter, people.requester, "x" * 10_001)
    letter.refresh_from_db()
    assert letter.replay_state == "none"
    dlq.request_replay(letter, people.requester, "y" * 10_000)
    letter.refresh_from_db()
    assert letter.replay_state == "requested"


def test_approving_a_corrected_payload_needs_the_view_payload_permission_whoever_calls(people):
    blind_approver = make_user("abe", "approve_replay", "view_deadletter")
    reader = make_user("rhea", "approve_replay", "view_deadletter", "view_payload")
    corrected, original = dead_charge(order_id=40, amount=0), dead_charge(order_id=41, amount=0)
    dlq.request_replay(corrected, people.requester, "fix", kwargs={"order_id": 40, "amount": 777})
    dlq.request_replay(original, people.requester, "retry")
    before = snapshot(corrected)
    with pytest.raises(
        ReplayPermissionDenied, match=rf"#{corrected.pk} replays a corrected payload.*view_payload"
    ):
        dlq.approve_replay(corrected.pk, blind_approver, "looks fine")
    assert snapshot(corrected) == before
    # The surfaces ask the same rule which steps to offer: reject, not approve.
    assert dlq.available_actions(corrected, blind_approver) == ["reject"]
    assert "jobguard.view_payload" in (dlq.refusal_reason(corrected, blind_approver, "approve") or "")
    # The original payload needs no payload permission to approve; the correction needs a reader.
    assert dlq.approve_replay(original.pk, blind_approver, "retry it").replay_state == "approved"
    assert dlq.approve_replay(corrected.pk, reader, "checked the amount").replay_state == "approved"


def test_an_approval_that_must_be_reviewed_is_refused_without_the_digest_of_a_correction(people):
    from django_jobguard.exceptions import ReplayReviewRequired

    reader = make_user("rhea", "approve_replay", "view_deadletter", "view_payload")
    corrected, original = dead_charge(order_id=42, amount=0), dead_charge(order_id=43, amount=0)
    dlq.request_replay(corrected, people.requester, "fix", kwargs={"order_id": 42, "amount": 5})
    dlq.request_replay(original, people.requester, "retry")
    before = snapshot(corrected)
    with pytest.raises(ReplayReviewRequired, match="correction_digest"):
        dlq.approve_replay(corrected.pk, reader, "ok", require_review=True)
    assert snapshot(corrected) == before
    # An original payload cannot change under the approver: it needs no digest.
    assert dlq.approve_replay(original.pk, reader, "ok", require_review=True).replay_state == "approved"
    digest = dlq.correction_digest(DeadLetter.objects.get(pk=corrected.pk))
    assert dlq.approve_replay(
        corrected.pk, reader, "ok", reviewed=digest, require_review=True
    ).replay_state == ("approved")


def test_the_correction_digest_is_keyed_so_a_guessable_correction_is_not_recovered_from_it(people, settings):
    import hashlib
    import json

    letter = dead_charge(order_id=44, amount=0)
    dlq.request_replay(letter, people.requester, "cvv", kwargs={"order_id": 44, "amount": 777})
    letter = DeadLetter.objects.get(pk=letter.pk)
    digest = dlq.correction_digest(letter)
    assert len(digest) == 32 and int(digest, 16) >= 0

    # The attack that recovered a correction from the unsalted digest: hash every candidate.
    def plain(amount: int, **extra) -> str:
        payload = {**extra, "args": [], "kwargs": {"amount": amount, "order_id": 44}}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    guesses = {plain(n)[:16] for n in range(1000)} | {plain(n, dead_letter=letter.pk) for n in range(1000)}
    assert not any(digest.startswith(guess[:16]) or guess.startswith(digest) for guess in guesses)
    assert plain(777)[:16] != digest[:16]

    # Keyed with SECRET_KEY: another key gives another digest; a former key in
    # SECRET_KEY_FALLBACKS still matches what was shown before a rotation.
    old_key = settings.SECRET_KEY
    settings.SECRET_KEY = f"{old_key}, rotated"
    assert dlq.correction_digest(letter) != digest
    assert not dlq.corrections.digest_matches(letter, digest)
    settings.SECRET_KEY_FALLBACKS = [old_key]
    assert dlq.corrections.digest_matches(letter, digest)

    # The same correction on another dead letter has another digest: digests cannot be compared.
    twin = dead_charge(order_id=45, amount=0)
    DeadLetter.objects.filter(pk=twin.pk).update(
        replay_args=[], replay_kwargs={"order_id": 44, "amount": 777}
    )
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = old_key, []
    assert dlq.correction_digest(DeadLetter.objects.get(pk=twin.pk)) != digest
    # A digest that is not even ASCII is a mismatch, not a crash.
    assert not dlq.corrections.digest_matches(letter, "é" * 32)


def test_an_approval_recorded_with_the_former_plain_digest_hides_it_from_who_may_not_see_payloads():
    legacy = {"payload_corrected": True, "correction_digest": "3f9c0e1a2b4d6f80"}
    keyed = {"payload_corrected": True, "correction_digest": "0" * 32}
    assert dlq.visible_event_data(legacy, show_payload=False) == {"payload_corrected": True}
    assert dlq.visible_event_data(legacy, show_payload=True) == legacy
    assert dlq.visible_event_data(keyed, show_payload=False) == keyed
    assert dlq.visible_event_data({"args": [1], "kwargs": {}}, show_payload=False) == {}
