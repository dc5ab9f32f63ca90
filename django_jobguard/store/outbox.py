"""The outbox's SQL: a key's next sequence number, and the relay's claim of keys with work.

**Sequence numbers.** :func:`next_seq` increments the publish-side row of (destination, key)
in one upsert and returns the new number. The upsert holds the row's lock until the
publisher's transaction ends, so the publishers of one key take their numbers, and commit,
one after the other: ``seq`` order is commit order, with no gap (a rolled-back publish takes
its increment back). Publishers of other keys never wait. ``INSERT ... ON CONFLICT DO UPDATE
... RETURNING`` on PostgreSQL and SQLite (3.35+); ``ON DUPLICATE KEY UPDATE`` and a locking
read of the row on MariaDB/MySQL.

**Claims.** :func:`claim_keys` leases up to ``limit`` relay-side rows (``OutboxCursor``) of
keys with pending messages (found through the partial index of pending messages, so the cost
follows the backlog, not the table; the key whose oldest pending message is oldest first),
that no dead message holds, whose lease expired and whose retry is due. Candidates are read
without locks, then leased by one conditional ``UPDATE`` that repeats the conditions, so two
relays racing for a key cannot both win (the loser's update finds the lease taken). The same
statements on every database. Times are the database clock's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from django.db import connections

from . import dialect_of

__all__ = ["ClaimedKey", "claim_keys", "extend_lease", "next_seq", "record_delivered", "release_lease"]


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedKey:
    """A key a relay leased: where its delivery stands."""

    cursor_id: int
    destination: str
    key: str
    delivered_seq: int


def _tables() -> tuple[str, str, str]:
    from ..models import OutboxCursor, OutboxKey, OutboxMessage  # app registry: see common

    return OutboxKey._meta.db_table, OutboxCursor._meta.db_table, OutboxMessage._meta.db_table


def _q(alias: str, name: str) -> str:
    # "key" is a reserved word on MariaDB/MySQL: quoted the connection's way everywhere.
    return str(connections[alias].ops.quote_name(name))


def next_seq(alias: str, destination: str, key: str) -> int:
    """Take the next sequence number of (destination, key); call inside the publishing transaction.

    A key's first publish also creates its relay-side row (``OutboxCursor``), in the same
    transaction: the relay only ever updates it, and never writes the publish-side row.
    """
    key_table, cursor_table, _ = _tables()
    k = _q(alias, "key")
    with connections[alias].cursor() as cursor:
        if connections[alias].vendor == "mysql":
            cursor.execute(
                f"INSERT INTO {key_table} (destination, {k}, last_seq) VALUES (%s, %s, 1) "
                "ON DUPLICATE KEY UPDATE last_seq = last_seq + 1",
                [destination, key],
            )
            cursor.execute(
                f"SELECT last_seq FROM {key_table} WHERE destination = %s AND {k} = %s FOR UPDATE",
                [destination, key],
            )
        else:
            cursor.execute(
                f"INSERT INTO {key_table} (destination, {k}, last_seq) VALUES (%s, %s, 1) "
                f"ON CONFLICT (destination, {k}) DO UPDATE SET last_seq = {key_table}.last_seq + 1 "
                "RETURNING last_seq",
                [destination, key],
            )
        seq = int(cursor.fetchone()[0])
        if seq == 1:
            ignore, conflict = (
                ("INSERT IGNORE", "")
                if connections[alias].vendor == "mysql"
                else ("INSERT", " ON CONFLICT DO NOTHING")
            )
            cursor.execute(
                f"{ignore} INTO {cursor_table} (destination, {k}, delivered_seq, lease_token) "
                f"VALUES (%s, %s, 0, ''){conflict}",
                [destination, key],
            )
    return seq


def claim_keys(
    alias: str, destinations: Sequence[str], token: str, lease: float, limit: int
) -> list[ClaimedKey]:
    """Lease up to ``limit`` keys of ``destinations`` that have messages to deliver, for ``lease`` seconds.

    Runs in autocommit (each statement its own transaction): no lock outlives its statement.
    """
    if not destinations:
        return []
    _, cursor_table, message_table = _tables()
    clock = dialect_of(alias).CLOCK
    k = _q(alias, "key")
    names = ", ".join(["%s"] * len(destinations))

    def due(prefix: str) -> str:
        # A key no dead message holds, free (or its lease expired), its retry due.
        return (
            f"{prefix}held_seq IS NULL "
            f"AND ({prefix}lease_until IS NULL OR {prefix}lease_until < {clock.now}) "
            f"AND ({prefix}retry_at IS NULL OR {prefix}retry_at <= {clock.now})"
        )

    with connections[alias].cursor() as cursor:
        cursor.execute(
            # 'pending' written out, not bound, so the planner can match the partial index.
            f"SELECT c.id FROM {cursor_table} c JOIN ("
            f"SELECT destination, {k} AS pending_key, MIN(id) AS oldest FROM {message_table} "
            f"WHERE state = 'pending' AND destination IN ({names}) GROUP BY destination, {k}"
            f") p ON c.destination = p.destination AND c.{k} = p.pending_key "
            f"WHERE {due('c.')} ORDER BY p.oldest LIMIT %s",
            [*destinations, limit],
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"UPDATE {cursor_table} SET lease_token = %s, lease_until = {clock.later} "
            f"WHERE id IN ({marks}) AND {due('')}",
            [token, clock.seconds(lease), *ids],
        )
        cursor.execute(
            f"SELECT id, destination, {k}, delivered_seq FROM {cursor_table} "
            f"WHERE id IN ({marks}) AND lease_token = %s ORDER BY id",
            [*ids, token],
        )
        return [ClaimedKey(int(row[0]), row[1], row[2], int(row[3])) for row in cursor.fetchall()]


def extend_lease(alias: str, cursor_id: int, token: str, lease: float) -> bool:
    """Renew the lease of a key this relay holds; False when it is no longer ours (expired and taken)."""
    _, cursor_table, _ = _tables()
    clock = dialect_of(alias).CLOCK
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"UPDATE {cursor_table} SET lease_until = {clock.later} WHERE id = %s AND lease_token = %s",
            [clock.seconds(lease), cursor_id, token],
        )
        return bool(cursor.rowcount)


def record_delivered(alias: str, cursor_id: int, token: str, seq: int, lease: float) -> bool:
    """Move the key's ``delivered_seq`` to ``seq`` and renew its lease, if the key is still ours
    and ``seq`` is its next message; call in the transaction that marks the message delivered."""
    _, cursor_table, _ = _tables()
    clock = dialect_of(alias).CLOCK
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"UPDATE {cursor_table} SET delivered_seq = %s, lease_until = {clock.later} "
            "WHERE id = %s AND lease_token = %s AND delivered_seq = %s",
            [seq, clock.seconds(lease), cursor_id, token, seq - 1],
        )
        return bool(cursor.rowcount)


def release_lease(alias: str, cursor_id: int, token: str, retry_in: float | None = None) -> bool:
    """Give a key back; with ``retry_in``, its next message may not be tried for that many seconds."""
    _, cursor_table, _ = _tables()
    clock = dialect_of(alias).CLOCK
    retry_sql, params = ("NULL", []) if retry_in is None else (clock.later, [clock.seconds(retry_in)])
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"UPDATE {cursor_table} SET lease_token = '', lease_until = NULL, retry_at = {retry_sql} "
            "WHERE id = %s AND lease_token = %s",
            [*params, cursor_id, token],
        )
        return bool(cursor.rowcount)
