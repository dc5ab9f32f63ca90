"""The kit's pytest fixtures (django_jobguard.testing.pytest_plugin, enabled in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from django_jobguard.models import Job
from django_jobguard.testing import JobguardKit
from tests.testapp import tasks
from tests.testapp.models import Execution


@pytest.mark.django_db
def test_the_jobguard_fixture_asserts_and_runs(jobguard: JobguardKit) -> None:
    job = tasks.record.enqueue("fixture")
    jobguard.assert_enqueued(tasks.record, kwargs={"marker": "fixture"})
    summary = jobguard.run_jobs()
    assert summary.succeeded == 1
    job.refresh_from_db()
    assert job.status == "succeeded"


@pytest.mark.django_db
@pytest.mark.jobguard(mode="inline")
def test_the_marker_picks_inline_mode(jobguard: JobguardKit) -> None:
    job = tasks.add.enqueue(4, b=5)
    job.refresh_from_db()
    assert (job.status, job.result) == ("succeeded", 9)


@pytest.mark.django_db
def test_jobguard_settings_overrides_some_keys(jobguard: JobguardKit, jobguard_settings: Any) -> None:
    jobguard_settings(RETRY={"base": 0, "max": 0, "jitter": 0})
    job = tasks.flaky.enqueue("no-backoff", failures=1)
    summary = jobguard.run_jobs()
    assert (summary.retried, summary.succeeded) == (1, 1)
    job.refresh_from_db()
    assert job.attempts == 2


@pytest.mark.django_db
def test_the_kit_in_a_block_then_manual_again(jobguard: JobguardKit) -> None:
    with jobguard.inline():
        tasks.record.enqueue("inline-block")
    tasks.record.enqueue("manual-after")
    assert list(Execution.objects.values_list("marker", flat=True)) == ["inline-block"]


@pytest.mark.processes
def test_jobguard_worker_runs_jobs_in_a_real_process(jobguard_worker: Any) -> None:
    job = tasks.add.enqueue(20, b=22)
    done = jobguard_worker.wait_until(
        lambda: Job.objects.filter(pk=job.pk, status="succeeded").exists(),
        timeout=120,
        message="the worker to run the job",
    )
    assert done
    job.refresh_from_db()
    assert job.result == 42
    assert jobguard_worker.stop() == 0


def test_a_clock_left_running_fails_the_test_at_its_teardown() -> None:
    from django_jobguard.testing import ClockLeftRunningError, active_clocks, frozen_time, pytest_plugin

    clock = frozen_time().start()
    with pytest.raises(ClockLeftRunningError, match="still running at the end of the test"):
        pytest_plugin.pytest_runtest_teardown(item=None, nextitem=None)  # type: ignore[arg-type]
    assert not clock.running
    assert active_clocks() == []
    pytest_plugin.pytest_runtest_teardown(item=None, nextitem=None)  # type: ignore[arg-type]  # none left: quiet


@pytest.mark.django_db
def test_the_kit_overrides_settings_until_the_test_ends(jobguard: JobguardKit) -> None:
    from django_jobguard.conf import get_settings

    before = get_settings().retry
    jobguard.settings(RETRY={"base": 0, "max": 0, "jitter": 0})
    assert (get_settings().retry.base, get_settings().retry.max) == (0, 0)
    tasks.flaky.enqueue("kit-settings", failures=1)
    assert jobguard.drain("default").succeeded == 1
    jobguard.close()
    assert get_settings().retry == before
