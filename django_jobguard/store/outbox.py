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

**Limits.** A destination that names an entry of ``JOBGUARD["LIMITS"]`` (its ``LIMIT``) is
held to it with the task side's machinery and state (:mod:`.flow_sql`): its keys in flight
(leased, lease not run out) count against the limit's concurrency, in the limited claims'
turn, so every relay of the fleet counts the others' leases (:func:`claim_keys` with
``bounds``); each send passes the limit's breaker, retry budget and rate first
(:func:`admit_send`: the breaker row and the rate key ``rate:limit:<name>`` of the tasks'
limit of that name, so a limit shared with tasks is one breaker and one rate).
:func:`closed_limits` reads, without the turn, which limits admit no send now, so a claim
leaves their keys alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from django.db import connections, transaction

from ..flow import BreakerGate, RateSpec
from ..flow.admission import BREAKER_FIELDS, EPSILON, gates_of
from . import dialect_of, flow_sql

__all__ = [
    "Bound",
    "ClaimedKey",
    "SendAdmission",
    "admit_send",
    "claim_keys",
    "closed_limits",
    "extend_lease",
    "in_flight",
    "next_seq",
    "rate_key",
    "record_delivered",
    "release_lease",
]

#: Candidate keys read per key a claim may take when some destinations are bounded: room to
#: pass over the keys of a destination whose concurrency fills within the claim.
CANDIDATES_PER_KEY = 4
CANDIDATES_EXTRA = 16


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedKey:
    """A key a relay leased: where its delivery stands."""

    cursor_id: int
    destination: str
    key: str
    delivered_seq: int


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    """A limit's concurrency over the destinations that name it: at most ``capacity`` of their
    keys leased at once, across every relay."""

    limit: str
    capacity: int
    destinations: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class SendAdmission:
    """What :func:`admit_send` decided for one send."""

    admitted: bool
    #: Why not: "breaker", "budget" or "rate" ("" when admitted).
    reason: str = ""
    #: Seconds until the limit may admit the send (None: when its breaker lets sends through
    #: again, which a claim finds out).
    retry_in: float | None = None
    #: The breaker's state as this admission read it ("closed" without a breaker): a send
    #: admitted while it is "half_open" is a probe.
    state: str = "closed"
    #: Breakers this admission moved, as ``(name, from state, to state)``.
    changes: tuple[tuple[str, str, str], ...] = ()


def rate_key(limit: str) -> str:
    """The rate table's key of a named limit's rate: the one its tasks' claims advance too."""
    return f"rate:limit:{limit}"


def _flow(alias: str) -> flow_sql.FlowSQL:
    from . import mysql, postgres, sqlite  # the dialects import this package

    turns: dict[str, flow_sql.FlowSQL] = {
        "mysql": mysql.FLOW_SQL,
        "postgresql": postgres.FLOW_SQL,
        "sqlite": sqlite.FLOW_SQL,
    }
    return turns[connections[alias].vendor]


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
    alias: str,
    destinations: Sequence[str],
    token: str,
    lease: float,
    limit: int,
    bounds: Sequence[Bound] = (),
) -> list[ClaimedKey]:
    """Lease up to ``limit`` keys of ``destinations`` that have messages to deliver, for ``lease`` seconds.

    ``bounds``: the concurrency of the limits some destinations name. A bounded destination's
    keys are leased in the limited claims' turn, after counting every relay's keys in flight
    to the destinations of its limit, and only while that count is under the limit's
    capacity; the others' keys as before, in autocommit (each statement its own transaction:
    no lock outlives its statement).
    """
    if not destinations:
        return []
    bound_of = {name: bound for bound in bounds for name in bound.destinations}
    if bound_of:
        # Leave out the destinations whose limit is full now (read without the turn: the
        # turn counts again), so their keys do not fill the candidates' window.
        full = _full(alias, bounds, in_flight(alias, bound_of))
        destinations = [name for name in destinations if bound_of.get(name) not in full]
        if not destinations:
            return []
    bounded = any(name in bound_of for name in destinations)
    window = limit * CANDIDATES_PER_KEY + CANDIDATES_EXTRA if bounded else limit
    candidates = _candidates(alias, destinations, window)
    if not any(destination in bound_of for _, destination in candidates):
        return _lease(alias, [key_id for key_id, _ in candidates[:limit]], token, lease)

    def turn() -> list[ClaimedKey]:
        with transaction.atomic(using=alias):
            with connections[alias].cursor() as cursor:
                _flow(alias).take_turn(alias, cursor)
            counts = in_flight(alias, bound_of)
            room = {
                bound.limit: bound.capacity - sum(counts[name] for name in bound.destinations)
                for bound in bounds
            }
            chosen: list[int] = []
            for key_id, destination in candidates:
                bound = bound_of.get(destination)
                if bound is not None:
                    if room[bound.limit] <= 0:
                        continue
                    room[bound.limit] -= 1
                chosen.append(key_id)
                if len(chosen) >= limit:
                    break
            return _lease(alias, chosen, token, lease)

    from . import retrying  # the package imports this module

    return retrying(alias, "outbox_claim", turn)


