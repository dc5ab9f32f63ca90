"""Retention of finished jobs: what the defaults and each queue's retention delete, what they keep
whatever its age, in batches that go on where they stopped, and the elected worker's pass."""

import datetime
import logging
import re

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import REGISTRY

from django_jobguard import events
from django_jobguard.conf import get_settings
from django_jobguard.maintenance import JobPruner, Maintenance, retention
from django_jobguard.models import (
    DeadLetter,
    IdempotencyKey,
    Job,
    Lock,
    ReplayState,
    Schedule,
    Workflow,
    WorkflowState,
)
from tests.support.factories import make_dead_letter, make_job

pytestmark = pytest.mark.django_db(transaction=True)

DAY = datetime.timedelta(days=1)
HOUR = datetime.timedelta(hours=1)
MINUTE = datetime.timedelta(minutes=1)


def finished(status, ago, **fields):
    """A job that finished as ``status`` ``ago`` (a timedelta) before now."""
    return make_job(status, finished_at=timezone.now() - ago, **fields)


def remaining(*jobs):
    """Which of ``jobs`` are still stored, by pk."""
    return set(Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("pk", flat=True))


def retention_settings(**groups):
    return override_settings(JOBGUARD={**settings.JOBGUARD, **groups})


def test_the_default_retention_deletes_by_status_and_age():
    gone = [
        finished("succeeded", DAY + HOUR),
        finished("cancelled", 7 * DAY + HOUR),
        finished("dead", 7 * DAY + HOUR),  # no dead letter (deleted by hand): its age decides
    ]
    kept = [
        finished("succeeded", DAY - HOUR),
        finished("cancelled", 6 * DAY),
        finished("dead", 6 * DAY),
        make_job("due"),
        make_job("running"),
        make_job("scheduled"),
    ]

    result = retention.prune_retained_jobs()

    assert result.deleted == {"succeeded": 1, "cancelled": 1, "dead": 1}
    assert remaining(*gone) == set()
    assert remaining(*kept) == {job.pk for job in kept}


def test_a_job_stays_whatever_its_age_while_a_key_a_dead_letter_or_a_workflow_needs_it():
    old = 30 * DAY
    live_key = finished("succeeded", old)
    IdempotencyKey.objects.create(
        key="live", scope="t", fingerprint="f", job=live_key, expires_at=timezone.now() + HOUR
    )
    expired_key = finished("succeeded", old)
    expired = IdempotencyKey.objects.create(
        key="expired", scope="t", fingerprint="f", job=expired_key, expires_at=timezone.now() - HOUR
    )
    unresolved = finished("dead", old)
    make_dead_letter(unresolved, replay_state=ReplayState.REQUESTED)
    rejected = finished("dead", old)
    make_dead_letter(rejected, replay_state=ReplayState.REJECTED)  # may be requested again
    replayed = finished("dead", old)
    replay = finished("succeeded", old)
    replayed_letter = make_dead_letter(replayed, replay_state=ReplayState.REPLAYED, replay_job=replay)
    open_workflow = Workflow.objects.create(kind="batch", state=WorkflowState.CLOSED)
    member = finished("cancelled", old, workflow_id=open_workflow.pk)
    done_workflow = Workflow.objects.create(kind="batch", state=WorkflowState.FINISHED)
    done_member = finished("succeeded", old, workflow_id=done_workflow.pk)
    scheduled = finished("succeeded", old)
    schedule = Schedule.objects.create(name="nightly", task_name="t", cron="0 2 * * *", last_job=scheduled)

    assert retention.prune_retained_jobs(dry_run=True).total == 4
    assert Job.objects.count() == 9
    result = retention.prune_retained_jobs(batch_size=2)

    assert result.total == 4
    assert remaining(expired_key, replayed, done_member, scheduled) == set()
    assert remaining(live_key, unresolved, rejected, replay, member) == {
        live_key.pk,
        unresolved.pk,
        rejected.pk,
        replay.pk,
        member.pk,
    }
    # The rows that pointed at the deleted jobs stay, pointing at nothing.
    expired.refresh_from_db()
    replayed_letter.refresh_from_db()
    schedule.refresh_from_db()
    assert (expired.job_id, replayed_letter.job_id, schedule.last_job_id) == (None, None, None)
    assert replayed_letter.replay_job_id == replay.pk

    # The workflow finishes: its members go at the next pass.
    Workflow.objects.filter(pk=open_workflow.pk).update(state=WorkflowState.FINISHED)
    assert retention.prune_retained_jobs().deleted == {"succeeded": 0, "cancelled": 1, "dead": 0}
    assert DeadLetter.objects.count() == 3  # dead letters are never pruned


def test_a_queue_retention_overrides_the_global_one_key_by_key():
    groups = {
        "RETENTION": {"SUCCEEDED": 3600},
        "QUEUES": {
            **settings.JOBGUARD["QUEUES"],
            "emails": {"retention": {"succeeded": 60}},
            "payments": {"retention": {"succeeded": None, "dead": 60}},
        },
    }
    with retention_settings(**groups):
        emails_old = finished("succeeded", 2 * MINUTE, queue_name="emails")
        emails_cancelled = finished("cancelled", 2 * DAY, queue_name="emails")  # RETENTION's 7 days
        payments_old = finished("succeeded", 30 * DAY, queue_name="payments")  # kept for ever
        payments_dead = finished("dead", 2 * MINUTE, queue_name="payments")
        other_recent = finished("succeeded", 30 * MINUTE, queue_name="reports")
        other_old = finished("succeeded", 2 * HOUR, queue_name="reports")

        scopes = retention.retention_scopes(get_settings())
        result = retention.prune_retained_jobs()

    assert result.deleted == {"succeeded": 2, "cancelled": 0, "dead": 1}
    assert remaining(emails_old, payments_dead, other_old) == set()
    assert remaining(emails_cancelled, payments_old, other_recent) == {
        emails_cancelled.pk,
        payments_old.pk,
        other_recent.pk,
    }
    # One scope per status and retention: the global ones leave out the queues that differ.
    assert retention.RetentionScope("succeeded", 3600.0, ("emails", "payments")) in scopes
    assert retention.RetentionScope("succeeded", 60.0, ("emails",), others=False) in scopes
    assert retention.RetentionScope("dead", 60.0, ("payments",), others=False) in scopes
    assert not any(s.status == "succeeded" and not s.others and "payments" in s.queues for s in scopes)


