"""Queue statistics: the numbers behind jobguard_status and the jobguard_queue_* gauges."""

from __future__ import annotations

import datetime
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_jobguard.management.commands.jobguard_status import format_age
from django_jobguard.models import Job
from django_jobguard.monitoring import metrics, stats
from tests.support.factories import make_dead_letter

pytestmark = pytest.mark.django_db

TASK = "tests.testapp.tasks.add"


def job(
    queue: str, status: str = "queued", *, seconds: float = -120, finished_ago: float | None = None
) -> Job:
    """A job row of ``queue``: ``seconds`` from now is its run_after (negative: due)."""
    now = timezone.now()
    fields: dict = {
        "task_name": TASK,
        "queue_name": queue,
        "status": status,
        "run_after": now + datetime.timedelta(seconds=seconds),
    }
    if status == "running":
        fields.update(lease_token="t" * 32, lease_expires_at=now + datetime.timedelta(seconds=60), attempts=1)
    if finished_ago is not None:
        fields.update(finished_at=now - datetime.timedelta(seconds=finished_ago), attempts=1)
    return Job.objects.create(**fields)


def scenario() -> None:
    """Three due jobs in "default" (oldest 300 s), two scheduled, one running, dead letters..."""
    job("default", seconds=-300)
    job("default", seconds=-60)
    job("default", seconds=-1)
    job("default", seconds=3600)
    job("default", seconds=7200)
    job("default", "running")
    job("emails", "running")
    job("emails", seconds=600)
    job("default", "succeeded", finished_ago=600)
    job("default", "succeeded", finished_ago=60)
    job("default", "succeeded", finished_ago=7200)  # outside the hour
    job("emails", "dead", finished_ago=30)
    job("default", "cancelled", finished_ago=30)  # neither a success nor a failure
    make_dead_letter(queue_name="default")
    make_dead_letter(queue_name="default", replay_state="requested")
    make_dead_letter(queue_name="default", replay_state="approved")
    make_dead_letter(queue_name="default", replay_state="rejected")  # resolved: not counted
    make_dead_letter(queue_name="default", replay_state="replayed")  # resolved: not counted
    # A queue known only from its dead letters.
    make_dead_letter(queue_name="reports", replay_state="requested")


def by_queue(rows: list[stats.QueueStats]) -> dict[str, stats.QueueStats]:
    return {row.queue: row for row in rows}


def selects(ctx: CaptureQueriesContext) -> list[str]:
    # Savepoints around the collector (inside the test's transaction) are not reads.
    return [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("SELECT")]


def test_queue_stats_count_each_state_per_queue():
    scenario()
    rows = by_queue(stats.queue_stats(recent=True))
    default = rows["default"]
    assert (default.depth, default.scheduled, default.in_flight) == (3, 2, 1)
    assert 300 <= default.oldest_age_seconds < 360
    assert (default.dead_letters, default.pending_approvals) == (3, 1)
    assert (default.succeeded_last_hour, default.failed_last_hour) == (2, 0)
    emails = rows["emails"]
    assert (emails.depth, emails.scheduled, emails.in_flight, emails.oldest_age_seconds) == (0, 1, 1, 0.0)
    assert (emails.succeeded_last_hour, emails.failed_last_hour) == (0, 1)
    assert (rows["reports"].dead_letters, rows["reports"].pending_approvals) == (1, 1)


def test_a_stuck_job_is_not_in_flight_as_on_the_job_lists_running_filter():
    scenario()
    stuck = job("default", "running")
    Job.objects.filter(pk=stuck.pk).update(lease_expires_at=timezone.now() - datetime.timedelta(seconds=5))
    default = by_queue(stats.queue_stats())["default"]
    # The job list's split: "running" is a live lease, "stuck" an expired one; each counted once.
    assert (default.in_flight, default.stuck) == (1, 1)
    running = Job.objects.filter(queue_name="default")
    assert (running.leased().count(), running.expired_leases().count()) == (1, 1)


def test_configured_queues_are_listed_with_zeros_and_rows_are_sorted():
    rows = stats.queue_stats()
    # tests/settings.py configures "default" and "slow"; nothing is enqueued.
    assert [row.queue for row in rows] == ["default", "slow"]
    assert rows[1] == stats.QueueStats(queue="slow")
    assert rows[1].succeeded_last_hour is None  # not asked for


def test_queue_filter_restricts_rows():
    scenario()
    rows = stats.queue_stats(queues=["emails", "nothing-here"], recent=True)
    assert [(row.queue, row.in_flight, row.scheduled) for row in rows] == [
        ("emails", 1, 1),
        ("nothing-here", 0, 0),
    ]


