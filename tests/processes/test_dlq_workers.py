"""Retries, dead letters and approved replays with real ``jobguard_worker`` processes."""

import threading
from collections import Counter

import pytest
from django.db import connections
from django.urls import reverse

from django_jobguard import dlq
from django_jobguard.exceptions import IdempotencyConflict, ReplayError
from django_jobguard.models import DeadLetter, IdempotencyKey, Job, ReplayEvent
from tests.conftest import wait_for
from tests.support.dlq import replay_jobs
from tests.support.factories import make_user
from tests.testapp import tasks, tasks_dlq
from tests.testapp.models import Execution, Interval, LedgerEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def status_of(job):
    job.refresh_from_db()
    return job.status


def dead_letter_of(job, workers, timeout=60):
    wait_for(lambda: DeadLetter.objects.filter(job=job).exists(), timeout, message=f"job {job.pk} to die")
    return DeadLetter.objects.get(job=job)


def test_transient_failures_are_retried_with_growing_delays_then_succeed(workers):
    job = tasks_dlq.spaced.enqueue("grow", failures=3)
    workers.start("--worker-id", "retrier")
    wait_for(lambda: status_of(job) == "succeeded", timeout=90, message="the fourth attempt to succeed")
    assert (job.attempts, job.result) == (4, 4)
    attempts = list(Interval.objects.filter(resource="grow").order_by("fencing_token"))
    assert [a.fencing_token for a in attempts] == [1, 2, 3, 4]
    # Delay after failed attempt n: its retry's run_after minus when attempt n began.
    delays = [attempts[n + 1].ended - attempts[n].started for n in range(3)]
    for delay, base in zip(delays, (1.0, 2.0, 4.0), strict=True):
        # The task's schedule: base 1 s doubling, 0.1 s of jitter, plus the attempt's own run
        # time (milliseconds; the slack is for a loaded machine).
        assert base <= delay < base + 0.1 + 1.5, delays
    assert delays[0] < delays[1] < delays[2]
    # No attempt started before its run_after: the worker waited on the database, not in a sleep.
    for attempt in attempts[1:]:
        assert attempt.started >= attempt.ended - 0.01


def test_a_retry_waiting_for_its_delay_does_not_hold_the_worker(workers):
    waiting = tasks_dlq.rate_limited.enqueue("429", retry_after=120)
    workers.start("--concurrency", "1")
    wait_for(
        lambda: Job.objects.filter(pk=waiting.pk, status="queued", attempts=1).exists(),
        message="the rate-limited job to be put back",
    )
    quick = tasks.add.enqueue(2, b=3)
    wait_for(lambda: status_of(quick) == "succeeded", timeout=30, message="the next job to run meanwhile")
    waiting.refresh_from_db()
    assert (waiting.status, waiting.attempts, waiting.lease_token) == ("queued", 1, None)
    assert (waiting.run_after - quick.finished_at).total_seconds() > 100


def test_permanent_failures_go_straight_to_the_dead_letter_queue_with_their_traceback(workers):
    bad_amount = tasks_dlq.charge.enqueue(order_id=1, amount=0)
    declined = tasks_dlq.charge.enqueue(order_id=2, amount=402)
    workers.start("--worker-id", "payments-1")
    letter = dead_letter_of(bad_amount, workers)
    assert (letter.reason, letter.category, letter.attempts, letter.max_attempts) == (
        "permanent_error",
        "permanent",
        1,
        3,
    )
    assert letter.error_class == "django_jobguard.exceptions.PermanentError"
    assert letter.error_message == "order 1: amount 0 is not a positive number of cents"
    assert "Traceback (most recent call last)" in letter.traceback
    assert 'raise PermanentError(f"order {order_id}: amount' in letter.traceback
    assert (letter.worker_id, letter.kwargs, letter.first_failed_at) == (
        "payments-1",
        {"order_id": 1, "amount": 0},
        letter.last_failed_at,
    )
    # fatal_on=(CardDeclined,) wins over retry_on=(ValueError,), CardDeclined's base class.
    letter = dead_letter_of(declined, workers)
    assert (letter.error_class, letter.attempts) == ("tests.testapp.tasks_dlq.CardDeclined", 1)
    assert Job.objects.filter(pk__in=[bad_amount.pk, declined.pk], status="dead", attempts=1).count() == 2
    # The task is atomic: the failed attempts' own writes rolled back with them.
    assert not Execution.objects.filter(marker__in=["charge:1", "charge:2"]).exists()


