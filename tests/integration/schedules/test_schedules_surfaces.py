"""Schedules where operators meet them: the admin, jobguard_status, the system checks."""

from __future__ import annotations

import datetime
import io
import json
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.test import override_settings
from django.urls import reverse

from django_jobguard import checks, schedules, store, task
from django_jobguard.models import Job, Schedule
from django_jobguard.registry import registry
from tests.support.factories import make_superuser, make_user

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "tests.testapp.tasks.add"


def declaring(**entries: dict[str, Any]) -> Any:
    return override_settings(JOBGUARD={**settings.JOBGUARD, "SCHEDULES": entries})


@pytest.fixture
def two_schedules() -> None:
    with declaring(
        nightly={"task": ADD, "cron": "0 2 * * *", "timezone": "Asia/Jakarta", "args": [1]},
        gone={"task": ADD, "cron": "*/5 * * * *", "args": [2]},
    ):
        schedules.sync()
    with declaring(nightly={"task": ADD, "cron": "0 2 * * *", "timezone": "Asia/Jakarta", "args": [1]}):
        schedules.sync()  # "gone" is no longer declared
    last = store.database_now("default").replace(second=0, microsecond=0)
    Schedule.objects.filter(name="nightly").update(next_tick_at=last)
    with declaring(nightly={"task": ADD, "cron": "0 2 * * *", "timezone": "Asia/Jakarta", "args": [1]}):
        schedules.run_once()


# -- jobguard_status -------------------------------------------------------------------------


def status(*args: str) -> str:
    out = io.StringIO()
    call_command("jobguard_status", *args, stdout=out)
    return out.getvalue()


def test_status_lists_schedules_and_calls_out_removed_ones(two_schedules):
    out = status()
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("SCHEDULE"))
    assert lines[header].split() == [
        "SCHEDULE",
        "STATE",
        "CRON",
        "NEXT",
        "TICK",
        "LAST",
        "TICK",
        "LAST",
        "JOB",
    ]
    rows = {line.split()[0]: line for line in lines[header + 1 : header + 3]}
    job = Job.objects.get()
    assert "REMOVED" in rows["gone"] and "*/5 * * * * (UTC)" in rows["gone"]
    assert "active" in rows["nightly"] and "0 2 * * * (Asia/Jakarta)" in rows["nightly"]
    assert rows["nightly"].endswith(f"#{job.pk} queued")
    assert "1 schedule(s) no longer declared and not running: gone" in out


def test_status_json_carries_the_schedules(two_schedules):
    document = json.loads(status("--json"))
    by_name = {row["name"]: row for row in document["schedules"]}
    assert by_name["gone"]["state"] == "removed"
    nightly = by_name["nightly"]
    assert (nightly["state"], nightly["last_job_status"], nightly["task"]) == ("active", "queued", ADD)
    assert datetime.datetime.fromisoformat(nightly["next_tick_at"]) > datetime.datetime.fromisoformat(
        nightly["last_tick_at"]
    )


# -- admin -------------------------------------------------------------------------------------


def test_the_list_shows_next_and_last_tick_last_job_and_its_outcome(client, two_schedules):
    client.force_login(make_user("viewer", "view_schedule"))
    page = client.get(reverse("admin:jobguard_schedule_changelist")).content.decode()
    job = Job.objects.get()
    assert "nightly" in page and "gone" in page and "removed" in page
    assert reverse("admin:jobguard_job_change", args=[job.pk]) in page
    assert "queued" in page
    removed = client.get(reverse("admin:jobguard_schedule_changelist"), {"state": "removed"}).content.decode()
    assert "gone" in removed and "nightly" not in removed


def test_actions_need_their_permission(client, two_schedules):
    client.force_login(make_user("viewer", "view_schedule"))
    page = client.get(reverse("admin:jobguard_schedule_changelist")).content.decode()
    assert "pause_schedules" not in page and "run_schedules_now" not in page
    client.force_login(make_user("operator", "view_schedule", "pause_schedule", "run_schedule"))
    page = client.get(reverse("admin:jobguard_schedule_changelist")).content.decode()
    assert "pause_schedules" in page and "resume_schedules" in page and "run_schedules_now" in page