def test_query_count_is_fixed_whatever_the_number_of_queues():
    with CaptureQueriesContext(connection) as empty:
        stats.queue_stats(recent=True)
    for index in range(6):
        job(f"q{index}")
        job(f"q{index}", "running")
        make_dead_letter(queue_name=f"q{index}")
    with CaptureQueriesContext(connection) as busy:
        rows = stats.queue_stats(recent=True)
    assert len(rows) == 8
    assert len(empty.captured_queries) == len(busy.captured_queries) == stats.QUERIES_WITH_RECENT
    with CaptureQueriesContext(connection) as plain:
        stats.queue_stats()
    assert len(plain.captured_queries) == stats.QUERIES


def test_queued_jobs_are_counted_through_the_partial_index():
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    scenario()
    with CaptureQueriesContext(connection) as ctx:
        stats.queue_stats()
    queued_sql = ctx.captured_queries[0]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + queued_sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # Any of the partial indexes of queued jobs (the due ones, or the flow-key one): never
    # a read of the finished rows.
    assert any(name in plan for name in ("jobguard_job_due", "jobguard_job_flowkey_idx")), plan


# -- the collector and the /metrics view -------------------------------------------------


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_view_serves_the_queue_gauges_with_five_reads(client):
    scenario()
    with CaptureQueriesContext(connection) as ctx:
        samples = scrape(client)
    # The queues' four, and one for the workflow gauges.
    assert len(selects(ctx)) == stats.QUERIES + stats.WORKFLOW_QUERIES == 5
    default = (("queue", "default"),)
    assert samples[("jobguard_queue_depth", default)] == 3
    assert samples[("jobguard_queue_scheduled", default)] == 2
    assert samples[("jobguard_queue_in_flight", default)] == 1
    assert 300 <= samples[("jobguard_queue_oldest_age_seconds", default)] < 360
    assert samples[("jobguard_queue_dead_letters", default)] == 3
    assert samples[("jobguard_queue_replays_pending_approval", default)] == 1
    assert samples[("jobguard_queue_replays_pending_approval", (("queue", "reports"),))] == 1
    assert samples[("jobguard_queue_depth", (("queue", "slow"),))] == 0
    assert samples[("jobguard_queue_stats_up", ())] == 1
    assert samples[("jobguard_queue_stats_duration_seconds", ())] > 0
    # The page is the default registry's (django-prometheus's view), not ours alone.
    assert ("python_info", ()) in {(name, ()) for name, _ in samples}


def test_collector_reports_down_instead_of_failing_the_scrape(client):
    if connection.vendor == "mysql":
        pytest.skip("MariaDB/MySQL commit DDL at once: the rename would end the test's transaction")
    scenario()
    # A real failure: the dead-letter table is gone (the test's transaction restores it).
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobguard_deadletter RENAME TO jobguard_deadletter_gone")
    samples = scrape(client)
    assert samples[("jobguard_queue_stats_up", ())] == 0
    assert not [key for key in samples if key[0] == "jobguard_queue_depth"]
    # The savepoint kept the test's transaction usable.
    assert Job.objects.filter(queue_name="default").count() == 10


def test_collector_is_registered_once_and_can_be_removed():
    registry = metrics.prometheus_client.CollectorRegistry()
    first = metrics.register_queue_collector(registry)
    assert metrics.register_queue_collector(registry) is first
    assert registry.get_sample_value("jobguard_queue_depth", {"queue": "default"}) == 0
    metrics.unregister_queue_collector(registry)
    assert registry.get_sample_value("jobguard_queue_depth", {"queue": "default"}) is None


# -- jobguard_status -----------------------------------------------------------------------


def status(*args: str) -> str:
    out = StringIO()
    call_command("jobguard_status", *args, stdout=out)
    return out.getvalue()