def test_exhausted_retries_land_in_the_dead_letter_queue_exactly_once(workers):
    jobs = tasks_dlq.always_transient.bulk_enqueue([((f"ex-{i}",), {}) for i in range(30)])
    for _ in range(3):
        workers.start("--concurrency", "2")
    wait_for(
        lambda: Job.objects.filter(status="dead").count() == 30, timeout=120, message="all 30 jobs to be dead"
    )
    letters = DeadLetter.objects.all()
    assert letters.count() == 30
    assert Counter(letters.values_list("job_id", flat=True)) == Counter(job.pk for job in jobs)
    assert set(letters.values_list("reason", "category", "attempts")) == {
        ("retries_exhausted", "transient", 3)
    }
    assert set(Counter(Execution.objects.values_list("marker", flat=True)).values()) == {3}
    assert all("still failing on attempt 3" in letter.error_message for letter in letters)
    assert all(letter.first_failed_at < letter.last_failed_at for letter in letters)


def people():
    return (
        make_user("rita", "request_replay", "view_payload", "view_deadletter"),
        make_user("amir", "approve_replay", "view_deadletter"),
        make_user("olga", "view_deadletter", "view_payload"),
    )


def replay_url(letter, action):
    return reverse("admin:jobguard_deadletter_replay", args=[letter.pk, action])


def test_a_replay_approved_in_the_admin_is_redriven_by_a_worker_and_succeeds(workers, client):
    requester, approver, _ = people()
    job = tasks_dlq.charge.using(idempotency_key="charge:order:7").enqueue(order_id=7, amount=-5)
    workers.start()
    letter = dead_letter_of(job, workers)

    client.force_login(requester)
    corrected = {
        "reason": "sign flipped by the importer",
        "args": "[]",
        "kwargs": '{"order_id": 7, "amount": 500}',
    }
    # The correction changes what the key's fingerprint covers: shown with its warning first.
    response = client.post(replay_url(letter, "request"), corrected)
    assert response.status_code == 200
    assert "raises IdempotencyConflict" in response.content.decode()
    confirmed = {**corrected, "confirm_correction": response.context["confirm_correction"]}
    assert client.post(replay_url(letter, "request"), confirmed).status_code == 302
    # Approving a correction needs view_payload, and binds the approval to the correction shown.
    client.force_login(approver)
    assert client.post(replay_url(letter, "approve"), {"reason": "ticket OPS-12"}).status_code == 403
    reviewer = make_user("vera", "approve_replay", "view_deadletter", "view_payload")
    client.force_login(reviewer)
    shown = client.get(replay_url(letter, "approve")).context["correction_digest"]
    approved = {"reason": "ticket OPS-12", "correction_digest": shown}
    assert client.post(replay_url(letter, "approve"), approved).status_code == 302

    wait_for(lambda: DeadLetter.objects.get(pk=letter.pk).replay_state == "replayed", message="the redrive")
    letter.refresh_from_db()
    replay = letter.replay_job
    wait_for(lambda: status_of(replay) == "succeeded", message="the replay job to succeed")
    assert (replay.kwargs, replay.idempotency_key, replay.result) == (
        {"order_id": 7, "amount": 500},
        "charge:order:7",
        500,
    )
    assert LedgerEntry.objects.get(effect_key="charge:7").job_id == replay.pk
    key = IdempotencyKey.objects.get(key="charge:order:7")
    assert (key.status, key.job_id) == ("succeeded", replay.pk)
    assert [e.action for e in ReplayEvent.objects.filter(dead_letter=letter)] == [
        "requested",
        "approved",
        "replayed",
    ]
    # The key stands for the corrected call now: sending it again gets the replay's job, not a
    # new charge, and the original arguments are refused rather than answered with that job.
    again = tasks_dlq.charge.using(idempotency_key="charge:order:7").enqueue(order_id=7, amount=500)
    assert again.pk == replay.pk
    with pytest.raises(IdempotencyConflict, match=r"'charge:order:7'.*different arguments"):
        tasks_dlq.charge.using(idempotency_key="charge:order:7").enqueue(order_id=7, amount=-5)