def test_pause_and_run_now_from_the_admin_are_recorded_in_the_history(client, two_schedules):
    user = make_user("operator", "view_schedule", "pause_schedule", "run_schedule")
    client.force_login(user)
    nightly = Schedule.objects.get(name="nightly")
    url = reverse("admin:jobguard_schedule_changelist")
    with declaring(nightly={"task": ADD, "cron": "0 2 * * *", "timezone": "Asia/Jakarta", "args": [1]}):
        client.post(url, {"action": "run_schedules_now", "_selected_action": [nightly.pk]})
        client.post(url, {"action": "pause_schedules", "_selected_action": [nightly.pk]})
    extra = Job.objects.exclude(pk=nightly.last_job_id).get()
    assert extra.idempotency_key.startswith("schedule:nightly:manual:")
    assert Schedule.objects.get(pk=nightly.pk).paused
    history = [entry.get_change_message() for entry in LogEntry.objects.filter(object_id=str(nightly.pk))]
    assert sorted(history) == sorted([f"Run now: job #{extra.pk}", "Paused"])
    assert {entry.user_id for entry in LogEntry.objects.all()} == {user.pk}


def test_arguments_show_only_with_the_payload_permission(client, two_schedules):
    nightly = Schedule.objects.get(name="nightly")
    url = reverse("admin:jobguard_schedule_change", args=[nightly.pk])
    client.force_login(make_user("viewer", "view_schedule"))
    assert "kwargs" not in client.get(url).content.decode()
    client.force_login(make_user("reader", "view_schedule", "view_payload", "pause_schedule"))
    assert "kwargs" in client.get(url).content.decode()


def test_only_removed_rows_can_be_deleted(client, two_schedules):
    user = make_superuser()
    client.force_login(user)
    nightly, gone = Schedule.objects.get(name="nightly"), Schedule.objects.get(name="gone")
    assert client.get(reverse("admin:jobguard_schedule_delete", args=[nightly.pk])).status_code == 403
    client.post(reverse("admin:jobguard_schedule_delete", args=[gone.pk]), {"post": "yes"})
    assert list(Schedule.objects.values_list("name", flat=True)) == ["nightly"]


# -- system checks ---------------------------------------------------------------------------


def ids(messages: list[Any]) -> list[tuple[str, str]]:
    return [(message.id, message.msg) for message in messages]


def test_checks_report_bad_cron_unknown_task_and_arguments_that_do_not_fit():
    with declaring(
        bad_cron={"task": ADD, "cron": "61 * * * *", "args": [1]},
        bad_zone={"task": ADD, "cron": "* * * * *", "timezone": "Mars/Olympus", "args": [1]},
        unknown={"task": "billing.tasks.nope", "cron": "* * * * *"},
        unfit={"task": ADD, "cron": "* * * * *"},
        fine={"task": ADD, "cron": "* * * * *", "args": [1]},
    ):
        found = ids(checks.declared_schedules.check_schedules())
    assert found == [
        (
            "jobguard.E010",
            "JOBGUARD['SCHEDULES']['bad_cron']: cron expression '61 * * * *' is invalid: Bad minute.",
        ),
        (
            "jobguard.E010",
            "JOBGUARD['SCHEDULES']['bad_zone']: time zone 'Mars/Olympus' is not an IANA time zone "
            "(such as 'Europe/Jakarta').",
        ),
        (
            "jobguard.E011",
            "JOBGUARD['SCHEDULES']['unfit'] has args/kwargs that do not fit the task: Arguments do not fit "
            "tests.testapp.tasks.add(a: 'int', b: 'int' = 0) -> 'int': missing a required argument: 'a'.",
        ),
        (
            "jobguard.E011",
            "JOBGUARD['SCHEDULES']['unknown'] names task 'billing.tasks.nope', which is not registered.",
        ),
    ]


def test_checks_warn_when_ticks_come_faster_than_the_task_runs_and_on_double_declarations():
    @task(name="tests.integration.slow_report", schedule="*/5 * * * *")
    def slow_report() -> None: ...

    # Set the way the expected_duration= option does (frozen dataclass), whether or not it exists.
    object.__setattr__(slow_report, "expected_duration", 900)
    try:
        found = ids(checks.declared_schedules.check_schedules())
        assert found == [
            (
                "jobguard.W013",
                "@task(schedule='*/5 * * * *') of tests.integration.slow_report ticks every 300s, but "
                "tests.integration.slow_report is expected to run for 900s: runs will pile up behind "
                "each other.",
            )
        ]
        with declaring(**{"tests.integration.slow_report": {"task": ADD, "cron": "0 * * * *", "args": [1]}}):
            found = ids(checks.declared_schedules.check_schedules())
        assert [check_id for check_id, _ in found] == ["jobguard.W014"]
    finally:
        registry.unregister("tests.integration.slow_report")
