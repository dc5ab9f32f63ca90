"""Reported progress (``store.write_progress``): written under each job's lease, on every store."""

import pytest

from django_jobguard import store
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def report(done: int) -> dict:
    return {"done": done, "total": 10, "message": f"step {done}", "at": "2026-12-07T12:00:00+00:00"}


def test_progress_reports_are_written_under_each_jobs_lease_in_one_call(rows):
    for n in range(3):
        tasks.add.enqueue(n)
    a, b, c = store.claim("default", None, 3, "test-worker")
    assert store.write_progress("default", [(a.id, a.lease_token, report(1))]) == 1
    written = store.write_progress(
        "default",
        [(b.id, b.lease_token, report(2)), (c.id, "0" * 32, report(3)), (a.id, a.lease_token, report(4))],
    )
    assert written == 2  # c's token is not the current one: its row is left alone
    assert [rows.job(job.id).progress for job in (a, b, c)] == [report(4), report(2), None]
    # A finished job takes no more reports, even with its last token.
    assert store.complete("default", a.id, a.lease_token, "1")
    assert store.write_progress("default", [(a.id, a.lease_token, report(9))]) == 0
    assert rows.job(a.id).progress == report(4)
