"""The checklist's system checks: each fires on a misconfigured task or setting, and only then."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_jobguard import checks, task
from django_jobguard.models import Job
from django_jobguard.registry import registry

# The suite's purpose-built tasks use many queues: free-form names, so E030 stays out of these.
BASE = {
    "ALLOW_UNDECLARED_QUEUES": True,
    "QUEUES": {"default": {"visibility_timeout": 30}, "tune": {"visibility_timeout": 10}},
}


@pytest.fixture
def define() -> Iterator[Callable[..., Any]]:
    """Register a task for one test (unregistered afterwards, so other checks do not see it)."""
    names: list[str] = []

    def make(name: str, **options: Any) -> Any:
        def handler(order_id: int) -> None: ...

        created = task(name=f"tests.checks.{name}", **options)(handler)
        names.append(created.name)
        return created

    yield make
    for name in names:
        registry.unregister(name)


def ids_for(messages: list[django_checks.CheckMessage], obj: Any) -> list[str]:
    return sorted(m.id for m in messages if m.obj is obj or m.obj == getattr(obj, "name", obj))


def one(messages: list[django_checks.CheckMessage], check_id: str, obj: Any) -> django_checks.CheckMessage:
    found = [m for m in messages if m.id == check_id and (m.obj is obj or m.obj == getattr(obj, "name", obj))]
    assert len(found) == 1, messages
    return found[0]


@override_settings(JOBGUARD=BASE)
def test_unclassified_task_warns_and_a_classified_one_does_not(define):
    bare = define("bare", max_attempts=1)
    natural = define("natural", idempotent=True, max_attempts=1)
    accepted = define("accepted", idempotent=False, max_attempts=1)
    keyed = define("keyed", idempotency_key="charge:{order_id}", max_attempts=1)
    messages = checks.tasks.check_task_classification()
    warning = one(messages, "jobguard.W002", bare)
    assert warning.level == django_checks.WARNING
    assert "Unclassified: is it safe to run twice?" in warning.msg
    assert "idempotent=True" in warning.hint
    assert str(warning).startswith("<Task tests.checks.bare>: (jobguard.W002)")
    for ok in (natural, accepted, keyed):
        assert ids_for(messages, ok) == []


@override_settings(JOBGUARD=BASE)
def test_retries_without_error_classification_warn(define):
    retried = define("retried", idempotent=True)  # the queue's 5 attempts
    classified = define("classified", idempotent=True, retry_on=(TimeoutError,))
    single = define("single", idempotent=True, max_attempts=1)
    messages = checks.tasks.check_retry_classification()
    warning = one(messages, "jobguard.W003", retried)
    assert warning.msg.startswith("5 attempts and no error classification: every exception")
    assert "retry_on=" in warning.hint
    assert ids_for(messages, classified) == []
    assert ids_for(messages, single) == []


@override_settings(JOBGUARD={**BASE, "UNCLASSIFIED_ERRORS": "permanent"})
def test_retries_are_not_blind_when_unclassified_errors_are_permanent(define):
    retried = define("retried_permanent", idempotent=True)
    assert ids_for(checks.tasks.check_retry_classification(), retried) == []


@override_settings(JOBGUARD={**BASE, "LOCKS": {"TTL": 30}, "TUNING": {"HEARTBEAT_MARGIN": 5}})
def test_a_lock_ttl_below_two_heartbeat_margins_warns(define):
    short = define("short_lock", idempotent=True, max_attempts=1, lock="o:{order_id}", lock_ttl=8)
    fine = define("fine_lock", idempotent=True, max_attempts=1, lock="o:{order_id}")  # 30s
    messages = checks.tasks.check_task_classification()
    warning = one(messages, "jobguard.W007", short)
    assert "Lock TTL of 8s, shorter than two heartbeat margins (10s)" in warning.msg
    assert "lock_ttl=10" in warning.hint
    assert ids_for(messages, fine) == []


@override_settings(JOBGUARD=BASE)
def test_a_visibility_timeout_below_expected_duration_plus_margin_warns(define):
    # default queue: 30s; margin 5s by default
    tight = define("tight", idempotent=True, max_attempts=1, expected_duration=26)
    own = define("own", idempotent=True, max_attempts=1, expected_duration=26, visibility_timeout=60)
    fits = define("fits", idempotent=True, max_attempts=1, expected_duration=25)
    messages = checks.tasks.check_expected_durations()
    warning = one(messages, "jobguard.W004", tight)
    assert "Expected duration 26s, but the visibility timeout is 30s, below 31s" in warning.msg
    assert (
        "visibility_timeout=55" in warning.hint
        and "p99 26s x safety factor 2 = 52s, rounded up to 55s" in warning.hint
    )
    assert ids_for(messages, own) == []
    assert ids_for(messages, fits) == []


@override_settings(JOBGUARD={**BASE, "QUEUES": {"mixed": {"visibility_timeout": 600}}})
def test_a_queue_mixing_fast_and_slow_expected_durations_warns(define):
    define("fast", idempotent=True, max_attempts=1, queue_name="mixed", expected_duration=2)
    slow = define("slow", idempotent=True, max_attempts=1, queue_name="mixed", expected_duration=50)
    define("near", idempotent=True, max_attempts=1, queue_name="even", expected_duration=2)
    define("near_slow", idempotent=True, max_attempts=1, queue_name="even", expected_duration=20)
    messages = checks.tasks.check_expected_durations()
    mixed = [m for m in messages if m.id == "jobguard.W006"]
    assert len(mixed) == 1, messages
    assert mixed[0].obj is slow
    assert "Queue 'mixed' mixes fast and slow work: tests.checks.fast expected 2s" in mixed[0].msg
    assert "more than 20x apart" in mixed[0].msg
    with override_settings(
        JOBGUARD={
            **BASE,
            "QUEUES": {"mixed": {"visibility_timeout": 600}},
            "TUNING": {"QUEUE_SPLIT_FACTOR": 30},
        }
    ):
        assert [m for m in checks.tasks.check_expected_durations() if m.id == "jobguard.W006"] == []


@pytest.mark.parametrize(
    ("debug", "self_approval", "fires"), [(False, True, True), (True, True, False), (False, False, False)]
)
def test_self_approval_of_replays_warns_only_in_production(debug, self_approval, fires):
    with override_settings(DEBUG=debug, JOBGUARD={"REPLAY": {"ALLOW_SELF_APPROVAL": self_approval}}):
        messages = checks.settings.check_replay_approval()
    assert [m.id for m in messages] == (["jobguard.W008"] if fires else [])
    if fires:
        assert "one person can request and approve the replay" in messages[0].msg
        assert messages[0].hint


@override_settings(JOBGUARD=BASE)
def test_the_tasks_of_the_suite_and_example_raise_no_checklist_error():
    messages = (
        checks.tasks.check_task_classification()
        + checks.tasks.check_retry_classification()
        + checks.tasks.check_expected_durations()
    )
    assert [m for m in messages if m.is_serious()] == []
    # The module written for these tests follows the docs: nothing to say about it.
    from tests.testapp import tasks_checklist

    for classified in (tasks_checklist.charge_by_key, tasks_checklist.sleep_for):
        assert ids_for(messages, classified) == []


@override_settings(JOBGUARD=BASE, SILENCED_SYSTEM_CHECKS=[])
def test_manage_check_reports_the_task_by_name_and_silencing_works(define):
    define("loud", max_attempts=1, idempotent=None)
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "<Task tests.checks.loud>: (jobguard.W002) Unclassified" in err.getvalue()
    with override_settings(SILENCED_SYSTEM_CHECKS=["jobguard.W002", "jobguard.W003", "jobguard.W007"]):
        out, err = StringIO(), StringIO()
        call_command("check", stdout=out, stderr=err)
        assert "jobguard.W002" not in err.getvalue()


@override_settings(JOBGUARD=BASE, SILENCED_SYSTEM_CHECKS=[])
@pytest.mark.django_db(transaction=True)
def test_blind_retries_warn_at_deploy_and_worker_start_not_with_every_command(define):
    define("blind", idempotent=True)  # the queue's 5 attempts, no error classes
    said = "<Task tests.checks.blind>: (jobguard.W003) 5 attempts and no error classification"
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)  # what runserver, migrate, shell... run
    assert "jobguard.W003" not in err.getvalue()
    err = StringIO()
    call_command("check", deploy=True, stdout=StringIO(), stderr=err)
    assert said in err.getvalue()
    err = StringIO()
    call_command(
        "jobguard_worker", "--burst", "--queue", "w003", skip_checks=False, stdout=StringIO(), stderr=err
    )
    assert err.getvalue().count(said) == 1  # once, as the worker starts


@override_settings(JOBGUARD=BASE)
def test_bad_settings_do_not_break_the_checklist_checks():
    with override_settings(JOBGUARD={"TUNING": {"SAFETY_FACTOR": 0.5}}):
        assert checks.tasks.check_task_classification() == []
        assert checks.tasks.check_retry_classification() == []
        errors = checks.settings.check_settings()
    assert [e.id for e in errors] == ["jobguard.E001"]
    assert "JOBGUARD['TUNING']['SAFETY_FACTOR'] must be at least 1, not 0.5." in errors[0].msg


# -- observed durations (database-tagged) ------------------------------------------------------


def finished(task_name: str, queue: str, seconds: list[float], *, hours_ago: float = 0.1) -> None:
    """Succeeded jobs that ran the given seconds, finished ``hours_ago`` hours ago."""
    end = timezone.now() - datetime.timedelta(hours=hours_ago)
    Job.objects.bulk_create(
        Job(
            task_name=task_name,
            queue_name=queue,
            status="succeeded",
            attempts=1,
            started_at=end - datetime.timedelta(seconds=s),
            finished_at=end,
        )
        for s in seconds
    )


@pytest.mark.django_db
@override_settings(JOBGUARD={**BASE, "TUNING": {"MIN_RUNS": 5}})
def test_observed_p99_above_the_timeout_warns_only_with_check_database(define):
    slow = define("observed_slow", idempotent=True, max_attempts=1, queue_name="tune")
    fast = define("observed_fast", idempotent=True, max_attempts=1, queue_name="tune")
    finished(slow.name, "tune", [4.0] * 90 + [25.0] * 10)  # p99 25s > the queue's 10s
    finished(fast.name, "tune", [0.2] * 50)
    finished("tests.checks.too_few", "tune", [30.0] * 4)  # under MIN_RUNS: not trusted
    finished(fast.name, "tune", [60.0] * 50, hours_ago=30)  # outside the 24h window
    assert checks.tasks.check_observed_durations(databases=None) == []
    messages = checks.tasks.check_observed_durations(databases=["default"])
    warning = one(messages, "jobguard.W005", slow)
    assert "100 runs in the last 24h with a p99 of 25s (max 25s), above its visibility timeout of 10s" in (
        warning.msg
    )
    assert "visibility_timeout=50" in warning.hint and "jobguard_tune" in warning.hint
    assert ids_for(messages, fast) == []
    assert all(m.obj != "tests.checks.too_few" for m in messages)
    split = [m for m in messages if m.id == "jobguard.W006"]
    assert len(split) == 1 and "observed p99" in split[0].msg and split[0].obj is slow


@pytest.mark.django_db
@override_settings(JOBGUARD={**BASE, "TUNING": {"MIN_RUNS": 5}})
def test_observed_durations_within_the_timeout_say_nothing(define):
    steady = define("observed_steady", idempotent=True, max_attempts=1, queue_name="tune")
    finished(steady.name, "tune", [2.0] * 30)
    assert checks.tasks.check_observed_durations(databases=["default"]) == []


@pytest.mark.django_db
@override_settings(JOBGUARD={**BASE, "TUNING": {"MIN_RUNS": 5}}, SILENCED_SYSTEM_CHECKS=[])
def test_check_database_runs_the_observed_check(define):
    slow = define("observed_cmd", idempotent=True, max_attempts=1, queue_name="tune")
    finished(slow.name, "tune", [15.0] * 10)
    err = StringIO()
    call_command("check", "--database", "default", stdout=StringIO(), stderr=err)  # warnings only
    assert "<Task tests.checks.observed_cmd>: (jobguard.W005)" in err.getvalue()
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)
    assert "jobguard.W005" not in err.getvalue()


def test_the_durable_invalidation_task_of_the_cache_module_is_classified():
    # A project that uses durable invalidation registers this task; the checklist must have
    # nothing to say about a task the project did not write.
    from django_jobguard.cache import delete_keys
    from django_jobguard.exceptions import TransientError
    from django_jobguard.retry import classify

    assert ids_for(checks.tasks.check_task_classification(), delete_keys) == []
    # A cache that fails is still retried; a bug in the payload is not.
    assert classify(TransientError("cache down"), delete_keys) == "transient"
    assert classify(KeyError("keys"), delete_keys) == "permanent"


def test_a_database_without_a_store_dialect_is_an_error(monkeypatch):
    from django.db import connection

    assert all(message.id != "jobguard.E003" for message in checks.database.check_database())
    monkeypatch.setattr(connection, "vendor", "oracle")
    (error,) = [message for message in checks.database.check_database() if message.id == "jobguard.E003"]
    assert error.msg == "django-jobguard supports PostgreSQL, MariaDB/MySQL and SQLite; 'default' is oracle."
