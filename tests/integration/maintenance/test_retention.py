"""Pruning expired idempotency keys and old finished jobs: the command, the service, the worker."""

import datetime
import io

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobguard.maintenance import retention
from django_jobguard.maintenance.retention import WORKER_PRUNE_INTERVAL_SECONDS
from django_jobguard.models import DeadLetter, IdempotencyKey, Job
from django_jobguard.worker import Worker
from tests.support.factories import make_dead_letter
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

PAST = datetime.timedelta(days=-1)


def keyed(key, *, job_status="succeeded", expires_in=PAST, finished_ago=None):
    """A keyed job in ``job_status`` whose key expires ``expires_in`` from now."""
    job = tasks.add.using(idempotency_key=key).enqueue(1)
    changes = {"status": job_status}
    if job_status == "running":
        changes.update(lease_token="t" * 32, lease_expires_at=timezone.now() + datetime.timedelta(minutes=5))
    if job_status in ("succeeded", "dead", "cancelled"):
        changes["finished_at"] = timezone.now() - (finished_ago or datetime.timedelta(0))
    Job.objects.filter(pk=job.pk).update(**changes)
    IdempotencyKey.objects.filter(key=key).update(expires_at=timezone.now() + expires_in)
    return job


def remaining_keys():
    return set(IdempotencyKey.objects.values_list("key", flat=True))


def test_expired_keys_are_pruned_but_never_one_a_queued_or_running_job_needs():
    keyed("done")
    keyed("queued", job_status="queued")
    keyed("running", job_status="running")
    keyed("live", expires_in=datetime.timedelta(hours=1))
    orphan = keyed("orphan")
    Job.objects.filter(pk=orphan.pk).delete()  # the key's job is gone
    keyed("carried")
    # A queued resend carries the expired key without owning it: it will want the key.
    Job.objects.create(task_name=tasks.add.name, args=[1], idempotency_key="carried")

    assert retention.prune_expired_keys(dry_run=True) == 2
    assert len(remaining_keys()) == 6
    assert retention.prune_expired_keys() == 2
    assert remaining_keys() == {"queued", "running", "live", "carried"}


def test_keys_are_deleted_in_batches():
    for index in range(25):
        keyed(f"k{index}")
    with CaptureQueriesContext(connection) as queries:
        assert retention.prune_expired_keys(batch_size=10, max_batches=1) == 10
        assert retention.prune_expired_keys(batch_size=10) == 15
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3
    assert not IdempotencyKey.objects.exists()


def test_old_finished_jobs_are_pruned_except_those_live_keys_and_dead_letters_refer_to():
    old = datetime.timedelta(days=40)
    plain = tasks.add.enqueue(1)
    Job.objects.filter(pk=plain.pk).update(status="succeeded", finished_at=timezone.now() - old)
    expired_key = keyed("expired", finished_ago=old)
    live_key = keyed("live", finished_ago=old, expires_in=datetime.timedelta(days=1))
    recent = keyed("recent", finished_ago=datetime.timedelta(days=1))
    queued = tasks.add.enqueue(2)
    dead = keyed("dead", job_status="dead", finished_ago=old, expires_in=datetime.timedelta(days=-5))
    replayed = tasks.add.enqueue(3)
    Job.objects.filter(pk=replayed.pk).update(status="succeeded", finished_at=timezone.now() - old)
    make_dead_letter(
        dead, replay_job=replayed, first_failed_at=timezone.now() - old, last_failed_at=timezone.now() - old
    )

    report = retention.prune(jobs_older_than=datetime.timedelta(days=30), dry_run=True)
    assert (report.keys, report.jobs) == (3, 2)  # keys: expired, recent, dead; jobs: plain, expired_key
    assert Job.objects.count() == 7

    report = retention.prune(jobs_older_than=datetime.timedelta(days=30), batch_size=1)
    assert (report.keys, report.jobs, report.dry_run) == (3, 2, False)
    assert set(Job.objects.values_list("pk", flat=True)) == {
        live_key.pk,
        recent.pk,
        queued.pk,
        dead.pk,
        replayed.pk,
    }
    assert not Job.objects.filter(pk__in=[plain.pk, expired_key.pk]).exists()
    assert DeadLetter.objects.get().job_id == dead.pk


def test_jobguard_prune_reports_what_it_deletes_and_a_dry_run_deletes_nothing():
    keyed("a", finished_ago=datetime.timedelta(hours=3))
    keyed("b", expires_in=datetime.timedelta(hours=1), finished_ago=datetime.timedelta(hours=3))
    old = tasks.add.enqueue(1)
    Job.objects.filter(pk=old.pk).update(
        status="succeeded", finished_at=timezone.now() - datetime.timedelta(hours=3)
    )
    out = io.StringIO()
    call_command("jobguard_prune", "--jobs-older-than", "2h", "--dry-run", stdout=out)
    assert out.getvalue().splitlines() == [
        "Would delete 1 expired idempotency key(s).",
        "Would delete 0 idle database lock row(s).",
        "Would delete 2 finished job(s) finished more than 2:00:00 ago (2 succeeded, 0 cancelled, 0 dead).",
    ]
    assert (IdempotencyKey.objects.count(), Job.objects.count()) == (2, 3)

    out = io.StringIO()
    call_command("jobguard_prune", "--jobs-older-than", "2h", "--batch-size", "1", stdout=out)
    assert out.getvalue().splitlines() == [
        "Deleted 1 expired idempotency key(s).",
        "Deleted 0 idle database lock row(s).",
        "Deleted 2 finished job(s) finished more than 2:00:00 ago (2 succeeded, 0 cancelled, 0 dead).",
    ]
    assert remaining_keys() == {"b"}
    assert Job.objects.count() == 1

    # Without an age: the retention's (a day for succeeded jobs), as the workers prune.
    out = io.StringIO()
    call_command("jobguard_prune", stdout=out)
    assert out.getvalue().splitlines() == [
        "Deleted 0 expired idempotency key(s).",
        "Deleted 0 idle database lock row(s).",
        "Deleted 0 finished job(s) past their retention (0 succeeded, 0 cancelled, 0 dead).",
    ]
    out = io.StringIO()
    call_command("jobguard_prune", "--no-jobs", stdout=out)
    assert out.getvalue() == "Deleted 0 expired idempotency key(s).\nDeleted 0 idle database lock row(s).\n"
    assert Job.objects.count() == 1


