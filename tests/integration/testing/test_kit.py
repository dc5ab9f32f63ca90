"""The test kit (django_jobguard.testing) under a plain TestCase: each helper passes and can fail."""

from __future__ import annotations

import datetime
import threading
from unittest import mock

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase, override_settings

from django_jobguard import store, task
from django_jobguard.cache import invalidate
from django_jobguard.conf import get_settings
from django_jobguard.models import DeadLetter, Job
from django_jobguard.testing import (
    ClockLeftRunningError,
    InlineThreadError,
    JobguardKit,
    JobguardTestingError,
    JobguardTestMixin,
    assert_enqueued,
    drain,
    enqueued_jobs,
    frozen_time,
    refute_enqueued,
    run_jobs,
)
from django_jobguard.workflows import group
from tests.testapp import tasks
from tests.testapp.models import Execution


@task(name="tests.integration.testing.invalidates_key")
def invalidates_key(key: str) -> None:
    invalidate(key)


@task(name="tests.integration.testing.enqueues_child", takes_context=True)
def enqueues_child(context, marker: str) -> None:
    tasks.record_plain.enqueue(f"{marker}-child")


#: Markers of the runs of ``remembers``: a side effect no rollback takes back.
REMEMBERED: list[str] = []


@task(name="tests.integration.testing.remembers")
def remembers(marker: str) -> None:
    REMEMBERED.append(marker)


@task(name="tests.integration.testing.always_fails", max_attempts=2)
def always_fails() -> None:
    raise ValueError("down")


class AssertEnqueuedTests(JobguardTestMixin, TestCase):
    def test_a_partial_match_of_the_keyword_arguments_passes_and_returns_the_job(self) -> None:
        job = tasks.record.enqueue("a", amount=3)
        found = assert_enqueued(tasks.record, kwargs={"marker": "a"}, queue="default", status="queued")
        self.assertEqual(found.pk, job.pk)
        assert_enqueued("tests.testapp.tasks.record", kwargs={"marker": "a", "amount": mock.ANY})

    def test_a_mismatch_fails_with_what_was_enqueued_instead(self) -> None:
        tasks.record.enqueue("a", amount=3)
        tasks.add.enqueue(1, b=2)
        with self.assertRaises(AssertionError) as caught:
            assert_enqueued(tasks.record, kwargs={"marker": "b"}, queue="slow")
        message = str(caught.exception)
        asked = "kwargs={'marker': 'b'}, queue='slow'"
        self.assertIn(f"no job of tests.testapp.tasks.record with {asked} was enqueued.", message)
        self.assertIn("Enqueued instead (1 job(s) of tests.testapp.tasks.record):", message)
        self.assertIn("kwargs['marker']: expected 'b', got 'a'", message)
        self.assertIn("queue: expected 'slow', got 'default'", message)
        self.assertIn("Other tasks enqueued: tests.testapp.tasks.add (1)", message)

    def test_nothing_enqueued_says_so(self) -> None:
        with self.assertRaisesMessage(AssertionError, "Nothing was enqueued."):
            assert_enqueued(tasks.add)

    def test_count_asks_for_exactly_that_many(self) -> None:
        tasks.add.enqueue(1)
        tasks.add.enqueue(2)
        assert_enqueued(tasks.add, count=2)
        with self.assertRaisesMessage(AssertionError, "expected 1 job(s) of tests.testapp.tasks.add"):
            assert_enqueued(tasks.add, count=1)

    def test_args_and_run_after(self) -> None:
        tasks.add.using(run_after=datetime.timedelta(minutes=5)).enqueue(1, b=2)
        assert_enqueued(tasks.add, args=[1], kwargs={"b": 2}, run_after=datetime.timedelta(minutes=5))
        with self.assertRaises(AssertionError) as caught:
            assert_enqueued(tasks.add, run_after=datetime.timedelta(minutes=1))
        self.assertIn("run_after: expected", str(caught.exception))
        with self.assertRaisesMessage(AssertionError, "args: expected [2], got [1]"):
            assert_enqueued(tasks.add, args=[2])

    def test_a_task_that_is_not_registered_is_a_clear_error(self) -> None:
        with self.assertRaisesMessage(JobguardTestingError, "no task is registered as 'shop.tasks.nope'"):
            assert_enqueued("shop.tasks.nope")
        with self.assertRaisesMessage(JobguardTestingError, "expected a task (decorated with @task)"):
            refute_enqueued(print)

    def test_refute_enqueued_fails_naming_the_jobs(self) -> None:
        refute_enqueued(tasks.add)
        job = tasks.add.enqueue(5)
        refute_enqueued(tasks.add, args=[6])
        with self.assertRaisesMessage(AssertionError, f"found 1:\n  job {job.pk} tests.testapp.tasks.add"):
            refute_enqueued(tasks.add, args=[5])

    def test_enqueued_jobs_filters(self) -> None:
        first = tasks.add.enqueue(1)
        tasks.slow_record.enqueue("s", seconds=0)
        self.assertEqual([job.pk for job in enqueued_jobs(tasks.add)], [first.pk])
        self.assertEqual(len(enqueued_jobs(queue="slow")), 1)
        self.assertEqual(len(enqueued_jobs()), 2)


