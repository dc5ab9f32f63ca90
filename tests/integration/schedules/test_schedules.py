"""Schedules against the database: sync, the scheduler pass, missed ticks, operators' verbs."""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.test import override_settings
from prometheus_client import REGISTRY

from django_jobguard import InvalidArgumentsError, conf, schedules, store, task
from django_jobguard.models import IdempotencyKey, Job, Schedule
from django_jobguard.registry import registry
from tests.support.factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "tests.testapp.tasks.add"
NOOP = "tests.testapp.tasks.noop"


def declaring(**entries: dict[str, Any]) -> Any:
    return override_settings(JOBGUARD={**settings.JOBGUARD, "SCHEDULES": entries})


def db_now() -> datetime.datetime:
    return store.database_now("default")


def outage(name: str, minutes: int) -> None:
    """Pretend no scheduler ran for ``minutes``: the next tick is that many minutes before the
    last whole minute (so with 0 it is the one tick due, less than a minute old).

    Close to a minute's end it first waits for the next minute: a tick that came due between
    this and the test's scheduler pass would add one to every count the test expects.
    """
    now = db_now()
    if now.second >= 55:
        time.sleep(60.5 - now.second - now.microsecond / 1e6)
        now = db_now()
    last = now.replace(second=0, microsecond=0)
    Schedule.objects.filter(name=name).update(next_tick_at=last - datetime.timedelta(minutes=minutes))


def sample(metric: str, name: str) -> float:
    return REGISTRY.get_sample_value(metric, {"schedule": name}) or 0.0


@pytest.fixture
def every_minute() -> Iterator[None]:
    with declaring(report={"task": ADD, "cron": "* * * * *", "args": [1], "kwargs": {"b": 2}}):
        schedules.sync()
        yield


# -- sync --------------------------------------------------------------------------------


def test_sync_creates_a_row_whose_first_tick_follows_the_database_clock(every_minute):
    row = Schedule.objects.get(name="report")
    assert (row.task_name, row.cron, row.timezone, row.args, row.kwargs) == (
        ADD,
        "* * * * *",
        "UTC",
        [1],
        {"b": 2},
    )
    assert (row.missed, row.source, row.state) == ("run_once", "settings", "active")
    now = db_now()
    assert now < row.next_tick_at <= now + datetime.timedelta(minutes=1)
    assert row.next_tick_at.second == 0 and row.last_tick_at is None and row.last_job is None


def test_a_schedule_no_longer_declared_is_marked_removed_logged_and_not_run(every_minute, caplog):
    with declaring(), caplog.at_level(logging.WARNING, logger="django_jobguard"):
        result = schedules.sync()
    assert result.removed == ["report"]
    assert "schedule_removed name=report task=tests.testapp.tasks.add; no longer declared" in caplog.text
    row = Schedule.objects.get(name="report")
    assert row.state == "removed" and row.removed_at is not None
    outage("report", 5)
    with declaring():
        assert schedules.run_once().enqueued == []
    # Another process that still declares it does not run a removed row either.
    with declaring(report={"task": ADD, "cron": "* * * * *", "args": [1]}):
        assert schedules.run_once().enqueued == []
        assert schedules.sync().restored == ["report"]
    restored = Schedule.objects.get(name="report")
    assert restored.state == "active" and restored.next_tick_at > db_now()


def test_a_changed_cron_restarts_the_ticks_and_other_changes_keep_them(every_minute):
    before = Schedule.objects.get(name="report").next_tick_at
    with declaring(report={"task": ADD, "cron": "* * * * *", "args": [5], "missed": "skip"}):
        assert schedules.sync().updated == ["report"]
    row = Schedule.objects.get(name="report")
    assert (row.args, row.kwargs, row.missed, row.next_tick_at) == ([5], {}, "skip", before)
    with declaring(report={"task": ADD, "cron": "0 3 * * *", "timezone": "Asia/Jakarta", "args": [5]}):
        schedules.sync()
    row = Schedule.objects.get(name="report")
    assert row.next_tick_at.hour == 20 and row.next_tick_at.minute == 0  # 03:00 in Jakarta


def test_a_task_declares_its_own_schedule():
    @task(name="tests.integration.scheduled_noop", schedule="*/5 * * * *")
    def scheduled_noop() -> None: ...

    try:
        schedules.sync()
        row = Schedule.objects.get(name="tests.integration.scheduled_noop")
        assert (row.task_name, row.cron, row.source) == (
            "tests.integration.scheduled_noop",
            "*/5 * * * *",
            "code",
        )
        assert row.next_tick_at.minute % 5 == 0
    finally:
        registry.unregister("tests.integration.scheduled_noop")