def test_a_user_without_permission_gets_403_and_no_worker_replays_anything(workers, client):
    requester, _, outsider = people()
    job = tasks_dlq.charge.enqueue(order_id=8, amount=0)
    workers.start()
    letter = dead_letter_of(job, workers)
    dlq.request_replay(letter, requester, "please")

    client.force_login(outsider)
    assert client.post(replay_url(letter, "approve"), {"reason": "I say so"}).status_code == 403
    client.force_login(requester)  # may request, may not approve (and not her own request)
    assert client.post(replay_url(letter, "approve"), {"reason": "mine"}).status_code == 403

    # The worker is alive and working; the refused approvals left nothing for it to redrive.
    marker = tasks.add.enqueue(1)
    wait_for(lambda: status_of(marker) == "succeeded", message="the worker to keep working")
    letter.refresh_from_db()
    assert (letter.replay_state, letter.replay_decided_by, letter.replay_job) == ("requested", None, None)
    assert replay_jobs() == []
    assert [e.action for e in ReplayEvent.objects.filter(dead_letter=letter)] == ["requested"]


def test_two_concurrent_approvals_produce_one_replay(workers):
    requester, _, _ = people()
    # The replay carries a correction: its approvers need view_payload.
    approver = make_user("vera", "approve_replay", "view_deadletter", "view_payload")
    second_approver = make_user("ada", "approve_replay", "view_deadletter", "view_payload")
    job = tasks_dlq.charge.using(idempotency_key="charge:order:9").enqueue(order_id=9, amount=0)
    workers.burst()
    letter = DeadLetter.objects.get(job=job)
    dlq.request_replay(letter, requester, "retry", kwargs={"order_id": 9, "amount": 90})
    for _ in range(2):
        workers.start()

    barrier = threading.Barrier(2)
    outcomes = []

    def approve(user):
        try:
            barrier.wait(timeout=30)
            dlq.approve_replay(letter.pk, user, f"approved by {user.username}")
            outcomes.append("approved")
        except ReplayError as exc:
            outcomes.append(str(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=approve, args=(user,)) for user in (approver, second_approver)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 2 and outcomes.count("approved") == 1, outcomes
    [refusal] = [outcome for outcome in outcomes if outcome != "approved"]
    assert "its replay is approved" in refusal

    wait_for(lambda: LedgerEntry.objects.filter(effect_key="charge:9").exists(), message="the replay to run")
    [replay] = replay_jobs()
    wait_for(lambda: status_of(replay) == "succeeded", message="the replay job to be acked")
    # One run of the handler committed: the replay's (the failed attempt rolled back, it is atomic).
    assert list(Execution.objects.filter(marker="charge:9").values_list("job_id", flat=True)) == [replay.pk]
    assert ReplayEvent.objects.filter(dead_letter=letter, action="replayed").count() == 1


@pytest.mark.slow
def test_the_replay_rate_holds_across_several_workers(workers):
    # The test settings keep the default 60 a minute: at most 10 in any 10 s window.
    requester, approver, _ = people()
    jobs = tasks_dlq.charge.bulk_enqueue([((), {"order_id": 100 + i, "amount": 0}) for i in range(24)])
    workers.burst()
    assert DeadLetter.objects.count() == len(jobs)
    for letter in DeadLetter.objects.all():
        dlq.request_replay(letter, requester, "mass replay")
        dlq.approve_replay(letter, approver, "ok")
    for index in range(3):
        workers.start("--worker-id", f"w{index}")
    wait_for(
        lambda: DeadLetter.objects.filter(replay_state="replayed").count() >= 11,
        timeout=90,
        message="a second throttle window to open",
    )
    times = sorted(
        letter.replayed_at.timestamp()
        for letter in DeadLetter.objects.filter(replay_state="replayed", replayed_at__isnull=False)
    )
    busiest = max(sum(1 for t in times if start <= t < start + 10) for start in times)
    assert busiest <= 10, times
    redrivers = set(
        ReplayEvent.objects.filter(action="replayed").values_list("data__worker_id", flat=True).distinct()
    )
    assert redrivers <= {"w0", "w1", "w2"}