def test_retention_none_everywhere_deletes_nothing_as_before():
    old = finished("succeeded", 365 * DAY)
    with retention_settings(RETENTION={"SUCCEEDED": None, "CANCELLED": None, "DEAD": None}):
        assert retention.prune_retained_jobs().total == 0
        assert retention.prune().jobs == 0
    assert remaining(old) == {old.pk}


def test_a_pass_deletes_a_batch_per_transaction_and_goes_on_where_it_was_stopped():
    jobs = sorted((finished("succeeded", 2 * DAY) for _ in range(7)), key=lambda j: (j.finished_at, j.pk))
    cursors = {}
    asked = []

    def stop_after_one_batch():
        asked.append(1)
        return len(asked) > 1

    stopped = retention.prune_retained_jobs(batch_size=3, cursors=cursors, stop=stop_after_one_batch)
    assert (stopped.total, stopped.batches, stopped.more) == (3, 1, True)
    assert list(cursors.values()) == [(jobs[2].finished_at, jobs[2].pk)]

    with CaptureQueriesContext(connection) as queries:
        result = retention.prune_retained_jobs(batch_size=3, cursors=cursors)
    deletes = [
        q["sql"] for q in queries.captured_queries if re.match(r"DELETE FROM .?jobguard_job\W", q["sql"])
    ]
    assert (result.total, result.batches, result.more, len(deletes)) == (4, 2, False, 2)
    assert remaining(*jobs) == set()
    assert cursors == {}, "a sweep that reached its end starts from the oldest job next time"

    assert retention.prune_retained_jobs(deadline=0.0).more is True


def test_the_sweep_steps_over_the_jobs_it_keeps():
    kept = [finished("dead", 30 * DAY) for _ in range(5)]
    for job in kept:
        make_dead_letter(job)  # not replayed: kept
    gone = finished("dead", 8 * DAY)  # after the kept ones in finished_at order
    cursors = {}
    result = retention.prune_retained_jobs(batch_size=2, cursors=cursors)
    assert result.deleted["dead"] == 1
    assert remaining(gone) == set() and len(remaining(*kept)) == 5


def test_the_pruner_reports_each_pass_in_a_log_line_an_event_and_the_metric(caplog):
    finished("succeeded", 2 * DAY)
    finished("cancelled", 8 * DAY)
    seen = []
    events.add_sink(seen.append)
    before = REGISTRY.get_sample_value("jobguard_jobs_pruned_total", {"status": "succeeded"}) or 0.0
    try:
        with caplog.at_level(logging.INFO, logger="django_jobguard.worker"):
            result = JobPruner("default", "w-prune").run_once()
    finally:
        events.remove_sink(seen.append)
    assert result.total == 2
    assert [e for e in seen if isinstance(e, events.JobsPruned)] == [
        events.JobsPruned("succeeded", 1),
        events.JobsPruned("cancelled", 1),
    ]
    assert REGISTRY.get_sample_value("jobguard_jobs_pruned_total", {"status": "succeeded"}) == before + 1
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("jobs_pruned")]
    assert line.startswith("jobs_pruned worker_id=w-prune succeeded=1 cancelled=1 dead=0 batches=2 seconds=")
    assert line.endswith("more=False")


def test_one_worker_is_elected_to_prune_through_its_lease_row():
    first, second = JobPruner("default", "w-1"), JobPruner("default", "w-2")
    assert first.elected() is True
    assert second.elected() is False
    assert Lock.objects.filter(key="jobguard:leader:retention").count() == 1
    assert first.elected() is True, "the leader renews its row"
    first._lease.resign()
    assert second.elected() is True


def test_with_a_maintenance_leader_the_pruner_follows_it():
    leading = [False]
    pruner = JobPruner("default", "w-1", leading=lambda: leading[0])
    assert pruner.elected() is False
    leading[0] = True
    assert pruner.elected() is True
    assert not Lock.objects.filter(key="jobguard:leader:retention").exists()


def test_the_worker_starts_a_pruning_thread_unless_told_not_to():
    spawned = []

    def spawn(target, name):
        spawned.append(name)

    Maintenance("default", "w-1", reaper_interval=1.0).start_pruning(spawn)
    assert spawned == ["jobguard-retention"]
    with retention_settings(RETENTION={"INTERVAL": 0}):
        Maintenance("default", "w-2", reaper_interval=1.0).start_pruning(spawn)
    assert spawned == ["jobguard-retention"]


def test_a_burst_worker_does_not_prune():
    from django_jobguard.worker import Worker

    old = finished("succeeded", 2 * DAY)
    worker = Worker(burst=True, install_signal_handlers=False)
    assert worker.run() == 0
    assert worker.maintenance._pruning is None
    assert remaining(old) == {old.pk}
