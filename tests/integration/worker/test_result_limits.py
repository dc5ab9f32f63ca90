"""A task's return value over its size limit, or not JSON, is refused at the handler's return:
the job is dead-lettered as permanent with the reason stored, and nothing of the value is
stored. Run by a worker in this process."""

import json

import pytest
from django.conf import settings
from django.db.models.functions import Now
from django.test import override_settings

from django_jobguard import Batch, task
from django_jobguard.models import DeadLetter, Job
from tests.support.dlq import run_burst
from tests.testapp import tasks_results
from tests.testapp.models import LedgerEntry

pytestmark = [
    pytest.mark.django_db(transaction=True),
]


@task(name="tests.integration.worker.result_limits.text")
def text(size: int) -> str:
    """A result of ``size`` characters (its JSON: two more, the quotes)."""
    return "x" * size


@task(name="tests.integration.worker.result_limits.text_small_limit", max_result_bytes=100)
def text_small_limit(size: int) -> str:
    """The same with its own limit of 100 bytes."""
    return "x" * size


@task(name="tests.integration.worker.result_limits.writes_then_returns", atomic=True)
def writes_then_returns(marker: str, size: int) -> str:
    """Atomic: a ledger write, then a result of ``size`` characters."""
    LedgerEntry.objects.create(effect_key=marker)
    return "x" * size


@task(name="tests.integration.worker.result_limits.returns_set")
def returns_set() -> object:
    """A result that is not JSON."""
    return {1, 2}


def result_limit(size: int):
    return override_settings(JOBGUARD={**settings.JOBGUARD, "MAX_RESULT_BYTES": size})


def dead_letter_of(job: Job) -> DeadLetter:
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result) == ("dead", 1, None)
    return DeadLetter.objects.get(job=job)


@result_limit(1000)
def test_a_result_over_the_limit_fails_the_job_as_permanent_and_stores_nothing_of_it():
    at_limit = text.enqueue(998)  # 1000 bytes with its quotes
    over = text.enqueue(999)
    run_burst()
    at_limit.refresh_from_db()
    assert (at_limit.status, len(json.dumps(at_limit.result))) == ("succeeded", 1000)
    letter = dead_letter_of(over)
    assert (letter.reason, letter.category, letter.error_class) == (
        "invalid_result",
        "permanent",
        "ValueError",
    )
    assert letter.error_message.startswith(
        "return value takes 1,001 bytes as JSON, more than the limit of 1,000 bytes "
        '(JOBGUARD["MAX_RESULT_BYTES"]); nothing of it was stored.'
    )


def test_a_task_s_own_result_limit_comes_before_the_setting():
    job = text_small_limit.enqueue(200)
    run_burst()
    letter = dead_letter_of(job)
    assert "more than the limit of 100 bytes (@task(max_result_bytes=...) of " in letter.error_message


@result_limit(50)
def test_an_atomic_task_s_writes_roll_back_with_a_result_over_the_limit():
    job = writes_then_returns.enqueue("atomic-big", 100)
    run_burst()
    assert dead_letter_of(job).reason == "invalid_result"
    assert not LedgerEntry.objects.filter(effect_key="atomic-big").exists()


def test_a_result_that_is_not_json_fails_the_job_as_permanent_with_the_reason_stored():
    job = returns_set.enqueue()
    run_burst()
    letter = dead_letter_of(job)
    assert (letter.reason, letter.category, letter.error_class) == (
        "invalid_result",
        "permanent",
        "TypeError",
    )
    assert letter.get_reason_display() == "return value refused (not JSON, or too large)"
    assert "return value" in letter.error_message and "set" in letter.error_message


@result_limit(20)
def test_a_member_over_the_limit_is_marked_failed_in_its_callbacks_results():
    Batch(on_complete=tasks_results.collect.s("limits").receives_results("results")).enqueue(
        [text.s(3), text.s(50)]
    )
    for _ in range(5):  # the last member's ack enqueues the callback after a burst may have ended
        Job.objects.filter(status="queued").update(run_after=Now())
        run_burst()
    # The callback's own result is over the limit too: read what it was given.
    callback = Job.objects.get(task_name=tasks_results.collect.name, workflow_id__isnull=True)
    small, big = callback.kwargs["results"]
    assert small == "xxx"
    assert (big["status"], big["jobguard_failed"]) == ("dead", True)
    assert "more than the limit of 20 bytes" in big["error"]