def _due(alias: str, prefix: str) -> str:
    # A key no dead message holds, free (or its lease expired), its retry due.
    clock = dialect_of(alias).CLOCK
    return (
        f"{prefix}held_seq IS NULL "
        f"AND ({prefix}lease_until IS NULL OR {prefix}lease_until < {clock.now}) "
        f"AND ({prefix}retry_at IS NULL OR {prefix}retry_at <= {clock.now})"
    )


def _candidates(alias: str, destinations: Sequence[str], count: int) -> list[tuple[int, str]]:
    """``(cursor id, destination)`` of up to ``count`` due keys with pending messages, oldest first."""
    _, cursor_table, message_table = _tables()
    k = _q(alias, "key")
    names = ", ".join(["%s"] * len(destinations))
    with connections[alias].cursor() as cursor:
        cursor.execute(
            # 'pending' written out, not bound, so the planner can match the partial index.
            f"SELECT c.id, c.destination FROM {cursor_table} c JOIN ("
            f"SELECT destination, {k} AS pending_key, MIN(id) AS oldest FROM {message_table} "
            f"WHERE state = 'pending' AND destination IN ({names}) GROUP BY destination, {k}"
            f") p ON c.destination = p.destination AND c.{k} = p.pending_key "
            f"WHERE {_due(alias, 'c.')} ORDER BY p.oldest LIMIT %s",
            [*destinations, count],
        )
        return [(int(row[0]), row[1]) for row in cursor.fetchall()]


def _lease(alias: str, ids: Sequence[int], token: str, lease: float) -> list[ClaimedKey]:
    """Lease the keys ``ids`` that are still due (a racing relay may have won some)."""
    if not ids:
        return []
    _, cursor_table, _ = _tables()
    clock = dialect_of(alias).CLOCK
    k = _q(alias, "key")
    marks = ", ".join(["%s"] * len(ids))
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"UPDATE {cursor_table} SET lease_token = %s, lease_until = {clock.later} "
            f"WHERE id IN ({marks}) AND {_due(alias, '')}",
            [token, clock.seconds(lease), *ids],
        )
        cursor.execute(
            f"SELECT id, destination, {k}, delivered_seq FROM {cursor_table} "
            f"WHERE id IN ({marks}) AND lease_token = %s ORDER BY id",
            [*ids, token],
        )
        return [ClaimedKey(int(row[0]), row[1], row[2], int(row[3])) for row in cursor.fetchall()]


def in_flight(alias: str, destinations: Collection[str]) -> dict[str, int]:
    """Keys of each of ``destinations`` that a relay holds now (leased, the lease not run out)."""
    counts = dict.fromkeys(destinations, 0)
    if not destinations:
        return counts
    _, cursor_table, _ = _tables()
    clock = dialect_of(alias).CLOCK
    names = sorted(destinations)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            f"SELECT destination, COUNT(*) FROM {cursor_table} "
            f"WHERE destination IN ({', '.join(['%s'] * len(names))}) "
            f"AND lease_token <> '' AND lease_until >= {clock.now} GROUP BY destination",
            names,
        )
        for destination, count in cursor.fetchall():
            counts[destination] = int(count)
    return counts


def _full(alias: str, bounds: Sequence[Bound], counts: Mapping[str, int]) -> set[Bound]:
    return {
        bound for bound in bounds if sum(counts.get(name, 0) for name in bound.destinations) >= bound.capacity
    }


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