# -- the scheduler pass --------------------------------------------------------------------


def test_a_due_tick_gets_one_job_with_the_tick_key_and_the_row_moves_on(every_minute):
    outage("report", 0)
    due = Schedule.objects.get(name="report").next_tick_at
    enqueued_before = sample("jobguard_schedule_ticks_enqueued_total", "report")
    done = schedules.run_once()
    assert [(t.schedule, t.tick_at) for t in done.enqueued] == [("report", due)]
    assert 0 < done.next_due_in <= 60  # when workers should come back: the next tick
    job = Job.objects.get()
    assert job.idempotency_key == f"schedule:report:{due.isoformat()}"
    assert (job.task_name, job.args, job.kwargs, job.queue_name) == (ADD, [1], {"b": 2}, "default")
    row = Schedule.objects.get(name="report")
    assert (row.last_tick_at, row.last_job_id) == (due, job.pk)
    assert row.next_tick_at > db_now() - datetime.timedelta(seconds=1)
    assert sample("jobguard_schedule_ticks_enqueued_total", "report") == enqueued_before + 1
    assert REGISTRY.get_sample_value("jobguard_schedule_lag_seconds_count", {"schedule": "report"}) >= 1
    # Nothing is due any more: a second pass (any worker's) enqueues nothing.
    assert schedules.run_once().enqueued == []
    assert Job.objects.count() == 1


def test_a_scheduler_that_read_the_row_before_another_advanced_it_enqueues_nothing(every_minute):
    outage("report", 0)
    stale = Schedule.objects.annotate(
        db_now=Now(),
        is_due=ExpressionWrapper(Q(next_tick_at__lte=Now()), output_field=BooleanField()),
    ).get(name="report")
    assert len(schedules.run_once().enqueued) == 1  # the other scheduler wins the tick
    late = schedules.SchedulerPass()
    schedules._tick(stale, "default", late)  # the compare-and-set itself
    assert (late.enqueued, late.contended) == ([], 1)
    assert Job.objects.count() == 1
    assert IdempotencyKey.objects.get().duplicates == 0  # it did not even try to enqueue


def test_a_schedule_in_the_future_is_not_due(every_minute):
    Schedule.objects.filter(name="report").update(next_tick_at=db_now() + datetime.timedelta(seconds=30))
    assert schedules.run_once().enqueued == []
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("policy", "jobs", "missed"),
    [("skip", 0, 11), ("run_once", 1, 10), ("catch_up", 11, 0)],
)
def test_missed_ticks_after_an_outage_follow_the_policy(policy, jobs, missed, caplog):
    entry = {"task": NOOP, "cron": "* * * * *", "missed": policy}
    with override_settings(
        JOBGUARD={**settings.JOBGUARD, "SCHEDULES": {"outage": entry}, "SCHEDULER": {"MISSED_AFTER": 0}}
    ):
        schedules.sync()
        outage("outage", 10)  # 11 ticks due, all older than MISSED_AFTER
        first = Schedule.objects.get(name="outage").next_tick_at
        missed_before = sample("jobguard_schedule_ticks_missed_total", "outage")
        with caplog.at_level(logging.WARNING, logger="django_jobguard"):
            done = schedules.run_once()
    assert len(done.enqueued) == Job.objects.count() == jobs
    assert done.missed.get("outage", 0) == missed
    assert sample("jobguard_schedule_ticks_missed_total", "outage") == missed_before + missed
    row = Schedule.objects.get(name="outage")
    assert row.next_tick_at > db_now() - datetime.timedelta(seconds=1)  # no second pass needed
    if policy == "run_once":
        assert done.enqueued[0].tick_at == first + datetime.timedelta(minutes=10)  # the latest
    if missed:
        assert f"schedule_ticks_missed name=outage missed={missed}" in caplog.text


def test_a_tick_the_task_refuses_is_logged_and_passed_over(caplog):
    with declaring(broken={"task": ADD, "cron": "* * * * *", "kwargs": {"c": 1}}):
        schedules.sync()
        outage("broken", 0)
        with caplog.at_level(logging.ERROR, logger="django_jobguard"):
            assert schedules.run_once().enqueued == []
        assert (
            "schedule_tick_failed name=broken task=tests.testapp.tasks.add error=Arguments do not fit"
            in caplog.text
        )
        assert Schedule.objects.get(name="broken").next_tick_at > db_now() - datetime.timedelta(seconds=1)
        assert not Job.objects.exists()


