"""Database lock back end (the embedded default): one row per key in ``jobguard_lock``.

Acquire is a single upsert that takes the row only if it is free or expired, and bumps
the key's fencing counter in the same statement. Times are the database clock's.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections

from ..conf import get_settings
from ..exceptions import LockUnavailable
from .base import BaseLock

__all__ = ["DatabaseLock"]

_TABLE = "jobguard_lock"


class DatabaseLock(BaseLock):
    """A lock stored in the jobs database; works on SQLite and PostgreSQL."""

    def __init__(self, key: str, *, ttl: float, prefix: str, using: str | None = None) -> None:
        super().__init__(key, ttl=ttl, prefix=prefix)
        self.using = using or get_settings().database_alias

    def _sql(self) -> tuple[str, str]:
        """(now, now + ttl) expressions for this database; vendor SQL stays in this module."""
        if connections[self.using].vendor == "postgresql":
            return "statement_timestamp()", "statement_timestamp() + %s * interval '1 second'"
        now = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
        return now, "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '+' || %s || ' seconds')"

    def _execute(self, sql: str, params: list[Any]) -> list[tuple[object, ...]]:
        connection = connections[self.using]
        if connection.in_atomic_block:
            # Inside a transaction the lock row would stay invisible to others until commit.
            raise RuntimeError(
                "database locks must be taken and released outside transaction.atomic(); "
                f"{self.name!r} was used inside one"
            )
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return list(cursor.fetchall()) if cursor.description else [(cursor.rowcount,)]
        except DatabaseError as exc:
            raise LockUnavailable(f"lock {self.name!r}: the database did not answer ({exc})") from exc

    def _try_acquire(self) -> int | None:
        now, expires = self._sql()
        rows = self._execute(
            f"INSERT INTO {_TABLE} (key, token, expires_at, fencing_token, acquired_at) "
            f"VALUES (%s, %s, {expires}, 1, {now}) "
            f"ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at, "
            f"fencing_token = {_TABLE}.fencing_token + 1, acquired_at = excluded.acquired_at "
            f"WHERE {_TABLE}.token IS NULL OR {_TABLE}.expires_at <= {now} "
            "RETURNING fencing_token",
            [self.name, self.token, self.ttl],
        )
        return int(rows[0][0]) if rows else None  # type: ignore[call-overload]

    def _release(self) -> bool:
        rows = self._execute(
            f"UPDATE {_TABLE} SET token = NULL, expires_at = NULL WHERE key = %s AND token = %s",
            [self.name, self.token],
        )
        return rows[0][0] == 1

    def _extend(self) -> bool:
        now, expires = self._sql()
        rows = self._execute(
            f"UPDATE {_TABLE} SET expires_at = {expires} "
            f"WHERE key = %s AND token = %s AND expires_at > {now}",
            [self.ttl, self.name, self.token],
        )
        return rows[0][0] == 1

    def locked(self) -> bool:
        now, _ = self._sql()
        rows = self._execute(
            f"SELECT 1 FROM {_TABLE} WHERE key = %s AND token IS NOT NULL AND expires_at > {now}",
            [self.name],
        )
        return bool(rows)