class RunJobsTests(JobguardTestMixin, TestCase):
    def test_due_jobs_run_in_the_test_transaction(self) -> None:
        job = tasks.record.enqueue("ran")
        summary = run_jobs()
        self.assertEqual((summary.ran, summary.succeeded, summary.failed), (1, 1, 0))
        self.assertEqual([j.pk for j in summary.jobs], [job.pk])
        job.refresh_from_db()
        self.assertEqual((job.status, job.result), ("succeeded", "ran"))
        self.assertEqual(Execution.objects.filter(marker="ran").count(), 1)
        self.assertEqual(str(run_jobs()), "ran=0 succeeded=0 retried=0 dead=0 put_back=0")

    def test_a_permanent_failure_is_dead_lettered(self) -> None:
        job = tasks.flaky.enqueue("p", failures=1, error="permanent")
        summary = run_jobs()
        self.assertEqual((summary.dead, summary.succeeded), (1, 0))
        self.assertEqual(DeadLetter.objects.get(job=job).reason, "permanent_error")

    def test_a_job_enqueued_by_a_job_runs_in_the_same_call(self) -> None:
        enqueues_child.enqueue("parent")
        summary = run_jobs()
        self.assertEqual(summary.succeeded, 2)
        self.assertTrue(Execution.objects.filter(marker="parent-child").exists())

    def test_drain_runs_one_queue(self) -> None:
        tasks.slow_record.enqueue("slow", seconds=0)
        tasks.add.enqueue(1)
        self.assertEqual(drain("slow").succeeded, 1)
        assert_enqueued(tasks.add, status="queued")
        assert_enqueued(tasks.slow_record, status="succeeded")

    def test_a_group_and_its_callback_run(self) -> None:
        group([tasks.add.s(1, b=1), tasks.add.s(2, b=2)], then=tasks.record_plain.s("group-done")).enqueue()
        summary = run_jobs()
        self.assertEqual(summary.succeeded, 3)
        self.assertTrue(Execution.objects.filter(marker="group-done").exists())

    def test_a_cache_invalidation_runs_when_the_job_commits(self) -> None:
        cache.set("testing:key", "stale")
        invalidates_key.enqueue("testing:key")
        run_jobs()
        self.assertIsNone(cache.get("testing:key"))

    def test_a_task_with_a_database_lock_runs_in_the_test_transaction(self) -> None:
        tasks.locked_interval.enqueue("res-1", hold=0)
        self.assertEqual(run_jobs().succeeded, 1)

    def test_a_job_the_pipeline_fails_on_raises_with_its_traceback(self) -> None:
        tasks.locked_interval.enqueue("res-2", hold=0)
        # Inside a transaction of the test's own, the database lock cannot be taken: a worker
        # would log job_crashed and go on; the test fails, saying why.
        with (
            self.assertRaisesMessage(
                JobguardTestingError, "the worker's pipeline failed on a job (job_crashed"
            ),
            transaction.atomic(),
        ):
            run_jobs()

    def test_a_job_that_enqueues_forever_stops_at_the_limit(self) -> None:
        for index in range(3):
            tasks.add.enqueue(index)
        with self.assertRaisesMessage(JobguardTestingError, "run_jobs() ran 2 jobs and more are still due"):
            run_jobs(limit=2)
        self.assertEqual(len(enqueued_jobs(tasks.add, status="queued")), 1)

    def test_bad_arguments_are_refused(self) -> None:
        with self.assertRaisesMessage(JobguardTestingError, "queue= or queues=, not both"):
            run_jobs(queue="a", queues=["b"])
        with self.assertRaisesMessage(JobguardTestingError, "a list of queue names"):
            run_jobs(queues="default")  # type: ignore[arg-type]


