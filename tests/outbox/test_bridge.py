"""The bridge to a jobs database of its own: enqueue_via_outbox() in the application's
transaction, and the "jobs" destination that makes each message one job (Relay.drain here).

The jobs live in the "jobs" database (JOBGUARD["DATABASE_ALIAS"]), the outbox in "default"
(OUTBOX["DATABASE_ALIAS"]), as a project running its jobs in their own database sets them.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_jobguard import enqueue_via_outbox
from django_jobguard.conf import get_settings
from django_jobguard.exceptions import (
    InvalidArgumentsError,
    InvalidPublishError,
    UnknownDestinationError,
    UnknownTaskError,
)
from django_jobguard.models import Job, OutboxMessage
from django_jobguard.outbox import publish
from django_jobguard.outbox.destinations.jobs import JobsDestination, key_for
from django_jobguard.outbox.relay import Relay, message_envelope
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "jobs"])

ZERO = {"base": 0.0, "max": 0.0, "jitter": 0.0}


def bridge_settings(base: dict[str, Any], **destination: Any) -> dict[str, Any]:
    """JOBGUARD with the jobs in "jobs" and the outbox, with its "jobs" destination, in "default"."""
    return {
        **base,
        "DATABASE_ALIAS": "jobs",
        "OUTBOX": {
            "DATABASE_ALIAS": "default",
            "DESTINATIONS": {"jobs": {"BACKEND": "jobs", "RETRY": ZERO, **destination}},
        },
    }


@pytest.fixture
def bridge(settings: Any) -> Iterator[None]:
    with override_settings(JOBGUARD=bridge_settings(settings.JOBGUARD)):
        conf = get_settings()
        assert (conf.database_alias, conf.outbox_alias) == ("jobs", "default")
        yield


def _relay() -> Relay:
    return Relay(get_settings().outbox_alias, "test-bridge")


def _jobs(**filters: Any) -> list[Job]:
    return list(Job.objects.using("jobs").filter(**filters).order_by("pk"))


def test_a_committed_call_becomes_one_job_in_the_jobs_database(bridge: None) -> None:
    with transaction.atomic(using="default"):
        message = enqueue_via_outbox(tasks.add, 2, b=3)

    # Written in the application's database, with the application's transaction; no job yet.
    assert OutboxMessage.objects.using("default").filter(pk=message.pk).exists()
    assert not OutboxMessage.objects.using("jobs").exists()
    assert _jobs() == []
    assert message.destination == "jobs"
    assert message.payload == {"task": "tests.testapp.tasks.add", "args": [2], "kwargs": {"b": 3}}

    assert _relay().drain() == 1

    (job,) = _jobs()
    assert (job.task_name, job.args, job.kwargs, job.status) == (
        "tests.testapp.tasks.add",
        [2],
        {"b": 3},
        "queued",
    )
    assert job.idempotency_key == key_for(str(message.message_id)) == f"outbox:{message.message_id}"
    assert not Job.objects.using("default").exists()  # the application's database holds no job
    assert OutboxMessage.objects.using("default").get(pk=message.pk).state == "delivered"
    assert _relay().drain() == 0
    assert len(_jobs()) == 1


def test_a_rolled_back_transaction_leaves_no_message_and_no_job(bridge: None) -> None:
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic(using="default"):
        enqueue_via_outbox(tasks.add, 1)
        assert OutboxMessage.objects.using("default").count() == 1  # inside the transaction
        raise Rollback

    assert not OutboxMessage.objects.using("default").exists()
    assert _relay().drain() == 0
    assert _jobs() == []


def test_a_message_sent_again_after_its_job_was_stored_makes_no_second_job(bridge: None) -> None:
    message = enqueue_via_outbox(tasks.add, 4)
    # The relay's send committed the job, then the relay died before recording the delivery:
    # the message is still pending, so the next relay sends it again, with the same id.
    JobsDestination("jobs").send(message_envelope(message))
    (first,) = _jobs()
    assert OutboxMessage.objects.get(pk=message.pk).state == "pending"

    assert _relay().drain() == 1

    assert [job.pk for job in _jobs()] == [first.pk]
    assert OutboxMessage.objects.get(pk=message.pk).state == "delivered"


def test_a_finished_job_is_not_made_again_by_a_late_resend(bridge: None) -> None:
    message = enqueue_via_outbox(tasks.add, 5)
    JobsDestination("jobs").send(message_envelope(message))
    Job.objects.using("jobs").update(status="succeeded", finished_at=timezone.now())

    assert _relay().drain() == 1

    assert [(job.status, job.args) for job in _jobs()] == [("succeeded", [5])]


def test_each_call_is_its_own_job_even_with_the_same_arguments(bridge: None) -> None:
    with transaction.atomic(using="default"):
        messages = [enqueue_via_outbox(tasks.add, 1) for _ in range(3)]

    assert _relay().drain() == 3

    assert sorted(str(job.idempotency_key) for job in _jobs()) == sorted(
        f"outbox:{message.message_id}" for message in messages
    )


def test_the_calls_options_reach_the_job(bridge: None) -> None:
    later = timezone.now() + datetime.timedelta(days=2)
    message = enqueue_via_outbox(tasks.add.using(priority=7, queue_name="bridge-q", run_after=later), 1, 2)
    delayed = enqueue_via_outbox(tasks.add.using(run_after=datetime.timedelta(hours=1)), 3)
    keyed = enqueue_via_outbox(tasks.add.using(idempotency_key="sum:3"), 3)

    assert _relay().drain() == 3

    job = _jobs(idempotency_key=f"outbox:{message.message_id}")[0]
    assert (job.priority, job.queue_name, job.run_after) == (7, "bridge-q", later)
    job = _jobs(idempotency_key=f"outbox:{delayed.message_id}")[0]
    published = OutboxMessage.objects.get(pk=delayed.pk).published_at
    assert job.run_after == published + datetime.timedelta(hours=1)
    assert (job.priority, job.queue_name) == (0, "default")
    assert [job.args for job in _jobs(idempotency_key="sum:3")] == [[3]]
    assert OutboxMessage.objects.get(pk=keyed.pk).payload["key"] == "sum:3"


def test_a_task_with_a_key_template_keeps_its_key_and_dedupes_with_it(bridge: None) -> None:
    first = enqueue_via_outbox(tasks.api_charge, order_id=9)
    second = enqueue_via_outbox(tasks.api_charge, order_id=9)

    assert _relay().drain() == 2

    (job,) = _jobs(task_name="tests.testapp.tasks.api_charge")
    assert job.idempotency_key == "charge:order:9"
    states = set(OutboxMessage.objects.filter(pk__in=[first.pk, second.pk]).values_list("state", flat=True))
    assert states == {"delivered"}


def test_an_unregistered_task_is_refused_before_anything_is_written(bridge: None) -> None:
    gone = dataclasses.replace(tasks.add, name="tests.testapp.tasks.gone")

    with pytest.raises(UnknownTaskError, match=r"No task is registered as 'tests\.testapp\.tasks\.gone'"):
        enqueue_via_outbox(gone, 1)
    with pytest.raises(InvalidPublishError, match="takes a task"):
        enqueue_via_outbox(tasks.add.func, 1)  # type: ignore[arg-type]

    assert not OutboxMessage.objects.exists()


def test_a_call_the_task_would_refuse_is_refused_before_anything_is_written(bridge: None) -> None:
    with pytest.raises(InvalidArgumentsError, match="missing a required argument: 'a'"):
        enqueue_via_outbox(tasks.add, b=1)
    with pytest.raises(InvalidArgumentsError, match="not JSON"):
        enqueue_via_outbox(tasks.add, object())
    with pytest.raises(InvalidPublishError, match=r"does not take using\(after=\.\.\.\)"):
        enqueue_via_outbox(tasks.add.using(after=[1]), 1)

    assert not OutboxMessage.objects.exists()


def test_it_needs_exactly_one_jobs_destination(settings: Any) -> None:
    base = bridge_settings(settings.JOBGUARD)
    none = {**base, "OUTBOX": {**base["OUTBOX"], "DESTINATIONS": {}}}
    with override_settings(JOBGUARD=none), pytest.raises(UnknownDestinationError, match=r"\(none declared\)"):
        enqueue_via_outbox(tasks.add, 1)
    two = {**base["OUTBOX"]["DESTINATIONS"], "more-jobs": {"BACKEND": "jobs"}}
    with (
        override_settings(JOBGUARD={**base, "OUTBOX": {**base["OUTBOX"], "DESTINATIONS": two}}),
        pytest.raises(UnknownDestinationError, match=r"\(2: jobs, more-jobs declared\)"),
    ):
        enqueue_via_outbox(tasks.add, 1)
    assert not OutboxMessage.objects.exists()


def _dead_after_drain(message: OutboxMessage) -> OutboxMessage:
    _relay().drain()
    stored = OutboxMessage.objects.get(pk=message.pk)
    assert stored.state == "dead", stored.last_error
    assert _jobs() == []
    return stored


def test_a_payload_that_no_longer_binds_the_task_is_dead_with_its_reason(bridge: None) -> None:
    message = enqueue_via_outbox(tasks.add, 1)
    # A deploy between publish and delivery renamed the task's parameter.
    OutboxMessage.objects.filter(pk=message.pk).update(
        payload={"task": "tests.testapp.tasks.add", "args": [], "kwargs": {"c": 1}}
    )

    stored = _dead_after_drain(message)

    assert "PermanentDeliveryError" in stored.last_error
    assert "unexpected keyword argument 'c'" in stored.last_error
    assert stored.attempts == 1  # permanent: not retried


def test_a_task_no_longer_registered_at_delivery_is_dead_with_its_reason(bridge: None) -> None:
    message = publish("jobs", {"task": "tests.testapp.tasks.renamed", "args": [1], "kwargs": {}})

    stored = _dead_after_drain(message)

    assert "task 'tests.testapp.tasks.renamed' is not registered in this worker" in stored.last_error


def test_a_payload_that_is_not_a_call_is_dead_with_its_reason(bridge: None) -> None:
    message = publish("jobs", {"event": "order.shipped"})

    stored = _dead_after_drain(message)

    assert "not a job call" in stored.last_error


def test_a_key_that_names_another_calls_job_is_dead_with_its_reason(bridge: None) -> None:
    enqueue_via_outbox(tasks.add.using(idempotency_key="k"), 1)
    assert _relay().drain() == 1
    message = enqueue_via_outbox(tasks.add.using(idempotency_key="k"), 2)

    _relay().drain()

    stored = OutboxMessage.objects.get(pk=message.pk)
    assert stored.state == "dead"
    assert "IdempotencyConflict" in stored.last_error
    assert [job.args for job in _jobs()] == [[1]]


def test_an_encrypting_tasks_arguments_are_sealed_in_the_outbox(bridge: None) -> None:
    from django_jobguard.encryption import decrypt_json
    from django_jobguard.encryption.fields import ARGS
    from tests.testapp import tasks_encrypted

    message = enqueue_via_outbox(tasks_encrypted.echo, "card 4242")

    stored = OutboxMessage.objects.get(pk=message.pk)
    assert set(stored.payload) == {"task", "sealed"}
    assert "4242" not in str(stored.payload)
    assert _relay().drain() == 1
    (job,) = _jobs()
    assert job.task_name == "tests.encrypted.echo"
    assert "4242" not in str(job.args)  # sealed in the jobs database as any enqueue seals it
    assert decrypt_json(job.args, field=ARGS) == ["card 4242"]


def test_the_jobs_destination_takes_no_options(settings: Any) -> None:
    from django_jobguard.checks.outbox import check_outbox_destinations

    with override_settings(JOBGUARD=bridge_settings(settings.JOBGUARD, URL="x")):
        (error,) = check_outbox_destinations()
    assert error.id == "jobguard.E060"
    assert "unknown option 'URL'" in error.msg


def test_an_outbox_alias_not_in_databases_is_a_check_error(settings: Any) -> None:
    from django_jobguard.checks.outbox import check_outbox_database

    base = bridge_settings(settings.JOBGUARD)
    with override_settings(JOBGUARD={**base, "OUTBOX": {**base["OUTBOX"], "DATABASE_ALIAS": "app"}}):
        (error,) = check_outbox_database()
    assert error.id == "jobguard.E065"
    assert error.msg == "JOBGUARD['OUTBOX']['DATABASE_ALIAS'] is 'app', which is not in DATABASES."
    with override_settings(JOBGUARD=base):
        assert check_outbox_database() == []


def test_enqueue_via_outbox_is_exported_from_the_package() -> None:
    import django_jobguard
    from django_jobguard import outbox

    assert django_jobguard.enqueue_via_outbox is outbox.enqueue_via_outbox is enqueue_via_outbox
    assert "enqueue_via_outbox" in django_jobguard.__all__


def test_a_test_delivers_the_calls_then_runs_their_jobs(bridge: None) -> None:
    from django_jobguard.testing import run_jobs

    with transaction.atomic(using="default"):
        message = enqueue_via_outbox(tasks.add, 20, b=22)

    assert Relay(get_settings().outbox_alias).drain() == 1
    run_jobs()

    (job,) = _jobs()
    assert (job.idempotency_key, job.status, job.result) == (f"outbox:{message.message_id}", "succeeded", 42)


def test_a_jobs_destination_beside_the_jobs_is_a_check_warning(settings: Any) -> None:
    from django_jobguard.checks.outbox import check_jobs_destination

    base = bridge_settings(settings.JOBGUARD)
    beside = {**base, "OUTBOX": {**base["OUTBOX"], "DATABASE_ALIAS": None}}
    with override_settings(JOBGUARD=beside):
        (warning,) = check_jobs_destination()
    assert warning.id == "jobguard.W068"
    assert warning.msg.startswith("Outbox destination 'jobs' makes jobs in 'jobs', and the outbox is there")
    assert "JOBGUARD['OUTBOX']['DATABASE_ALIAS']" in warning.hint
    with override_settings(JOBGUARD=base):
        assert check_jobs_destination() == []
