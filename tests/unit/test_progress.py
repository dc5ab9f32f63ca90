"""``context.report_progress``: what it accepts, that a report is kept in memory only, and its
writes on the in-memory store.

No database here: a call that wrote to it would fail under pytest-django's guard.
"""

import math
import time

import pytest

from django_jobguard import store
from django_jobguard.admin.jobs import job_progress_html
from django_jobguard.context import MAX_PROGRESS_MESSAGE_CHARS, JobContext
from django_jobguard.models import Job
from django_jobguard.outcome import HeldState, Succeeded
from django_jobguard.store.memory import MemoryStore
from django_jobguard.worker import pipeline
from django_jobguard.worker.completer import Completer
from django_jobguard.worker.held import Held
from django_jobguard.worker.leases import LeaseKeeper
from tests.support.factories import Clock
from tests.testapp import tasks


def running_context() -> JobContext:
    """A context as the worker makes it for a running job (no database touched by the calls)."""
    return JobContext(
        task=tasks.counts_with_progress,
        job_id=41,
        attempt=1,
        max_attempts=3,
        queue_name="default",
        _lease_token="token",  # noqa: S106 - a lease token, not a secret
    )


@pytest.mark.parametrize(
    ("done", "total", "message", "error"),
    [
        (-1, None, "", "done must be a number from 0 to 2**53"),
        ("3", None, "", "done must be a number (int or float), not str"),
        (True, None, "", "done must be a number (int or float), not bool"),
        (math.nan, None, "", "done must be a number from 0"),
        (math.inf, None, "", "done must be a number from 0"),
        (2**53 + 1, None, "", "done must be a number from 0 to 2**53"),
        (1, -2, "", "total must be a number from 0"),
        (1, "10", "", "total must be a number (int or float), not str"),
        (5, 4, "", "total (4) must be at least done (5)"),
        (1, 2, None, "message must be a str, not NoneType"),
        (
            1,
            2,
            "x" * (MAX_PROGRESS_MESSAGE_CHARS + 1),
            f"message is {MAX_PROGRESS_MESSAGE_CHARS + 1} characters",
        ),
        (1, 2, "a\x00b", "message holds a NUL character"),
        (1, 2, "a\ud800b", "message holds a lone surrogate"),
    ],
)
def test_a_report_that_cannot_be_stored_is_refused_with_a_value_error_naming_the_argument(
    done, total, message, error
):
    context = running_context()
    with pytest.raises(ValueError, match="report_progress\\(\\): ") as raised:
        context.report_progress(done, total, message)
    assert error in str(raised.value)
    assert context.reported_progress is None  # nothing kept of a refused report


def test_an_integer_too_long_to_print_is_refused_by_its_size():
    with pytest.raises(ValueError, match="not an integer of 16610 bits"):
        running_context().report_progress(10**5000)


def test_the_boundaries_are_accepted():
    context = running_context()
    context.report_progress(0)
    context.report_progress(2**53, 2**53, "x" * MAX_PROGRESS_MESSAGE_CHARS)
    context.report_progress(0.5, 1.0, "half, ünïcode ✓")
    report = context.reported_progress
    assert report is not None
    assert report.reported == 3


def test_a_tight_loop_of_reports_only_keeps_the_last_one_in_memory():
    context = running_context()
    assert context.reported_progress is None  # a handler that never reports has nothing
    for done in range(100_001):
        context.report_progress(done, 100_000, f"row {done}")
    report = context.reported_progress
    assert report is not None and report.pending
    count, value = report.snapshot()
    assert count == 100_001
    assert (value["done"], value["total"], value["message"]) == (100_000, 100_000, "row 100000")
    assert value["at"].endswith("+00:00")  # an aware ISO 8601 time, as the column stores it
    report.mark_written(count, now=5.0)
    assert not report.pending
    context.report_progress(7, 9)
    assert report.pending  # a report after the write is written again
    assert report.snapshot()[1]["message"] == ""


def test_a_detached_context_takes_reports_too():
    context = JobContext.detached(tasks.counts_with_progress)
    context.report_progress(3, 4, "called directly")
    assert context.reported_progress is not None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"timeout": -1}, "watch(): timeout must be a number of seconds of at least 0, or None; not -1"),
        ({"timeout": "soon"}, "watch(): timeout must be"),
        ({"interval": 0}, "watch(): interval must be more than 0 and at most 60.0 seconds, not 0"),
        ({"interval": 61}, "watch(): interval must be"),
    ],
)
def test_watch_refuses_a_bad_timeout_or_interval_before_reading_anything(kwargs, error):
    with pytest.raises(ValueError, match="watch\\(\\)") as raised:
        Job(pk=7).watch(**kwargs)
    assert error in str(raised.value)


def test_watch_refuses_an_unsaved_job():
    with pytest.raises(ValueError, match="the job is not saved"):
        Job().watch()


@pytest.mark.parametrize(
    ("progress", "shown"),
    [
        (None, "-"),
        ({"done": "lots"}, "-"),
        ([], "-"),
        ({"done": 3}, "3 done"),
        (
            {"done": 1500, "total": 3000, "message": "secret@example.com", "at": "2026-12-07T12:00:00+00:00"},
            "1,500 / 3,000 (50%)",
        ),
        ({"done": 0.25, "total": 1.0, "at": "not a time"}, "0.25 / 1 (25%)"),
        ({"done": 4, "total": 0}, "4 done"),
    ],
)
def test_the_console_shows_done_of_total_without_the_message(progress, shown):
    html = str(job_progress_html(progress))
    assert shown in html
    assert "secret" not in html
    if "/" in shown:
        assert "<progress " in html


def test_on_the_in_memory_store_the_pipeline_writes_the_last_report_and_the_keeper_is_fenced():
    memory = MemoryStore(now=Clock())
    with store.substitute("default", memory):
        row = {
            "task_name": tasks.counts_with_progress.name,
            "queue_name": "default",
            "args": [],
            "kwargs": {"total": 50},
            "priority": 0,
            "max_attempts": 3,
            "visibility_timeout": 30.0,
            "idempotency_key": None,
            "lock_key": "",
            "handler_version": "",
        }
        (first, _, _), (second, _, _) = store.insert_jobs("default", [row, row])
        claimed = store.claim("default", None, 2, "memory-progress")
        now = time.monotonic()
        ran, other = (
            Held(job=job, renewed_at=now, state=HeldState.RUNNING, started_at=now) for job in claimed
        )
        rt = pipeline.Runtime("default", "memory-progress", Completer("default", "memory-progress"))
        outcome = pipeline.run(ran, rt)  # no database: a query would fail this test
        assert type(outcome) is Succeeded
        assert memory.jobs[ran.job.id].progress["done"] == 50

        pipeline.make_context(rt, other, tasks.counts_with_progress)
        other.context.report_progress(7, 50, "stale")
        memory.jobs[other.job.id].lease_token = "taken-over"  # noqa: S105 - a lease token
        LeaseKeeper("default", "memory-progress").write_progress([other], now)
        assert memory.jobs[other.job.id].progress is None
        assert {first, second} == {ran.job.id, other.job.id}
