"""Database lock back end (the embedded default): one row per key in ``jobguard_lock``.

Acquire is a single upsert that takes the row only if it is free or expired and bumps
the key's fencing counter in the same statement, so two owners can never both win and
the counter can never repeat (the row, and with it the counter, is kept after release).
Release and extend match the owner token and an unexpired ``expires_at``. Times are the
database clock's, never a worker's.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from ..conf import get_settings
from ..exceptions import LockUnavailable
from .base import BaseLock

__all__ = ["DatabaseLock"]

_TABLE = "jobguard_lock"


class DatabaseLock(BaseLock):
    """A lock stored in the jobs database (``using``); works on SQLite and PostgreSQL.

    Acquire and release run outside any transaction (they must commit at once to be seen
    by other owners); :meth:`extend` may run inside one, e.g. to check the lock just before
    a job's transaction commits.
    """

    def __init__(
        self,
        key: str,
        *,
        ttl: float,
        prefix: str,
        blocking: bool = True,
        timeout: float | None = None,
        using: str | None = None,
    ) -> None:
        super().__init__(key, ttl=ttl, prefix=prefix, blocking=blocking, timeout=timeout)
        self.using = using or get_settings().database_alias

    def _sql(self) -> tuple[str, str]:
        """(now, now + ttl) expressions for this database.

        Vendor SQL stays in this module (and the store package): PostgreSQL has
        ``statement_timestamp()`` and intervals; SQLite stores Django datetimes as text
        and has ``strftime`` with a seconds modifier.
        """
        if connections[self.using].vendor == "postgresql":
            return "statement_timestamp()", "statement_timestamp() + %s * interval '1 second'"
        now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
        return now, "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    def _ttl_param(self, ttl: float) -> Any:
        if connections[self.using].vendor == "postgresql":
            return ttl
        # A fixed-point modifier: repr() could give '1e-05', which SQLite does not parse.
        return f"+{ttl:.6f} seconds"

    def _execute(self, sql: str, params: list[Any], *, in_transaction: bool = False) -> list[tuple[Any, ...]]:
        connection = connections[self.using]
        if connection.in_atomic_block and not in_transaction:
            # The row would stay invisible to other owners until the transaction commits.
            raise RuntimeError(
                f"lock {self.name!r}: database locks are acquired and released outside "
                "transaction.atomic(); take the lock first, then open the transaction inside it"
            )
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return list(cursor.fetchall()) if cursor.description else [(cursor.rowcount,)]
        except (DatabaseError, InterfaceError) as exc:
            raise LockUnavailable(f"lock {self.name!r}: the database did not answer ({exc})") from exc

    def _try_acquire(self, token: str) -> int | None:
        now, expires = self._sql()
        rows = self._execute(
            f"INSERT INTO {_TABLE} (key, token, expires_at, fencing_token, acquired_at) "
            f"VALUES (%s, %s, {expires}, 1, {now}) "
            f"ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at, "
            f"fencing_token = {_TABLE}.fencing_token + 1, acquired_at = excluded.acquired_at "
            f"WHERE {_TABLE}.token IS NULL OR {_TABLE}.expires_at <= {now} "
            "RETURNING fencing_token",
            [self.name, token, self._ttl_param(self.ttl)],
        )
        return int(rows[0][0]) if rows else None

    def _release(self) -> bool:
        now, _ = self._sql()
        rows = self._execute(
            f"UPDATE {_TABLE} SET token = NULL, expires_at = NULL "
            f"WHERE key = %s AND token = %s AND expires_at > {now}",
            [self.name, self.token],
        )
        return bool(rows[0][0] == 1)

    def _extend(self, ttl: float) -> bool:
        now, expires = self._sql()
        rows = self._execute(
            f"UPDATE {_TABLE} SET expires_at = {expires} "
            f"WHERE key = %s AND token = %s AND expires_at > {now}",
            [self._ttl_param(ttl), self.name, self.token],
            # Inside the job's transaction this also locks the row until commit (PostgreSQL),
            # so no one can take the lock between this check and the commit.
            in_transaction=True,
        )
        return bool(rows[0][0] == 1)

    def locked(self) -> bool:
        now, _ = self._sql()
        rows = self._execute(
            f"SELECT 1 FROM {_TABLE} WHERE key = %s AND token IS NOT NULL AND expires_at > {now}",
            [self.name],
            in_transaction=True,
        )
        return bool(rows)
