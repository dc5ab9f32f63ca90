"""Blind indexes: a task with encrypt=True stores its idempotency and lock keys as keyed HMACs.

Equal values still compare equal (a duplicate is refused, a lock excludes), across a key
rotation too, and an operator's search for the business value still finds the row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.urls import reverse

from django_jobguard import task
from django_jobguard.encryption import blind_indexes
from django_jobguard.encryption.indexes import INDEX_PREFIX, search_values
from django_jobguard.idempotency import fingerprint
from django_jobguard.locks import lock
from django_jobguard.models import IdempotencyKey, Job, Lock
from django_jobguard.registry import registry
from tests.api.support import BASE, as_user
from tests.support.factories import force_login
from tests.support.rotation import K1, K2, keys_restored, set_keys

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "card-4242424242424242"


@pytest.fixture(autouse=True)
def _keys() -> Iterator[None]:
    with keys_restored():
        set_keys(K1)
        yield


@pytest.fixture
def define() -> Iterator[Callable[..., Any]]:
    names: list[str] = []

    def make(name: str, **options: Any) -> Any:
        def charge(card: str, amount: int = 1) -> None: ...

        created = task(name=f"tests.blind.{name}", **options)(charge)
        names.append(created.name)
        return created

    yield make
    for name in names:
        registry.unregister(name)


def test_an_encrypting_tasks_idempotency_key_is_stored_as_its_index_and_still_dedupes(define):
    charge = define("charge", encrypt=True, idempotency_key="charge:{card}")
    first = charge.enqueue(CARD)
    again = charge.enqueue(CARD)

    assert again.pk == first.pk  # the duplicate was refused by the index
    stored = Job.objects.values_list("idempotency_key", flat=True).get(pk=first.pk)
    assert stored == blind_indexes(f"charge:{CARD}")[0] and stored.startswith(INDEX_PREFIX)
    (row,) = IdempotencyKey.objects.filter(scope=charge.name)
    assert row.key == stored
    assert CARD not in repr(list(IdempotencyKey.objects.values()))
    assert charge.enqueue("another card").pk != first.pk


def test_a_plain_task_keeps_its_keys_in_clear(define):
    charge = define("plain", idempotency_key="charge:{card}", lock="card:{card}")
    job = charge.enqueue(CARD)
    assert (job.idempotency_key, job.lock_key) == (f"charge:{CARD}", f"card:{CARD}")


def test_during_a_rotation_a_key_stored_under_the_old_key_still_refuses_the_duplicate(define):
    charge = define("rotating", encrypt=True, idempotency_key="charge:{card}")
    first = charge.enqueue(CARD)
    set_keys(K2, K1)  # k2 promoted: new indexes are k2's

    again = charge.enqueue(CARD)

    assert again.pk == first.pk
    assert IdempotencyKey.objects.filter(scope=charge.name).count() == 1
    # A value never seen before is indexed under the current key.
    other = charge.enqueue("card-new")
    assert other.idempotency_key == blind_indexes("charge:card-new")[0]


def test_an_encrypting_tasks_lock_key_is_its_index_and_a_rotation_keeps_queued_jobs_together(define):
    charge = define("locked", encrypt=True, lock="card:{card}")
    first = charge.enqueue(CARD)
    assert first.lock_key == blind_indexes(f"card:{CARD}")[0]
    assert CARD not in first.lock_key

    set_keys(K2, K1)
    second = charge.enqueue(CARD)  # first is still queued under k1's index: same lock
    assert second.lock_key == first.lock_key
    Job.objects.filter(pk__in=[first.pk, second.pk]).update(status="succeeded")
    third = charge.enqueue(CARD)  # nobody holds or waits for k1's index any more
    assert third.lock_key == blind_indexes(f"card:{CARD}")[0] != first.lock_key


def test_a_blind_lock_is_stored_as_the_index_and_excludes_the_same_value():
    with lock(f"card:{CARD}", backend="database", blind=True):
        (row,) = Lock.objects.filter(token__isnull=False)
        assert CARD not in row.key and row.key.endswith(blind_indexes(f"card:{CARD}")[0])
        other = lock(f"card:{CARD}", backend="database", blind=True, blocking=False)
        assert not other.acquire()


def test_the_fingerprint_does_not_depend_on_the_encryption_keys(define):
    # Already a keyed HMAC (SECRET_KEY), computed from the clear arguments on both sides.
    charge = define("fingerprinted", encrypt=True, idempotency_key="charge:{card}")
    before = fingerprint(charge, [CARD], {})
    set_keys(K2, K1)
    assert fingerprint(charge, [CARD], {}) == before
    assert CARD not in before


def test_search_values_are_the_value_and_its_index_under_every_key():
    set_keys(K2, K1)
    assert search_values(CARD) == [CARD, *blind_indexes(CARD)]
    assert len(search_values(CARD)) == 3
    assert search_values(blind_indexes(CARD)[0]) == [blind_indexes(CARD)[0]]  # an index as is


def test_the_console_finds_a_job_and_its_key_by_the_business_value(client, define):
    charge = define("searched", encrypt=True, idempotency_key="charge:{card}", lock="card:{card}")
    job = charge.enqueue(CARD)
    charge.enqueue("card-other")
    force_login(client, "support", "view_job", "view_idempotencykey", "view_payload")

    def found(model: str, term: str) -> int:
        response = client.get(reverse(f"admin:jobguard_{model}_changelist"), {"q": term})
        assert response.status_code == 200
        return int(response.context["cl"].result_count)

    assert found("job", f"charge:{CARD}") == 1
    assert found("job", f"card:{CARD}") == 1  # the lock key
    assert found("idempotencykey", f"charge:{CARD}") == 1
    assert found("job", "charge:card-4242") == 0  # whole values only, as before
    set_keys(K2, K1)
    assert found("job", f"charge:{CARD}") == 1  # indexed under k1, found during the rotation
    assert Job.objects.get(pk=job.pk).idempotency_key != f"charge:{CARD}"


def test_the_lock_list_finds_a_blind_lock_by_the_business_value(client):
    force_login(client, "support", "view_lock")

    def found(term: str) -> int:
        response = client.get(reverse("admin:jobguard_lock_changelist"), {"q": term})
        assert response.status_code == 200
        return int(response.context["cl"].result_count)

    with lock(f"card:{CARD}", backend="database", blind=True), lock("plain:7", backend="database"):
        assert found(f"card:{CARD}") == 1
        assert found("plain:7") == 1  # a key stored in clear, as before
        assert found("card:card-other") == 0
        set_keys(K2, K1)
        assert found(f"card:{CARD}") == 1  # indexed under k1, found during the rotation


def test_the_api_filters_jobs_by_the_clear_idempotency_key_of_an_encrypting_task(define):
    charge = define("api_keyed", encrypt=True, idempotency_key="charge:{card}")
    job = charge.enqueue(CARD)
    charge.enqueue("card-other")
    client, _ = as_user("reader", "view_job", "view_payload")

    def ids(key: str) -> list[int]:
        response = client.get(BASE + "jobs/", {"idempotency_key": key})
        assert response.status_code == 200
        return [row["id"] for row in response.json()["results"]]

    assert ids(f"charge:{CARD}") == [job.pk]
    assert ids(Job.objects.get(pk=job.pk).idempotency_key) == [job.pk]  # the index itself, as stored
    assert ids("charge:card-4242") == []
    set_keys(K2, K1)
    assert ids(f"charge:{CARD}") == [job.pk]