#: A retry waits a minute: the test suite's own backoff (tests/settings.py) is a few
#: milliseconds, which a loaded machine could let pass between two calls.
SLOW_RETRIES = {**settings.JOBGUARD, "RETRY": {"base": 60.0, "max": 300.0, "jitter": 0.0}}


@override_settings(JOBGUARD=SLOW_RETRIES)
class FrozenTimeTests(JobguardTestMixin, TestCase):
    def test_a_retry_runs_once_the_clock_passes_its_backoff(self) -> None:
        job = tasks.flaky.enqueue("retry", failures=1)
        with frozen_time() as clock:
            first = run_jobs()
            self.assertEqual((first.retried, first.succeeded), (1, 0))
            self.assertEqual(run_jobs().ran, 0)  # the backoff has not passed
            clock.advance(datetime.timedelta(seconds=400))
            second = run_jobs()
        self.assertEqual(second.succeeded, 1)
        job.refresh_from_db()
        self.assertEqual((job.status, job.attempts), ("succeeded", 2))
        self.assertEqual(clock.advanced, 400)

    def test_retries_run_out_into_a_dead_letter(self) -> None:
        job = always_fails.enqueue()
        with frozen_time() as clock:
            run_jobs()
            clock.advance(3600)
            self.assertEqual(run_jobs().dead, 1)
        self.assertEqual(DeadLetter.objects.get(job=job).reason, "retries_exhausted")

    def test_run_after_is_reached_by_advancing(self) -> None:
        tasks.add.using(run_after=datetime.timedelta(minutes=5)).enqueue(1)
        with frozen_time() as clock:
            self.assertEqual(run_jobs().ran, 0)
            clock.advance(290)  # ten seconds short: room for a slow machine's real time
            self.assertEqual(run_jobs().ran, 0)
            clock.advance(20)
            self.assertEqual(run_jobs().succeeded, 1)

    def test_an_expired_lease_is_reaped_and_run_again(self) -> None:
        job = tasks.record_plain.enqueue("lease")
        claimed = store.claim("default", None, 1, "crashed-worker")  # a worker that died holding it
        self.assertEqual([c.id for c in claimed], [job.pk])
        with frozen_time() as clock:
            self.assertEqual(run_jobs().ran, 0)
            clock.advance(job.visibility_timeout + 1)
            self.assertEqual(run_jobs().succeeded, 1)
        job.refresh_from_db()
        self.assertEqual((job.status, job.attempts), ("succeeded", 2))

    def test_a_schedule_ticks_once_the_clock_reaches_it(self) -> None:
        # Yearly, so the first tick cannot fall due while the test runs.
        schedules = {"new-year": {"task": tasks.noop.name, "cron": "0 0 1 1 *"}}
        with (
            override_settings(JOBGUARD={**settings.JOBGUARD, "SCHEDULES": schedules}),
            frozen_time() as clock,
        ):
            self.assertEqual(run_jobs(schedules=True).ran, 0)  # the first tick is still ahead
            clock.advance(datetime.timedelta(days=366))
            self.assertEqual(run_jobs().ran, 0)  # ticks only with schedules=True
            self.assertEqual(run_jobs(schedules=True).succeeded, 1)
        assert_enqueued(tasks.noop, status="succeeded", count=1)

    def test_misuse_is_refused(self) -> None:
        clock = frozen_time()
        with self.assertRaisesMessage(JobguardTestingError, "not running"):
            clock.advance(1)
        with clock, self.assertRaisesMessage(JobguardTestingError, "forward only"):
            clock.advance(-1)

    def test_a_clock_left_running_fails_the_test(self) -> None:
        kit = JobguardKit().start()
        frozen_time().start()
        with self.assertRaisesMessage(ClockLeftRunningError, "still running at the end of the test"):
            kit.close()


