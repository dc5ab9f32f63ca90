"""The store contract, for keys: two keys are one only when they are the same string.

On every database, as on PostgreSQL: keys that differ only by a trailing space, by case or
by an accent are different idempotency keys, lock keys, concurrency slots, rate budgets and
queues. MariaDB's and MySQL's default collations ignore case and accents, and their
``utf8mb4_bin`` still compares with PAD SPACE (``'alice' = 'alice '``); the key columns
must use a NO PAD binary collation there (migration 0022).
"""

import datetime

import pytest
from django.utils import timezone

from django_jobguard import store
from django_jobguard.registry import registry
from django_jobguard.store import locks
from tests.testapp import tasks, tasks_flow

BASE = "rene"
#: Each variant differs from BASE in one way only.
VARIANTS = {"trailing-space": "rene ", "case": "RENE", "accent": "rené"}
variant = pytest.mark.parametrize("other", list(VARIANTS.values()), ids=list(VARIANTS))


def _claim(limit: int = 30) -> list[store.ClaimedJob]:
    return store.claim("default", None, limit, "test-worker", flow=registry.flow_plan())


@variant
@pytest.mark.django_db
def test_idempotency_keys_that_differ_only_so_are_different_keys(rows, other):
    first = tasks.add.using(idempotency_key=f"welcome:{BASE}").enqueue(1)
    second = tasks.add.using(idempotency_key=f"welcome:{other}").enqueue(1)
    assert second.pk != first.pk  # not dropped as a duplicate of the first
    assert tasks.add.using(idempotency_key=f"welcome:{other}").enqueue(1).pk == second.pk
    assert tasks.add.using(idempotency_key=f"welcome:{BASE}").enqueue(1).pk == first.pk
    assert sorted(key.key for key in rows.keys()) == sorted([f"welcome:{BASE}", f"welcome:{other}"])
    assert rows.job(second.pk).idempotency_key.endswith(f"welcome:{other}")


@variant
@pytest.mark.django_db
def test_idempotency_scopes_that_differ_only_so_are_different_scopes(rows, other):
    expires = timezone.now() + datetime.timedelta(hours=1)
    assert store.insert_key("default", BASE, "k", "a" * 64, expires_at=expires) is not None
    assert store.key_owner("default", other, "k") is None
    assert store.insert_key("default", other, "k", "b" * 64, expires_at=expires) is not None
    assert store.insert_key("default", other, "k", "b" * 64, expires_at=expires) is None


@variant
@pytest.mark.django_db
def test_lock_keys_that_differ_only_so_are_different_locks(rows, other):
    assert locks.acquire("default", f"tenant:{BASE}", "a" * 32, 30) is not None
    assert not locks.held("default", f"tenant:{other}")
    assert locks.acquire("default", f"tenant:{other}", "b" * 32, 30) is not None
    assert not locks.release("default", f"tenant:{other}", "a" * 32)
    assert locks.release("default", f"tenant:{other}", "b" * 32)
    assert locks.held("default", f"tenant:{BASE}")


@variant
@pytest.mark.django_db
def test_queue_names_that_differ_only_so_are_different_queues(rows, other):
    held = tasks.add.using(queue_name=f"mail-{BASE}").enqueue(1)
    free = tasks.add.using(queue_name=f"mail-{other}").enqueue(2)
    rows.pause(f"mail-{BASE}")
    assert [job.id for job in store.claim("default", None, 5, "w")] == [free.pk]
    assert store.claim("default", [f"mail-{other}"], 5, "w") == []
    rows.resume(f"mail-{BASE}")
    assert [job.id for job in store.claim("default", [f"mail-{BASE}"], 5, "w")] == [held.pk]


# Outside a test's transaction, as a worker claims (see test_flow.py).
@variant
@pytest.mark.django_db(transaction=True)
def test_concurrency_keys_that_differ_only_so_have_their_own_slots(rows, flow_tasks, other):
    full = [tasks_flow.per_account.enqueue(BASE, 0) for _ in range(3)]
    assert [job.id for job in _claim()] == [full[0].id, full[1].id]  # BASE's two slots
    # BASE is full now: its jobs wait, and the other key's two slots are free.
    others = [tasks_flow.per_account.enqueue(other, 0) for _ in range(3)]
    assert [job.id for job in _claim()] == [others[0].id, others[1].id]
    assert _claim() == []
    assert rows.job(full[2].id).status == "queued"


@variant
@pytest.mark.django_db(transaction=True)
def test_rate_keys_that_differ_only_so_have_their_own_budgets(rows, flow_tasks, other):
    spent = [tasks_flow.per_partner.enqueue(BASE) for _ in range(2)]
    assert [job.id for job in _claim()] == [job.id for job in spent]  # BASE's burst of 2
    others = [tasks_flow.per_partner.enqueue(other) for _ in range(2)]
    assert [job.id for job in _claim()] == [job.id for job in others]  # the other key's own burst
    assert sorted(key for key in rows.rate_keys() if key.startswith("r:")) == sorted(
        f"r:{tasks_flow.per_partner.name}|partner:{partner}" for partner in (BASE, other)
    )
