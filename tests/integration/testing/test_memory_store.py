"""The test kit on the in-memory store (JOBGUARD["STORE"] = "memory"): no database touched."""

from __future__ import annotations

import datetime

from django.conf import settings
from django.test import SimpleTestCase, override_settings

from django_jobguard import store
from django_jobguard.task import task
from django_jobguard.testing import JobguardTestMixin, assert_enqueued, frozen_time, refute_enqueued, run_jobs

# A retry waits a minute (the suite's own backoff is milliseconds, which a slow run could pass).
MEMORY = {**settings.JOBGUARD, "STORE": "memory", "RETRY": {"base": 60.0, "max": 300.0, "jitter": 0.0}}


@task(name="tests.integration.testing.memory.quote")
def quote(weight_grams: int) -> str:
    return f"{weight_grams / 1000 * 5:.2f}"


@task(name="tests.integration.testing.memory.flaky", max_attempts=3)
def flaky(marker: str) -> str:
    found = store.memory_store()
    assert found is not None
    attempts = sum(
        job.attempts for job in found.jobs.values() if job.fields["kwargs"].get("marker") == marker
    )
    if attempts < 2:
        raise ValueError(f"{marker}: not yet")
    return marker


@override_settings(JOBGUARD=MEMORY)
class MemoryStoreKitTests(JobguardTestMixin, SimpleTestCase):
    def setUp(self) -> None:
        super().setUp()
        memory = store.memory_store()
        assert memory is not None
        memory.clear()

    def test_assert_run_and_read_without_a_database(self) -> None:
        job = quote.enqueue(weight_grams=1200)
        assert_enqueued(quote, kwargs={"weight_grams": 1200}, status="queued")
        refute_enqueued(quote, kwargs={"weight_grams": 1})
        summary = run_jobs()
        self.assertEqual(summary.succeeded, 1)
        self.assertEqual([(j.pk, j.status, j.result) for j in summary.jobs], [(job.pk, "succeeded", "6.00")])

    def test_the_clock_moves_the_memory_store_rows(self) -> None:
        quote.using(run_after=datetime.timedelta(minutes=10)).enqueue(weight_grams=1)
        flaky.enqueue(marker="m")
        with frozen_time() as clock:
            first = run_jobs()
            self.assertEqual((first.succeeded, first.retried), (0, 1))
            clock.advance(datetime.timedelta(minutes=11))
            second = run_jobs()
        self.assertEqual(second.succeeded, 2)
        assert_enqueued(flaky, status="succeeded")
