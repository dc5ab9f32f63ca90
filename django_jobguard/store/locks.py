"""The database lock back end's rows: every statement on ``jobguard_lock``, in each dialect's clock.

One row per key. Acquire is a single upsert that takes the row only if it is free or
expired and bumps the key's fencing counter in the same statement, so two owners can never
both win and the counter never repeats. A new row's counter starts at the database clock in
microseconds (as the Redis back end's does), so a key whose released row was pruned
(:func:`prune_released`) still gets a token above every one it had before. Release and
extend match the owner token and an unexpired ``expires_at``. Times are the database
clock's (the dialect's :class:`~.common.Clock`), never a worker's. An alias the in-memory
store serves keeps its lock rows there (:class:`~.memory.MemoryStore`), under the same rules.

The statements are standard SQL; acquire is each dialect's ``acquire_lock`` (``ON CONFLICT``
on PostgreSQL and SQLite, ``common.acquire_lock_on_conflict``; ``ON DUPLICATE KEY UPDATE`` on MariaDB/MySQL).
The service around them (which calls may run in a transaction, what an outage raises) is
:class:`django_jobguard.locks.db.DatabaseLock`.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from . import dialect_of, memory_store
from .common import LOCK_TABLE as TABLE
from .common import Clock

__all__ = ["TABLE", "acquire", "extend", "held", "prune_released", "release"]


def _key(alias: str) -> str:
    # "key" is a reserved word on MariaDB/MySQL: quoted the connection's way.
    return str(connections[alias].ops.quote_name("key"))


def _rows(alias: str, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else [(cursor.rowcount,)]


def acquire(alias: str, key: str, token: str, ttl: float) -> int | None:
    """Take ``key`` for ``token`` for ``ttl`` seconds if free or expired; the new fencing token, or None."""
    memory = memory_store(alias)
    if memory is not None:
        return memory.acquire_lock(key, token, ttl)
    return dialect_of(alias).acquire_lock(alias, key, token, ttl)


def release(alias: str, key: str, token: str) -> bool:
    """Free ``key`` if ``token`` holds it and it has not expired; whether it did."""
    memory = memory_store(alias)
    if memory is not None:
        return memory.release_lock(key, token)
    clock = dialect_of(alias).CLOCK
    rows = _rows(
        alias,
        f"UPDATE {TABLE} SET token = NULL, expires_at = NULL "
        f"WHERE {_key(alias)} = %s AND token = %s AND expires_at > {clock.now}",
        [key, token],
    )
    return bool(rows[0][0] == 1)


def extend(alias: str, key: str, token: str, ttl: float) -> bool:
    """Make ``key`` expire ``ttl`` seconds from now if ``token`` still holds it; whether it does.

    Inside a transaction this also locks the row until commit (PostgreSQL), so no one can
    take the lock between this check and the commit.
    """
    memory = memory_store(alias)
    if memory is not None:
        return memory.extend_lock(key, token, ttl)
    clock = dialect_of(alias).CLOCK
    rows = _rows(
        alias,
        f"UPDATE {TABLE} SET expires_at = {clock.later} "
        f"WHERE {_key(alias)} = %s AND token = %s AND expires_at > {clock.now}",
        [clock.seconds(ttl), key, token],
    )
    return bool(rows[0][0] == 1)


def held(alias: str, key: str) -> bool:
    """Whether someone holds ``key`` now (taken and not expired)."""
    memory = memory_store(alias)
    if memory is not None:
        return memory.lock_held(key)
    clock = dialect_of(alias).CLOCK
    rows = _rows(
        alias,
        f"SELECT 1 FROM {TABLE} WHERE {_key(alias)} = %s AND token IS NOT NULL AND expires_at > {clock.now}",
        [key],
    )
    return bool(rows)


def _prunable(clock: Clock) -> str:
    # Released (token NULL) and last taken long ago, or expired long ago (a holder that died
    # without releasing). A row never taken (acquired_at NULL, such as the redrive throttle's
    # row, which only carries a row lock) is kept.
    return (
        f"FROM {TABLE} WHERE (token IS NULL AND acquired_at < {clock.later}) "
        f"OR (token IS NOT NULL AND expires_at < {clock.later})"
    )


def prune_released(alias: str, older_than: float, *, dry_run: bool = False) -> int:
    """Delete the rows of locks released or expired more than ``older_than`` seconds ago; how many.

    Nothing that anyone holds goes: a held row is neither released nor expired. A key taken
    again after its row went starts a new row whose fencing counter starts above the old one's.
    """
    memory = memory_store(alias)
    if memory is not None:
        return memory.prune_locks(older_than, dry_run=dry_run)
    clock = dialect_of(alias).CLOCK
    before = clock.seconds(-older_than)
    verb = "SELECT count(*)" if dry_run else "DELETE"
    rows = _rows(alias, f"{verb} {_prunable(clock)}", [before, before])
    return int(rows[0][0])