def closed_limits(alias: str, guards: Mapping[str, BreakerGate], rates: Mapping[str, RateSpec]) -> set[str]:
    """The named limits that admit no send now: breaker open (or its probes all out), rate
    ahead of the clock. Read without the turn, for a claim to leave their keys alone (a send
    is admitted or not by :func:`admit_send`)."""
    if not guards and not rates:
        return set()
    flow = _flow(alias)
    closed: set[str] = set()
    with connections[alias].cursor() as cursor:
        now = flow.now_seconds(alias, cursor)
        breakers = {name: gate for name, gate in guards.items() if gate.breaker is not None}
        if breakers:
            gates = gates_of(breakers, _breaker_rows(cursor, list(breakers)), now)
            closed.update(name for name, gate in gates.items() if gate.closed_to_all)
        if rates:
            arrivals = _arrivals(alias, cursor, [rate_key(name) for name in rates])
            for name, rate in rates.items():
                if _ahead(arrivals.get(rate_key(name)), now) > rate.tolerance + EPSILON:
                    closed.add(name)
    return closed


def admit_send(
    alias: str, limit: str, gate: BreakerGate | None, rate: RateSpec | None, attempts: int
) -> SendAdmission:
    """Whether the limit ``limit`` lets one message through now, its attempts so far ``attempts``.

    Passes the limit's breaker (open: no; half-open: while its probes last, each send a probe),
    its retry budget (a message attempted before is a retry) and its rate (GCRA on the database
    clock, the rate key advanced by the send), and writes what the send takes, in the limited
    claims' turn. A limit with only a breaker, found closed, needs no turn and writes nothing.
    """
    guards = {limit: gate} if gate is not None else {}
    if rate is None and gate is not None and gate.budget is None:
        with connections[alias].cursor() as cursor:
            cursor.execute(f"SELECT state FROM {flow_sql.BREAKER_TABLE} WHERE name = %s", [limit])
            row = cursor.fetchone()
        if row is None or row[0] == "closed":
            return SendAdmission(True)

    def turn() -> SendAdmission:
        flow = _flow(alias)
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            flow.take_turn(alias, cursor)
            now = flow.now_seconds(alias, cursor)
            gates = gates_of(guards, _breaker_rows(cursor, list(guards)), now) if guards else {}
            state = gates.get(limit)
            if state is not None and not state.admits(attempts):
                reason = "breaker" if state.closed_to_all else "budget"
                retry_in = state.wait(now) if reason == "budget" else None
                return SendAdmission(False, reason, retry_in, state.state)
            if rate is not None:
                arrival = _arrivals(alias, cursor, [rate_key(limit)]).get(rate_key(limit))
                ahead = _ahead(arrival, now)
                if ahead > rate.tolerance + EPSILON:
                    return SendAdmission(
                        False, "rate", ahead - rate.tolerance, state.state if state else "closed"
                    )
                flow.upsert_rates(alias, cursor, {rate_key(limit): now + ahead + rate.interval})
            if state is None:
                return SendAdmission(True)
            read_state = state.state
            state.admit(attempts)
            changes = flow_sql.write_gates(flow, alias, cursor, gates, now)
            return SendAdmission(True, state=read_state, changes=tuple(changes))

    from . import retrying  # the package imports this module

    return retrying(alias, "outbox_admit", turn)


def _breaker_rows(cursor: Any, names: Sequence[str]) -> list[Sequence[Any]]:
    marks = ", ".join(["%s"] * len(names))
    cursor.execute(
        f"SELECT {', '.join(BREAKER_FIELDS)} FROM {flow_sql.BREAKER_TABLE} WHERE name IN ({marks})",
        list(names),
    )
    return list(cursor.fetchall())


def _arrivals(alias: str, cursor: Any, keys: Sequence[str]) -> dict[str, float]:
    k = _q(alias, "key")
    cursor.execute(
        f"SELECT {k}, tat FROM {flow_sql.RATE_TABLE} WHERE {k} IN ({', '.join(['%s'] * len(keys))})",
        list(keys),
    )
    return {key: float(tat) for key, tat in cursor.fetchall()}


def _ahead(arrival: float | None, now: float) -> float:
    """Seconds a rate key's theoretical arrival time runs ahead of the clock (0 if behind)."""
    return max(arrival if arrival is not None else now, now) - now
