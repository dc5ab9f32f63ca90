"""Retries scheduled by a real worker (in this process): jitter spreads a herd, Retry-After is honoured."""

import time
from collections import Counter

import pytest

from django_jobguard.models import Job
from tests.support.dlq import run_burst
from tests.testapp import tasks_dlq

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_thousand_jobs_failing_together_do_not_all_come_back_in_the_same_second():
    tasks_dlq.fails_once_slowly.bulk_enqueue([((f"herd-{i}",), {}) for i in range(1000)])
    assert run_burst() == 0  # every job fails once; none is due again for 60 s, so the burst ends
    rows = Job.objects.values_list("status", "attempts", "run_after", "started_at")
    assert {(status, attempts) for status, attempts, _, _ in rows} == {("queued", 1)}
    # Delay each job got: base 60 s for attempt 1 plus 0-3 s of jitter (database clock both ends).
    delays = [(run_after - started).total_seconds() for _, _, run_after, started in rows]
    assert min(delays) >= 60
    # 3 s of jitter, plus the moment between a batch's claim and each job's retry (a loaded
    # machine stretches that moment; the spread below is what shows the jitter).
    assert max(delays) < 75
    per_second = Counter(int(delay) for delay in delays)
    assert set(per_second) >= {60, 61, 62}
    # Uniform jitter puts about a third in each second; without it all 1,000 would share one.
    assert max(per_second.values()) < 450, per_second
    come_back = Counter(run_after.replace(microsecond=0) for _, _, run_after, _ in rows)
    assert max(come_back.values()) < 450, come_back


def test_a_requested_delay_schedules_the_retry_that_far_ahead():
    job = tasks_dlq.rate_limited.enqueue("429", retry_after=30)
    before = time.time()
    assert run_burst() == 0
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("queued", 1)
    assert "rate limited" in job.last_error
    wait = job.run_after.timestamp() - before
    # 30 s asked, plus the schedule's jitter (0.05 s in the test settings) and the burst's run time.
    assert 30 <= wait < 35
