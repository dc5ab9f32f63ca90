"""Database lock back end (the embedded default): one row per key in ``jobguard_lock``.

The statements live in the store (:mod:`django_jobguard.store.locks`): an upsert that takes
a free or expired row and bumps the key's fencing counter, and release and extend matched
by owner token and an unexpired ``expires_at``, all in the database clock. This service adds
the rules around them: acquire and release commit at once (never inside a transaction),
and a database that does not answer is :class:`LockUnavailable`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, InterfaceError, connections

from ..conf import get_settings
from ..exceptions import LockUnavailable
from ..store import locks as lock_rows
from .base import BaseLock

__all__ = ["DatabaseLock"]

_T = TypeVar("_T")


def _callers_transaction_open(alias: str) -> bool:
    """Whether the caller holds a transaction open on ``alias``.

    A ``TestCase``'s own blocks do not count: they never commit, nothing outside the test sees
    its rows anyway, and every owner inside it (the test kit's ``run_jobs()``) shares its
    connection, so a lock row written there is seen by each of them at once.
    """
    connection = connections[alias]
    # Django marks the blocks TestCase opens; no public name says so.
    return connection.in_atomic_block and not all(
        vars(block).get("_from_testcase", False) for block in connection.atomic_blocks
    )


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
        owner: str = "",
    ) -> None:
        super().__init__(key, ttl=ttl, prefix=prefix, blocking=blocking, timeout=timeout, owner=owner)
        self.using = using or get_settings().database_alias

    def _run(self, statement: Callable[[], _T], *, in_transaction: bool = False) -> _T:
        if _callers_transaction_open(self.using) and not in_transaction:
            # The row would stay invisible to other owners until the transaction commits.
            raise RuntimeError(
                f"lock {self.name!r}: database locks are acquired and released outside "
                "transaction.atomic(); take the lock first, then open the transaction inside it"
            )
        try:
            return statement()
        except (DatabaseError, InterfaceError) as exc:
            raise LockUnavailable(f"lock {self.name!r}: the database did not answer ({exc})") from exc

    def _try_acquire(self, token: str) -> int | None:
        return self._run(lambda: lock_rows.acquire(self.using, self.name, token, self.ttl))

    def _release(self) -> bool:
        token = self.token
        return self._run(lambda: lock_rows.release(self.using, self.name, token))

    def _extend(self, ttl: float) -> bool:
        token = self.token
        # Inside the job's transaction this also locks the row until commit (PostgreSQL).
        return self._run(lambda: lock_rows.extend(self.using, self.name, token, ttl), in_transaction=True)

    def locked(self) -> bool:
        return self._run(lambda: lock_rows.held(self.using, self.name), in_transaction=True)
