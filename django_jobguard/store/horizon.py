"""What holds PostgreSQL's vacuum horizon for the jobs' database: one read of the server's views.

VACUUM removes a dead row only once no transaction could still see it. Whatever holds the
oldest snapshot or transaction id of the cluster (the *xmin horizon*) keeps every dead job row
since then in the table and its indexes, and each claim walks over them. :func:`holders` names
what holds it, oldest first:

- a ``session``: a client backend in a transaction (``pg_stat_activity``). One in the jobs'
  database holds it with a snapshot (``backend_xmin``) or a transaction id (``backend_xid``);
  one in another database of the cluster only with a transaction id, which every snapshot
  taken in the jobs' database then includes (PostgreSQL 14 and later; before 14, a snapshot
  in any database held it too). The caller's own backend is left out;
- a ``prepared transaction`` (``pg_prepared_xacts``): its transaction id, in any database;
- a ``replication slot`` whose ``xmin`` is set (a physical slot a standby with
  ``hot_standby_feedback`` reports through; the slot keeps it after the standby is gone). A
  logical slot's ``catalog_xmin`` holds back the system catalogs only, not the jobs' tables;
- a ``standby``: a WAL sender whose standby reports ``hot_standby_feedback`` without a slot
  (``pg_stat_replication.backend_xmin``).

A session's age is its transaction's (``xact_start``), a prepared transaction's its
``prepared`` time; a slot or a standby has no clock, nor has a session whose details
``pg_stat_activity`` hides from a role without ``pg_read_all_stats`` (its query reads
``<insufficient privilege>``): their ``age_seconds`` is None and the caller measures how long
it sees the same ``xmin``. ``xid_age`` (transactions since the xmin) is known for all.

PostgreSQL only: on SQLite and MariaDB/MySQL (whose InnoDB purge lag is another matter)
:func:`holders` returns nothing, without a query.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import connections

__all__ = ["QUERY_CHARS", "Holder", "holders", "server_timeouts"]

#: Characters of a session's query kept (the start of it: enough to recognise it).
QUERY_CHARS = 200
#: Holders read at most, oldest first.
HOLDERS_READ = 10
#: What ``pg_stat_activity`` shows in place of the query of another role's session.
INSUFFICIENT_PRIVILEGE = "<insufficient privilege>"


@dataclasses.dataclass(frozen=True, slots=True)
class Holder:
    """One thing that holds the vacuum horizon of the jobs' database."""

    #: ``session``, ``prepared transaction``, ``replication slot`` or ``standby``.
    kind: str
    #: The backend's process id (a session's, a standby's WAL sender's, an active slot's); else None.
    pid: int | None
    #: A slot's name, a prepared transaction's gid, a standby's application name; "" for a session.
    name: str
    database: str
    user: str
    application: str
    #: A session's state (``idle in transaction``, ``active``...); "" when unknown or not a session.
    state: str
    #: The start of a session's query (:data:`QUERY_CHARS` characters); "" when hidden or none.
    query: str
    #: Seconds it has held the horizon, by the database clock; None when the server does not say.
    age_seconds: float | None
    #: Transactions started since its xmin (``age(xmin)``).
    xid_age: int
    #: Its xmin (or transaction id) as text: the same value again means the horizon has not moved.
    xmin: str
    #: Whether its details were hidden (``<insufficient privilege>``: the role lacks pg_read_all_stats).
    hidden: bool = False

    def describe(self) -> str:
        """Who it is, in words: ``session pid 4242 (database app, user report, application
        psql, idle in transaction)``."""
        parts = [f"database {self.database or '-'}"] if self.kind != "standby" else []
        if self.user:
            parts.append(f"user {self.user}")
        if self.application and self.kind == "session":
            parts.append(f"application {self.application}")
        if self.state:
            parts.append(self.state)
        if self.hidden:
            parts.append("details hidden: grant pg_read_all_stats to see them")
        who = self.kind
        if self.pid is not None and self.kind in ("session", "standby"):
            who += f" pid {self.pid}"
        if self.name:
            who += f" {self.name}"
        if self.kind == "replication slot":
            parts.append(f"active pid {self.pid}" if self.pid is not None else "inactive")
        return f"{who} ({', '.join(parts)})" if parts else who

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# One round trip. Sessions in another database count only with a transaction id from
# PostgreSQL 14 on (%(all_snapshots)s before it). xid has no ordering: age() compares them.
_HOLDERS_SQL = f"""
SELECT kind, pid, name, database, usr, application, state, query, age_seconds, xid_age, xmin FROM (
    SELECT 'session' AS kind, a.pid, '' AS name, coalesce(a.datname, '') AS database,
           coalesce(a.usename, '') AS usr, coalesce(a.application_name, '') AS application,
           coalesce(a.state, '') AS state, coalesce(left(a.query, {QUERY_CHARS}), '') AS query,
           extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS age_seconds,
           greatest(age(a.backend_xmin), age(a.backend_xid)) AS xid_age,
           coalesce(a.backend_xid::text, '') || '/' || coalesce(a.backend_xmin::text, '') AS xmin
    FROM pg_stat_activity a
    WHERE a.pid <> pg_backend_pid()
      AND a.backend_type = 'client backend'
      AND (a.backend_xid IS NOT NULL
           OR (a.backend_xmin IS NOT NULL
               AND (a.datname = current_database() OR %(all_snapshots)s)))
  UNION ALL
    SELECT 'prepared transaction', NULL, p.gid, p.database, p.owner, '', '', '',
           extract(epoch FROM clock_timestamp() - p.prepared)::float8,
           age(p.transaction), p.transaction::text
    FROM pg_prepared_xacts p
  UNION ALL
    SELECT 'replication slot', s.active_pid, s.slot_name, coalesce(s.database, ''), '', '', '', '',
           NULL, age(s.xmin), s.xmin::text
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL
  UNION ALL
    SELECT 'standby', r.pid, coalesce(r.application_name, ''), '', coalesce(r.usename, ''),
           coalesce(r.application_name, ''), coalesce(r.state, ''), '',
           NULL, age(r.backend_xmin), r.backend_xmin::text
    FROM pg_stat_replication r
    WHERE r.backend_xmin IS NOT NULL
) held
ORDER BY xid_age DESC NULLS LAST, age_seconds DESC NULLS LAST
LIMIT {HOLDERS_READ}
"""