def test_jobguard_prune_refuses_an_age_it_cannot_read():
    with pytest.raises(
        CommandError, match="argument --jobs-older-than: 'soon' is not a duration: give a number of seconds"
    ):
        call_command("jobguard_prune", "--jobs-older-than", "soon")
    with pytest.raises(CommandError, match="--no-jobs and --jobs-older-than contradict each other"):
        call_command("jobguard_prune", "--no-jobs", "--jobs-older-than", "1d")


def prune_in_worker(enabled):
    return override_settings(JOBGUARD={**settings.JOBGUARD, "IDEMPOTENCY": {"PRUNE_IN_WORKER": enabled}})


def test_the_worker_prunes_expired_keys_only_when_told_to():
    keyed("old")
    with prune_in_worker(False):
        assert Worker(burst=True, install_signal_handlers=False).run() == 0
    assert remaining_keys() == {"old"}
    with prune_in_worker(True):
        assert Worker(burst=True, install_signal_handlers=False).run() == 0
    assert remaining_keys() == set()


def test_the_worker_prunes_at_most_once_per_interval():
    with prune_in_worker(True):
        worker = Worker(install_signal_handlers=False)
        keyed("first")
        worker.maintenance.pruner.tick(1000.0)
        assert remaining_keys() == set()
        keyed("second")
        worker.maintenance.pruner.tick(1000.0 + WORKER_PRUNE_INTERVAL_SECONDS - 1)
        assert remaining_keys() == {"second"}
        worker.maintenance.pruner.tick(1000.0 + WORKER_PRUNE_INTERVAL_SECONDS)
        assert remaining_keys() == set()


def attempts(count, *, traceback="Traceback (most recent call last):\n  ..."):
    return [
        {
            "worker_id": f"w-{n}",
            "started_at": "2026-11-01T00:00:00+00:00",
            "ended_at": "2026-11-01T00:00:01+00:00",
            "error_class": "builtins.ValueError",
            "error": f"failure {n} " + "x" * 2000,
            "traceback": traceback,
        }
        for n in range(count)
    ]


def finished_with_history(count, *, status="dead", finished_ago=datetime.timedelta(days=40)):
    job = tasks.add.enqueue(1)
    changes = {"attempt_history": attempts(count), "attempts": count, "max_attempts": count, "status": status}
    if status in ("succeeded", "dead", "cancelled"):
        changes["finished_at"] = timezone.now() - finished_ago
    if status == "running":
        changes.update(lease_token="t" * 32, lease_expires_at=timezone.now() + datetime.timedelta(minutes=5))
    Job.objects.filter(pk=job.pk).update(**changes)
    return job


def history_of(job):
    return Job.objects.get(pk=job.pk).attempt_history


def test_old_attempt_history_is_trimmed_to_its_last_attempt_without_traceback():
    old_dead = finished_with_history(25)
    old_single = finished_with_history(1, status="succeeded")
    recent = finished_with_history(5, finished_ago=datetime.timedelta(days=1))
    running = finished_with_history(5, status="running")
    week = datetime.timedelta(days=30)
    assert retention.prune_attempt_history(older_than=week, dry_run=True) == 2
    assert len(history_of(old_dead)) == 25

    assert retention.prune_attempt_history(older_than=week, batch_size=1) == 2
    (last,) = history_of(old_dead)
    assert last["worker_id"] == "w-24" and last["error"].startswith("failure 24")
    assert "traceback" not in last
    assert history_of(old_single) == [{k: v for k, v in attempts(1)[0].items() if k != "traceback"}]
    assert len(history_of(recent)) == 5 and len(history_of(running)) == 5
    # Trimmed once: nothing left to trim.
    assert retention.prune_attempt_history(older_than=week) == 0


def test_jobguard_prune_trims_history_when_asked():
    finished_with_history(3)
    out = io.StringIO()
    # --no-jobs: dead 40 days ago with no dead letter, the job is past its retention.
    call_command("jobguard_prune", "--no-jobs", "--history-older-than", "30d", stdout=out)
    assert out.getvalue().splitlines() == [
        "Deleted 0 expired idempotency key(s).",
        "Deleted 0 idle database lock row(s).",
        "Trimmed the attempt history of 1 job(s) finished more than 30 days, 0:00:00 ago.",
    ]
