"""jobguard_tune: percentiles of recorded durations, recommendations, flags, the --json shape."""

from __future__ import annotations

import datetime
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_jobguard import store
from django_jobguard.models import Job
from django_jobguard.monitoring import tuning

pytestmark = pytest.mark.django_db

SETTINGS = {
    "QUEUES": {"web": {"visibility_timeout": 10}, "reports": {"visibility_timeout": 600}},
    "TUNING": {"SAFETY_FACTOR": 2, "HEARTBEAT_MARGIN": 5},
}


def finished(
    task_name: str, queue: str, seconds: list[float], *, hours_ago: float = 0.5, status: str = "succeeded"
) -> None:
    end = timezone.now() - datetime.timedelta(hours=hours_ago)
    Job.objects.bulk_create(
        Job(
            task_name=task_name,
            queue_name=queue,
            status=status,
            attempts=1,
            started_at=end - datetime.timedelta(seconds=s),
            finished_at=end,
        )
        for s in seconds
    )


def tune(*options: str) -> str:
    out = StringIO()
    call_command("jobguard_tune", *options, stdout=out)
    return out.getvalue()


def test_percentiles_are_interpolated_between_ranks_on_every_database():
    finished("t.one_to_hundred", "web", [float(n) for n in range(1, 101)])
    (durations,) = tuning.observed_durations(connection.alias, since=3600)
    assert (durations.queue, durations.task, durations.count) == ("web", "t.one_to_hundred", 100)
    # percentile_cont: position p * (n - 1) between the two nearest ranks.
    assert durations.p50 == pytest.approx(50.5, abs=1e-3)
    assert durations.p95 == pytest.approx(95.05, abs=1e-3)
    assert durations.p99 == pytest.approx(99.01, abs=1e-3)
    assert durations.max == pytest.approx(100, abs=1e-3)


def test_only_succeeded_jobs_inside_the_window_count():
    finished("t.windowed", "web", [2.0] * 10)
    finished("t.windowed", "web", [500.0] * 10, hours_ago=30)  # before the window
    finished("t.windowed", "web", [900.0] * 10, status="dead")  # failed attempts: not a run's length
    Job.objects.create(task_name="t.windowed", queue_name="web", status="queued")
    (durations,) = tuning.observed_durations(connection.alias, since=24 * 3600)
    assert durations.count == 10
    assert durations.max == pytest.approx(2.0, abs=1e-3)
    assert tuning.observed_durations(connection.alias, since=24 * 3600, queue="reports") == []


@pytest.mark.parametrize(
    ("p99", "recommended", "reason"),
    [
        (0.3, 6, "p99 0.3s + heartbeat margin 5s = 5.3s, rounded up to 6s"),
        (4.0, 9, "p99 4s + heartbeat margin 5s = 9s, rounded up to 9s"),
        (12.0, 25, "p99 12s x safety factor 2 = 24s, rounded up to 25s"),
        (400.0, 810, "p99 400s x safety factor 2 = 800s, rounded up to 810s"),
        (1000.0, 2040, "p99 1e+03s x safety factor 2 = 2e+03s, rounded up to 2040s"),
    ],
)
@override_settings(JOBGUARD=SETTINGS)
def test_recommendation_is_p99_times_the_safety_factor_at_least_the_margin_rounded_up(
    p99, recommended, reason
):
    assert tuning.recommend_timeout(p99) == (recommended, reason)


@override_settings(JOBGUARD=SETTINGS)
def test_text_report_flags_a_task_past_its_timeout_and_a_queue_to_split():
    finished("t.fast", "web", [0.1] * 50)
    finished("t.slow", "web", [3.0] * 90 + [30.0] * 10)
    finished("t.report", "reports", [60.0] * 5)
    out = tune()
    assert (
        "queue web: visibility timeout 10s, recommended 60s (its slowest task, t.slow: "
        "p99 30s x safety factor 2 = 60s, rounded up to 60s)" in out
    )
    assert "! t.slow: p99 30s outlasts its visibility timeout of 10s" in out
    assert "Set visibility_timeout=60" in out
    assert "! split queue web: p99s from 1s or less to 30s, more than 20x apart" in out
    assert "! t.fast" not in out and "! t.report" not in out and "split queue reports" not in out
    assert "queue reports: visibility timeout 600s, recommended 120s" in out
    only = tune("--queue", "reports")
    assert "queue web" not in only and "t.report" in only