def holders(alias: str) -> list[Holder]:
    """What holds the vacuum horizon of ``alias``'s database, the oldest xmin first.

    Young holders are included (a claim's own transaction is one for a moment): the caller
    judges their age. Empty, with no query, on a database that is not PostgreSQL.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    all_snapshots = connection.pg_version < 140000  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(_HOLDERS_SQL, {"all_snapshots": all_snapshots})
        rows = cursor.fetchall()
    found = []
    for kind, pid, name, database, user, application, state, query, age, xid_age, xmin in rows:
        hidden = kind == "session" and query == INSUFFICIENT_PRIVILEGE
        found.append(
            Holder(
                kind=kind,
                pid=pid,
                name=name,
                database=database,
                user=user,
                application=application,
                state=state,
                query="" if hidden else query,
                age_seconds=None if age is None else max(0.0, float(age)),
                xid_age=int(xid_age or 0),
                xmin=xmin,
                hidden=hidden,
            )
        )
    return found


def autovacuum_off(alias: str, table: str) -> list[str]:
    """What keeps autovacuum from ``table`` on ``alias``'s server: the server's ``autovacuum`` or
    ``track_counts`` off, the table's ``autovacuum_enabled`` storage parameter false. Empty when
    nothing does (or ``alias`` is not PostgreSQL)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('autovacuum'), current_setting('track_counts'), "
            "(SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s))",
            [connection.ops.quote_name(table)],
        )
        autovacuum, track_counts, options = cursor.fetchone()
    off = [
        f"{name} = off"
        for name, value in (("autovacuum", autovacuum), ("track_counts", track_counts))
        if value == "off"
    ]
    parameters = dict(option.lower().partition("=")[::2] for option in options or ())
    if parameters.get("autovacuum_enabled") in ("false", "off", "no", "0", "f", "n"):
        off.append(f"{table}'s autovacuum_enabled = false")
    return off


#: The server settings that end a transaction left open: (name, first server version with it).
TIMEOUT_SETTINGS = (("idle_in_transaction_session_timeout", 90600), ("transaction_timeout", 170000))


def server_timeouts(alias: str) -> dict[str, int] | None:
    """The session timeouts of ``alias``'s connections in milliseconds (0: off), the ones its server has.

    As ``SHOW`` reads them on this connection: the server's, the database's or the role's
    value, or the connection's ``OPTIONS``. None when ``alias`` is not PostgreSQL.
    """
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return None
    version = connection.pg_version  # type: ignore[attr-defined]
    names = [name for name, since in TIMEOUT_SETTINGS if version >= since]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, setting::bigint FROM pg_settings WHERE name = ANY(%s)",
            [names],
        )
        return {str(name): int(value) for name, value in cursor.fetchall()}
