"""jobguard_tune from real runs: a worker process runs sleeps of known length, the report finds them."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_jobguard.models import Job
from django_jobguard.monitoring.tuning import recommend_timeout
from tests.testapp.tasks_checklist import sleep_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SHORT, LONG = 0.2, 1.2


def test_tune_reports_the_durations_a_real_worker_recorded(workers):
    for seconds in [SHORT] * 6 + [LONG] * 2:
        sleep_for.enqueue(seconds)
    # One job at a time, claimed one by one: no job waits in the worker after its claim,
    # so each recorded duration is its sleep plus the worker's own overhead.
    result = workers.burst("--queue", "tune", "--concurrency", "1", "--batch-size", "1")
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    jobs = list(Job.objects.filter(task_name=sleep_for.name))
    assert [job.status for job in jobs] == ["succeeded"] * 8
    for job in jobs:
        assert job.started_at is not None and job.finished_at is not None
        assert (job.finished_at - job.started_at).total_seconds() >= job.args[0]

    out = StringIO()
    # The report judges against a 1 s timeout for the queue: the long runs outlast it.
    with override_settings(JOBGUARD={"QUEUES": {"tune": {"visibility_timeout": 1}}}):
        call_command("jobguard_tune", "--json", "--queue", "tune", stdout=out)
        (queue,) = json.loads(out.getvalue())["queues"]
        (row,) = queue["tasks"]
        expected, reason = recommend_timeout(row["p99"])
    assert row["task"] == sleep_for.name
    assert row["count"] == 8
    assert row["p50"] >= SHORT
    assert row["p95"] >= LONG and row["p99"] >= LONG and row["max"] >= LONG
    assert row["p50"] <= row["p95"] <= row["p99"] <= row["max"]
    assert row["visibility_timeout"] == 1
    assert row["exceeds_timeout"] is True
    assert (row["recommended_visibility_timeout"], row["reason"]) == (expected, reason)
    assert expected >= row["p99"] + 5  # the default heartbeat margin, at the least
    assert queue["recommended_visibility_timeout"] == expected
