"""Declaring schedules: the @task option and the settings' defaults."""

import pytest

from django_jobguard import conf, task
from django_jobguard.exceptions import InvalidTaskError


def test_schedule_must_be_a_cron_string():
    with pytest.raises(
        InvalidTaskError, match=r"schedule must be a cron expression such as '\*/5 \* \* \* \*', not ''"
    ):

        @task(name="tests.unit.empty_schedule", schedule="")
        def empty() -> None: ...


def test_a_scheduled_task_name_must_fit_in_the_tick_key():
    with pytest.raises(InvalidTaskError, match="longer than 200 characters; pass a shorter name"):

        @task(name="tests." + "x" * 200, schedule="* * * * *")
        def long_name() -> None: ...


def test_scheduler_defaults_and_a_settings_schedule_with_defaults():
    parsed = conf.parse({"SCHEDULES": {"nightly": {"task": "app.tasks.f", "cron": "0 2 * * *"}}})
    assert (parsed.scheduler.interval, parsed.scheduler.missed_after, parsed.scheduler.catch_up_max) == (
        1,
        60,
        100,
    )
    nightly = parsed.schedules["nightly"]
    assert (nightly.timezone, nightly.args, dict(nightly.kwargs), nightly.queue_name, nightly.missed) == (
        "UTC",
        (),
        {},
        None,
        "run_once",
    )
    assert nightly.source == "settings"