def test_status_table_shows_every_column_per_queue_and_a_total():
    scenario()
    lines = status().splitlines()
    assert lines[0].startswith("jobguard queues at ")
    assert lines[1].split() == [
        "QUEUE",
        "DEPTH",
        "SCHEDULED",
        "IN-FLIGHT",
        "OLDEST",
        "AGE",
        "DLQ",
        "PENDING",
        "APPROVAL",
        "PAUSED",
        "OK",
        "1H",
        "FAILED",
        "1H",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == {"default", "emails", "reports", "slow", "(all)"}
    assert rows["default"][:3] == ["3", "2", "1"]
    assert rows["default"][3].startswith("5m")  # 300 s and a little
    assert rows["default"][4:] == ["3", "1", "-", "2", "0"]
    assert rows["emails"] == ["0", "1", "1", "0s", "0", "0", "-", "0", "1"]
    assert rows["(all)"][:3] == ["3", "3", "2"] and rows["(all)"][4:] == ["4", "2", "0", "2", "1"]


def test_status_json_has_the_same_numbers_for_scripts():
    scenario()
    document = json.loads(status("--json"))
    assert datetime.datetime.fromisoformat(document["generated_at"])
    default = next(row for row in document["queues"] if row["queue"] == "default")
    assert {k: v for k, v in default.items() if k != "oldest_age_seconds"} == {
        "queue": "default",
        "depth": 3,
        "scheduled": 2,
        "waiting_for_retry": 0,
        "in_flight": 1,
        "stuck": 0,
        "dead_letters": 3,
        "pending_approvals": 1,
        "paused": False,
        "succeeded_last_hour": 2,
        "failed_last_hour": 0,
    }


def test_status_watch_refreshes_until_the_count():
    job("default")
    out = status("--watch", "0.01", "--count", "3", "--json")
    documents = [json.loads(line) for line in out.splitlines()]
    assert len(documents) == 3
    assert all(doc["queues"][0]["depth"] == 1 for doc in documents)
    assert status("--watch", "0.01", "--count", "2").count("QUEUE") == 2


def test_status_rejects_bad_options_with_a_clear_message():
    with pytest.raises(CommandError, match="--count only applies with --watch"):
        status("--count", "2")
    with pytest.raises(CommandError, match="'elsewhere': no such database alias"):
        status("--database", "elsewhere")
    with pytest.raises(CommandError, match="argument --watch: must be more than 0 seconds, not 0"):
        status("--watch", "0")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (3599, "59m59s"), (3600, "1h00m"), (90000, "1d01h")],
)
def test_ages_print_short(seconds, text):
    assert format_age(seconds) == text


def plan_of(sql: str, params=None) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_recent_outcomes_and_pruning_read_the_partial_finished_index():
    # The (status, finished_at) index holds finished rows only (migration 0005); the queries
    # that need it must still be able to use it.
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    from django_jobguard.maintenance.retention import prunable_jobs

    scenario()
    with CaptureQueriesContext(connection) as ctx:
        stats.queue_stats(recent=True)
    recent_sql = ctx.captured_queries[-1]["sql"]
    assert "finished_at" in recent_sql
    assert "jobguard_job_finished_idx" in plan_of(recent_sql)
    sql, params = prunable_jobs("default", timezone.now()).query.sql_with_params()
    assert "jobguard_job_finished_idx" in plan_of(sql, params)


def test_oldest_due_ages_take_each_queues_earliest_due_job_over_every_priority():
    # Earliest-first in each (queue, priority): what the PostgreSQL skip scan reads.
    rows = [
        ("default", 0, -300),
        ("default", 0, -10),
        ("default", 5, -60),
        ("default", -5, -900),  # the oldest of "default", at its lowest priority
        ("emails", 3, 600),  # scheduled: not due, and first of its pair
        ("emails", 0, -30),
        ("emails", -2, 120),
        ("later", 0, 60),  # nothing due in "later"
    ]
    for queue, priority, seconds in rows:
        Job.objects.filter(pk=job(queue, seconds=seconds).pk).update(priority=priority)
    job("running", "running", seconds=-500)  # a running job is not waiting
    ages = stats.oldest_due_ages()
    assert sorted(ages) == ["default", "emails"]
    # A second of slack below: SQLite's clock has millisecond steps, Python's does not, so a
    # job made 30 s due can read 29.999998 s old. The next candidate of "default" is 300 s old.
    assert 899 <= ages["default"] < 960
    assert 29 <= ages["emails"] < 90


def test_status_names_the_workers_that_stopped_beating():
    from django_jobguard.models import WorkerBeat

    now = timezone.now()
    for worker_id, age in (("live-1", 1), ("cut-off", 40), ("gone-long-ago", 7200)):
        WorkerBeat.objects.create(
            worker_id=worker_id,
            host="h",
            pid=1,
            queues="*",
            concurrency=1,
            started_at=now - datetime.timedelta(seconds=age + 60),
            last_beat_at=now - datetime.timedelta(seconds=age),
        )
    first_line = status().splitlines()[0]
    assert "; workers: 1 live, 1 not beating (killed, frozen or cut off from the database): cut-off (4" in (
        first_line
    )
    document = json.loads(status("--json"))
    assert document["workers"]["live"] == ["live-1"]
    [stale] = document["workers"]["stale"]
    assert stale["worker_id"] == "cut-off" and 40 <= stale["seconds_since_beat"] < 50
