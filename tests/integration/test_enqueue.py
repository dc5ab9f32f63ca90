import datetime

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_jobguard import IdempotencyConflict, InvalidArgumentsError
from django_jobguard.models import Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_enqueue_returns_the_stored_job_with_resolved_options():
    job = tasks.add.enqueue(1, b=2)
    job.refresh_from_db()
    assert job.task_name == "tests.testapp.tasks.add"
    assert job.queue_name == "default"
    assert (job.args, job.kwargs) == ([1], {"b": 2})
    assert job.status == "queued"
    assert job.visibility_timeout == 30  # from JOBGUARD["QUEUES"]["default"] in tests/settings.py
    assert job.max_attempts == 5
    assert job.run_after is not None and job.enqueued_at is not None


def test_task_options_win_over_queue_options():
    job = tasks.short_lease.enqueue("m")
    assert job.visibility_timeout == 2


def test_enqueue_inside_a_rolled_back_transaction_leaves_no_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1)
        raise RuntimeError("roll back")
    assert not Job.objects.exists()


def test_arguments_that_do_not_bind_raise_and_write_nothing():
    with pytest.raises(InvalidArgumentsError, match="missing a required argument: 'a'"):
        tasks.add.enqueue(b=1)
    assert not Job.objects.exists()


def test_non_json_arguments_name_the_offending_part_and_write_nothing():
    with pytest.raises(
        InvalidArgumentsError, match=r"kwargs\['b'\]: datetime.datetime is not JSON-serialisable"
    ):
        tasks.add.enqueue(1, b=timezone.now())
    with pytest.raises(InvalidArgumentsError, match=r"args\[0\]\['k'\]\[1\]"):
        tasks.add.enqueue({"k": [1, {2}]})
    with pytest.raises(InvalidArgumentsError, match="finite"):
        tasks.add.enqueue(float("nan"))
    assert not Job.objects.exists()


def test_using_sets_priority_queue_and_run_after():
    when = timezone.now() + datetime.timedelta(hours=1)
    job = tasks.add.using(priority=7, queue_name="fast", run_after=when).enqueue(1)
    job.refresh_from_db()
    assert (job.priority, job.queue_name) == (7, "fast")
    assert job.run_after == when


def test_run_after_as_timedelta_uses_the_database_clock():
    job = tasks.add.using(run_after=datetime.timedelta(minutes=10)).enqueue(1)
    delta = job.run_after - job.enqueued_at
    assert datetime.timedelta(minutes=9, seconds=59) < delta < datetime.timedelta(minutes=10, seconds=1)


def test_naive_run_after_is_refused():
    with pytest.raises(InvalidArgumentsError, match="aware"):
        tasks.add.using(run_after=datetime.datetime(2030, 1, 1))  # noqa: DTZ001


def test_bulk_enqueue_validates_every_call_before_writing():
    with pytest.raises(InvalidArgumentsError):
        tasks.add.bulk_enqueue([((1,), {}), ((), {})])
    assert not Job.objects.exists()
    jobs = tasks.add.bulk_enqueue([((i,), {"b": i}) for i in range(50)])
    assert len(jobs) == 50
    assert Job.objects.filter(status="queued").count() == 50


def test_claim_index_is_partial_on_queued_rows():
    with connection.cursor() as cursor:
        indexes = connection.introspection.get_constraints(cursor, "jobguard_job")
    assert "jobguard_job_due_idx" in indexes
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'jobguard_job_due_idx'")
            assert "WHERE ((status)::text = 'queued'::text)" in cursor.fetchone()[0]


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("run_after", [None, datetime.timedelta(minutes=1), "at"])
def test_the_returned_job_equals_the_stored_row_with_aware_timestamps(bulk, run_after):
    at = timezone.now() + datetime.timedelta(hours=1)
    configured = tasks.add.using(run_after=at if run_after == "at" else run_after)
    job = configured.bulk_enqueue([((1,), {})])[0] if bulk else configured.enqueue(1)
    stored = Job.objects.get(pk=job.pk)
    if run_after == "at":
        assert stored.run_after == at
    elif run_after is not None:
        assert stored.run_after > stored.enqueued_at + datetime.timedelta(seconds=59)
    assert timezone.is_aware(job.run_after) and timezone.is_aware(job.enqueued_at)
    assert (job.run_after, job.enqueued_at) == (stored.run_after, stored.enqueued_at)


def test_enqueue_exposed_takes_only_tasks_declared_api_true_and_writes_nothing_otherwise():
    from django_jobguard.enqueue import enqueue_exposed
    from django_jobguard.exceptions import TaskNotExposedError, UnknownTaskError

    with pytest.raises(TaskNotExposedError, match=r"@task\(api=True\)"):
        enqueue_exposed("tests.testapp.tasks.add", [1], {})
    with pytest.raises(UnknownTaskError, match="nope"):
        enqueue_exposed("nope", [], {})
    assert Job.objects.count() == 0
    job, created = enqueue_exposed("tests.testapp.tasks.api_add", [1], {}, idempotency_key="k", priority=4)
    again, created_again = enqueue_exposed(
        "tests.testapp.tasks.api_add", [1], {}, idempotency_key="k", priority=4
    )
    assert (created, created_again, again.pk) == (True, False, job.pk)
    with pytest.raises(IdempotencyConflict, match="priority 4"):
        enqueue_exposed("tests.testapp.tasks.api_add", [1], {}, idempotency_key="k", priority=5)
    assert Job.objects.count() == 1