@override_settings(JOBGUARD=SETTINGS)
def test_json_report_has_the_documented_shape():
    finished("t.slow", "web", [3.0] * 90 + [30.0] * 10)
    document = json.loads(tune("--json", "--since", "2h"))
    assert set(document) == {
        "generated_at",
        "database",
        "since_seconds",
        "safety_factor",
        "heartbeat_margin_seconds",
        "queue_split_factor",
        "queues",
    }
    assert document["since_seconds"] == 7200
    assert document["database"] == "default"
    (queue,) = document["queues"]
    assert queue == {
        "queue": "web",
        "visibility_timeout": 10.0,
        "recommended_visibility_timeout": 60.0,
        "reason": "its slowest task, t.slow: p99 30s x safety factor 2 = 60s, rounded up to 60s",
        "split": False,
        "tasks": [
            {
                "task": "t.slow",
                "count": 100,
                "p50": pytest.approx(3.0, abs=1e-3),
                "p95": pytest.approx(30.0, abs=1e-3),
                "p99": pytest.approx(30.0, abs=1e-3),
                "max": pytest.approx(30.0, abs=1e-3),
                "visibility_timeout": 10.0,
                "recommended_visibility_timeout": 60.0,
                "reason": "p99 30s x safety factor 2 = 60s, rounded up to 60s",
                "exceeds_timeout": True,
                "few_runs": False,
            }
        ],
    }


@override_settings(JOBGUARD={**SETTINGS, "TUNING": {**SETTINGS["TUNING"], "MIN_RUNS": 10}})
def test_a_task_with_fewer_runs_than_min_runs_is_marked_a_weak_basis():
    finished("t.rare", "reports", [60.0] * 3)
    finished("t.enough", "reports", [60.0] * 10)  # MIN_RUNS exactly: trusted
    out = tune()
    (rare,) = [line for line in out.splitlines() if line.startswith("  t.rare ")]
    assert rare.endswith(
        "600s -> 120s  (only 3 runs in the window; JOBGUARD['TUNING']['MIN_RUNS'] is 10: a weak basis)"
    ), rare
    (enough,) = [line for line in out.splitlines() if line.startswith("  t.enough ")]
    assert "weak basis" not in enough and enough.endswith("600s -> 120s"), enough
    (queue,) = json.loads(tune("--json"))["queues"]
    assert {task["task"]: task["few_runs"] for task in queue["tasks"]} == {"t.enough": False, "t.rare": True}


def test_nothing_finished_says_so():
    assert "No succeeded jobs in any queue in the last 24h: nothing to tune from." in tune()
    assert json.loads(tune("--json"))["queues"] == []


def test_bad_options_are_refused_with_the_rule():
    with pytest.raises(CommandError, match="'soon' is not a duration: give a number of seconds"):
        call_command("jobguard_tune", "--since", "soon")
    with pytest.raises(CommandError, match="'-1h' is not a duration"):
        call_command("jobguard_tune", "--since=-1h")
    with pytest.raises(CommandError, match="'0h' must be a window above 0"):
        call_command("jobguard_tune", "--since=0h")
    with pytest.raises(CommandError, match="--database 'elsewhere': no such database alias in DATABASES"):
        call_command("jobguard_tune", "--database", "elsewhere")


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's plan")
def test_sqlite_reads_the_window_through_the_finished_index():
    sql, params = store.sqlite.durations_sql(86400, None)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert "jobguard_job_finished_idx" in plan, plan


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("truncated_after")  # committed, then truncated: no million dead rows left
def test_postgres_uses_the_finished_index_with_a_million_finished_rows():
    with connection.cursor() as cursor:
        # A million succeeded jobs over 30 days, the last day of them in the window.
        cursor.execute(
            "INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, run_after, status, "
            "attempts, max_attempts, visibility_timeout, lock_key, handler_version, enqueued_at, "
            "started_at, finished_at, reappearances, lock_contentions, checkpoints, worker_id, last_error) "
            "SELECT 't.bulk' || (n % 7), 'q' || (n % 3), '[]', '{}', 0, now(), 'succeeded', 1, 1, 60, "
            "'', '', "
            "now(), now() - (n % 30) * interval '1 day' - (n % 13) * interval '1 second', "
            "now() - (n % 30) * interval '1 day', 0, 0, '{}', '', '' "
            "FROM generate_series(1, 1000000) AS n"
        )
        cursor.execute("ANALYZE jobguard_job")
        sql, params = store.postgres.durations_sql(86400, None)
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "jobguard_job_finished_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
    reports = tuning.observed_durations(connection.alias, since=86400)
    assert sum(d.count for d in reports) == pytest.approx(1_000_000 / 30, rel=0.01)
    assert max(d.max for d in reports) == pytest.approx(12, abs=1e-3)


def test_the_job_admin_shows_the_run_time_beside_the_expected_duration(client):
    from django.urls import reverse

    from tests.support.factories import make_user
    from tests.testapp.tasks_checklist import sleep_for  # expected_duration=1

    finished(sleep_for.name, "tune", [2.5])
    job = Job.objects.get(task_name=sleep_for.name)
    client.force_login(make_user("tess", "view_job"))
    content = client.get(reverse("admin:jobguard_job_change", args=[job.pk])).content.decode()
    assert "2.500 s; longer than expected; expected 1 s" in content
    Job.objects.filter(pk=job.pk).update(finished_at=None, started_at=None, status="queued")
    content = client.get(reverse("admin:jobguard_job_change", args=[job.pk])).content.decode()
    assert "expected 1 s" in content and "longer than expected" not in content