@override_settings(JOBGUARD=SLOW_RETRIES)
class InlineTests(JobguardTestMixin, TestCase):
    jobguard_mode = "inline"

    def test_a_job_enqueued_outside_a_transaction_runs_at_once(self) -> None:
        job = tasks.record.enqueue("now")
        job.refresh_from_db()
        self.assertEqual(job.status, "succeeded")

    def test_a_job_runs_when_its_transaction_commits_never_before(self) -> None:
        with transaction.atomic():
            job = tasks.record.enqueue("later")
            with transaction.atomic():
                tasks.record.enqueue("nested")
            self.assertFalse(Execution.objects.exists())  # not before the commit
        job.refresh_from_db()
        self.assertEqual(job.status, "succeeded")
        self.assertEqual(set(Execution.objects.values_list("marker", flat=True)), {"later", "nested"})

    def test_a_rolled_back_transaction_runs_nothing(self) -> None:
        REMEMBERED.clear()
        with transaction.atomic():
            remembers.enqueue("kept")
            try:
                with transaction.atomic():
                    remembers.enqueue("gone")
                    raise RuntimeError("roll the savepoint back")
            except RuntimeError:
                pass
            self.assertEqual(REMEMBERED, [])
        with transaction.atomic():
            remembers.enqueue("gone too")
            transaction.set_rollback(True)
        self.assertEqual(REMEMBERED, ["kept"])
        self.assertEqual(len(enqueued_jobs(remembers)), 1)

    def test_advancing_the_clock_runs_what_became_due(self) -> None:
        job = tasks.flaky.enqueue("inline-retry", failures=1)
        job.refresh_from_db()
        self.assertEqual((job.status, job.attempts), ("queued", 1))
        with frozen_time() as clock:
            clock.advance(400)
        job.refresh_from_db()
        self.assertEqual(job.status, "succeeded")

    def test_run_jobs_on_another_thread_is_a_clear_error(self) -> None:
        kit = self.jobguard
        errors: list[BaseException] = []

        def enqueue_elsewhere() -> None:
            try:
                run_jobs()
            except InlineThreadError as exc:
                errors.append(exc)

        thread = threading.Thread(target=enqueue_elsewhere, name="not-the-test")
        thread.start()
        thread.join()
        self.assertEqual(len(errors), 1)
        self.assertIn("on thread 'not-the-test', which the test does not own", str(errors[0]))
        self.assertTrue(kit.started)


class InlineRealCommitTests(JobguardTestMixin, TransactionTestCase):
    """Inline mode where transactions really commit (transaction=True): Django's own on_commit."""

    jobguard_mode = "inline"

    def test_a_job_runs_after_the_real_commit_and_not_after_a_rollback(self) -> None:
        REMEMBERED.clear()
        with transaction.atomic():
            remembers.enqueue("committed")
            self.assertEqual(REMEMBERED, [])
        self.assertEqual(REMEMBERED, ["committed"])
        with transaction.atomic():
            remembers.enqueue("rolled back")
            transaction.set_rollback(True)
        remembers.enqueue("autocommit")  # its statement commits at once
        self.assertEqual(REMEMBERED, ["committed", "autocommit"])


class InlineFromSettingsTests(TestCase):
    def test_the_setting_runs_jobs_inline(self) -> None:
        with override_settings(JOBGUARD={"TESTING": {"MODE": "inline"}}):
            job = tasks.add.enqueue(2, b=3)
        job.refresh_from_db()
        self.assertEqual((job.status, job.result), ("succeeded", 5))
        manual = tasks.add.enqueue(1)
        manual.refresh_from_db()
        self.assertEqual(manual.status, "queued")


class TestingModeSettingTests(TestCase):
    def test_a_mode_that_does_not_exist_names_the_key(self) -> None:
        with (
            override_settings(JOBGUARD={"TESTING": {"MODE": "eager"}}),
            self.assertRaisesMessage(
                ImproperlyConfigured,
                """JOBGUARD['TESTING']['MODE'] must be "manual" or "inline", not 'eager'.""",
            ),
        ):
            get_settings()

    def test_a_kit_refuses_an_unknown_mode(self) -> None:
        with self.assertRaisesMessage(JobguardTestingError, "mode must be"):
            JobguardKit("eager")


class InlineThreadTests(TransactionTestCase):
    def test_an_enqueue_on_a_thread_the_test_does_not_own_fails_the_test(self) -> None:
        kit = JobguardKit("inline").start()
        jobs: list[Job] = []

        def enqueue_elsewhere() -> None:
            try:
                jobs.append(tasks.add.enqueue(1))  # its own connection, committed at once
            finally:
                connection.close()

        thread = threading.Thread(target=enqueue_elsewhere, name="stray")
        thread.start()
        thread.join()
        with self.assertRaisesMessage(InlineThreadError, "on thread 'stray', which the test does not own"):
            kit.close()
        jobs[0].refresh_from_db()
        self.assertEqual(jobs[0].status, "queued")  # left for the test to run
