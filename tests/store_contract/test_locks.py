"""The store contract, for the database lock back end's rows (``store.locks``), on the database under
test and on the in-memory store (``rows``).

The service around these statements (transactions, outages, blocking) is tested in
``tests/integration/locks/test_locks.py``; here only what every dialect's statements must do.
"""

import datetime

import pytest
from django.utils import timezone

from django_jobguard import store
from django_jobguard.store import locks
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db

A, B = "a" * 32, "b" * 32


def _age(rows, key: str, **fields: datetime.timedelta) -> None:
    """Move the row's times into the past."""
    rows.update_lock(key, **{name: timezone.now() - ago for name, ago in fields.items()})


def test_acquire_takes_a_free_key_once_and_release_needs_the_owner_token(rows):
    first = locks.acquire("default", "k", A, 30)
    assert isinstance(first, int)
    assert locks.acquire("default", "k", B, 30) is None
    assert locks.held("default", "k")
    assert not locks.release("default", "k", B)
    assert locks.release("default", "k", A)
    assert not locks.held("default", "k")
    assert not locks.release("default", "k", A)
    assert locks.acquire("default", "k", B, 30) == first + 1


def test_an_expired_lock_is_free_and_its_old_owner_can_neither_extend_nor_release_it(rows):
    first = locks.acquire("default", "k", A, 30)
    _age(rows, "k", expires_at=datetime.timedelta(seconds=1))
    assert not locks.held("default", "k")
    assert not locks.extend("default", "k", A, 30)
    assert locks.acquire("default", "k", B, 30) == first + 1
    assert not locks.release("default", "k", A)
    assert locks.extend("default", "k", B, 60)
    row = rows.lock("k")
    assert row.expires_at > timezone.now() + datetime.timedelta(seconds=50)


def test_a_new_rows_fencing_token_starts_from_the_database_clock(rows):
    # So a key whose row was pruned never hands out a token it handed out before.
    token = locks.acquire("default", "k", A, 30)
    now = timezone.now().timestamp() * 1_000_000
    assert now - 120_000_000 < token <= now + 60_000_000


def test_prune_released_deletes_only_rows_released_or_expired_long_ago(rows):
    for key in ("released-old", "released-new", "expired-old", "held"):
        locks.acquire("default", key, A, 30)
    locks.release("default", "released-old", A)
    locks.release("default", "released-new", A)
    _age(rows, "released-old", acquired_at=datetime.timedelta(days=2))
    _age(rows, "expired-old", acquired_at=datetime.timedelta(days=2), expires_at=datetime.timedelta(days=2))
    _age(rows, "held", acquired_at=datetime.timedelta(days=2))  # held for long, and still held
    rows.add_lock_row("never-taken")  # a row only for its row lock (the redrive throttle's)
    day = 24 * 3600
    assert locks.prune_released("default", day, dry_run=True) == 2
    assert len(rows.lock_keys()) == 5
    assert locks.prune_released("default", day) == 2
    assert rows.lock_keys() == {"released-new", "held", "never-taken"}
    assert locks.held("default", "held")


def test_a_key_taken_again_after_its_row_was_pruned_gets_a_greater_fencing_token(rows):
    locks.acquire("default", "k", A, 30)
    for _ in range(3):
        rows.update_lock("k", token=None, expires_at=None)
        last = locks.acquire("default", "k", A, 30)
    locks.release("default", "k", A)
    _age(rows, "k", acquired_at=datetime.timedelta(days=2))
    assert locks.prune_released("default", 3600) == 1
    # A new row's counter starts at the database clock in microseconds: once that clock is past
    # the old counter (the row's start plus the acquires counted since), the new token is greater.
    wait_for(
        lambda: int(store.database_now("default").timestamp() * 1_000_000) > last,
        timeout=30,
        message="the database clock to pass the pruned row's last token",
    )
    assert locks.acquire("default", "k", B, 30) > last