def test_a_schedule_whose_task_this_process_lacks_waits_for_a_worker_that_has_it():
    with declaring(elsewhere={"task": "other.app.tasks.job", "cron": "* * * * *"}):
        schedules.sync()
        outage("elsewhere", 0)
        done = schedules.run_once()
    assert (done.enqueued, done.next_due_in) == ([], None)  # nothing to do, nothing to wake for
    assert Schedule.objects.get(name="elsewhere").next_tick_at < db_now()  # still due


def test_a_declared_schedule_without_a_row_is_synced_by_the_pass():
    with declaring(fresh={"task": NOOP, "cron": "* * * * *"}):
        done = schedules.run_once()
    assert done.synced is not None and done.synced.created == ["fresh"]
    assert Schedule.objects.filter(name="fresh").exists()


# -- operators -------------------------------------------------------------------------------


def test_pause_stops_ticks_and_resume_starts_from_the_next_tick(every_minute, caplog):
    row = Schedule.objects.get(name="report")
    with pytest.raises(
        PermissionDenied, match=r"Only users with the jobguard\.pause_schedule permission can pause"
    ):
        schedules.pause(row, user=make_user("nobody", staff=False))
    ops = make_user("ops", "pause_schedule", staff=False)
    with caplog.at_level(logging.INFO, logger="django_jobguard"):
        assert schedules.pause(row, user=ops)
    assert "schedule_paused name=report user='ops'" in caplog.text
    assert not schedules.pause(row, user=ops)  # already paused
    outage("report", 5)
    assert schedules.run_once().enqueued == []
    paused = Schedule.objects.get(name="report")
    assert (paused.state, paused.paused_by) == ("paused", ops)
    assert schedules.resume(paused, user=ops)
    resumed = Schedule.objects.get(name="report")
    assert resumed.state == "active" and resumed.next_tick_at > db_now()  # the paused ticks do not run
    assert schedules.run_once().enqueued == []


def test_run_now_enqueues_an_extra_job_with_its_own_key_and_logs_who(every_minute, caplog):
    row = Schedule.objects.get(name="report")
    with pytest.raises(PermissionDenied, match=r"jobguard\.run_schedule permission can run"):
        schedules.run_now(row, user=make_user("pia", "pause_schedule", staff=False))
    runner = make_user("rob", "run_schedule", staff=False)
    with caplog.at_level(logging.INFO, logger="django_jobguard"):
        first = schedules.run_now(row, user=runner)
        second = schedules.run_now(row, user=runner)
    assert first.pk != second.pk
    assert first.idempotency_key.startswith("schedule:report:manual:")
    assert f"schedule_run_now name=report user='rob' job_id={first.pk}" in caplog.text
    assert Schedule.objects.get(name="report").next_tick_at == row.next_tick_at  # ticks untouched
    Schedule.objects.filter(pk=row.pk).update(removed_at=Now())
    with pytest.raises(InvalidArgumentsError, match="'report' is removed"):
        schedules.run_now(Schedule.objects.get(pk=row.pk), user=runner)


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedules_setting", "message"),
    [
        ({"x": {"cron": "* * * * *"}}, r"JOBGUARD\['SCHEDULES'\]\['x'\]\['task'\] is required"),
        ({"x": {"task": ADD, "cron": "* * * * *", "missed": "all"}}, r"\['x'\]\['missed'\] must be one of"),
        ({"x": {"task": ADD, "cron": "* * * * *", "every": 1}}, r"\['x'\]\['every'\] is not a known setting"),
        ({"x": {"task": ADD, "cron": "* * * * *", "args": 1}}, r"\['x'\]\['args'\] must be a list"),
        (
            {"x": {"task": ADD, "cron": "* * * * *", "kwargs": {"a": {1}}}},
            r"\['x'\]\['kwargs'\] must be JSON",
        ),
        ({"x" * 201: {"task": ADD, "cron": "* * * * *"}}, "is 201 characters long; it may have at most 200"),
        ({"x": {"task": ADD, "cron": ""}}, r"\['x'\]\['cron'\] must be a non-empty string"),
    ],
)
def test_bad_schedule_settings_name_the_full_key(schedules_setting, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        conf.parse({"SCHEDULES": schedules_setting})
    with pytest.raises(ImproperlyConfigured, match=r"JOBGUARD\['SCHEDULER'\]\['CATCH_UP_MAX'\]"):
        conf.parse({"SCHEDULER": {"CATCH_UP_MAX": 0}})
