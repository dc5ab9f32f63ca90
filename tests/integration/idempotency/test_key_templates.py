"""@task(idempotency_key="..."): every enqueue gets its key from the arguments, and is deduped by it."""

from __future__ import annotations

import pytest

from django_jobguard import IdempotencyConflict, InvalidArgumentsError
from django_jobguard.models import IdempotencyKey, Job
from tests.support.dlq import run_burst
from tests.testapp.models import LedgerEntry
from tests.testapp.tasks_checklist import charge_by_key

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_template_gives_each_enqueue_its_key_and_repeats_return_the_first_job():
    first = charge_by_key.enqueue(order_id=7)
    again = charge_by_key.enqueue(7)  # positional: the same binding, the same key
    other = charge_by_key.enqueue(order_id=8)
    assert first.idempotency_key == "checklist:charge:7"
    assert again.pk == first.pk
    assert other.idempotency_key == "checklist:charge:8" and other.pk != first.pk
    assert Job.objects.filter(task_name=charge_by_key.name).count() == 2
    key = IdempotencyKey.objects.get(key="checklist:charge:7")
    assert (key.scope, key.job_id, key.duplicates) == (charge_by_key.name, first.pk, 1)


def test_the_same_key_with_other_arguments_is_a_conflict_and_writes_nothing():
    charge_by_key.enqueue(order_id=9, amount=1)
    with pytest.raises(IdempotencyConflict, match="checklist:charge:9"):
        charge_by_key.enqueue(order_id=9, amount=2)
    assert Job.objects.filter(task_name=charge_by_key.name).count() == 1


def test_using_overrides_the_template_for_one_call():
    job = charge_by_key.using(idempotency_key="manual:1").enqueue(order_id=7)
    assert job.idempotency_key == "manual:1"
    assert charge_by_key.enqueue(order_id=7).pk != job.pk  # the template's key is another action


def test_bulk_enqueue_keys_every_call_and_dedupes_within_the_batch():
    jobs = charge_by_key.bulk_enqueue([((1,), {}), ((2,), {}), ((1,), {})])
    assert [j.idempotency_key for j in jobs] == [
        "checklist:charge:1",
        "checklist:charge:2",
        "checklist:charge:1",
    ]
    assert jobs[0].pk == jobs[2].pk
    assert Job.objects.filter(task_name=charge_by_key.name).count() == 2


def test_a_bad_call_in_a_keyed_batch_stores_none_of_it():
    with pytest.raises(InvalidArgumentsError, match="Arguments do not fit"):
        charge_by_key.bulk_enqueue([((1,), {}), ((), {"nope": 1})])
    assert not Job.objects.filter(task_name=charge_by_key.name).exists()
    assert not IdempotencyKey.objects.exists()


def test_a_worker_runs_the_keyed_action_once():
    for _ in range(3):
        charge_by_key.enqueue(order_id=11)
    run_burst()
    assert LedgerEntry.objects.filter(effect_key="checklist:charge:11").count() == 1
    assert list(Job.objects.filter(task_name=charge_by_key.name).values_list("status", flat=True)) == [
        "succeeded"
    ]
