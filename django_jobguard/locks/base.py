"""The lock contract every back end keeps.

A lock guards one business resource (``order:123``, stored as ``jobguard:lock:order:123``).
It always has a TTL and an owner token: only the holder of the token can extend or
release it, and a holder that stops renewing loses it when the TTL runs out. Every
successful acquire of a key gets a fencing token greater than any earlier holder's, so a
downstream write can refuse a holder older than the newest one.
"""

from __future__ import annotations

import abc
import logging
import math
import secrets
import threading
import time
from types import TracebackType

from ..exceptions import LockNotAcquired

logger = logging.getLogger("django_jobguard.locks")

__all__ = ["MAX_NAME_LENGTH", "MAX_OWNER_LENGTH", "RESERVED_SUFFIX", "BaseLock"]

#: Seconds between attempts of a blocking acquire.
RETRY_INTERVAL_SECONDS = 0.05
#: Longest stored lock name (prefix + key), the width of the database back end's key column.
MAX_NAME_LENGTH = 255
#: Keys may not end with this: the Redis back end stores a key's fencing counter under it.
RESERVED_SUFFIX = ":fencing"
#: Longest owner: with the 17 characters of the random tail, an owner token fits the database
#: back end's 64-character token column.
MAX_OWNER_LENGTH = 47
_OWNER_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


class BaseLock(abc.ABC):
    """One lock on one key, held by one owner at a time.

    Create one object per holder (``lock(key, ttl=...)``); do not share it between
    processes. Within a process its methods may be called from several threads (a worker
    renews from its heartbeat thread while the handler's thread releases).
    """

    def __init__(
        self,
        key: str,
        *,
        ttl: float,
        prefix: str,
        blocking: bool = True,
        timeout: float | None = None,
        owner: str = "",
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"a lock key names a resource, e.g. 'order:123', not {key!r}")
        if key.endswith(RESERVED_SUFFIX):
            raise ValueError(f"lock key {key!r} ends with {RESERVED_SUFFIX!r}, which is reserved")
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
            raise ValueError(f"every lock needs a finite TTL in seconds (ttl > 0), not {ttl!r}")
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be zero or more seconds, not {timeout!r}")
        if len(owner) > MAX_OWNER_LENGTH or not set(owner) <= _OWNER_CHARACTERS:
            raise ValueError(
                f"a lock owner is at most {MAX_OWNER_LENGTH} letters, digits, '.', '-' or '_', not {owner!r}"
            )
        self.key = key
        #: Who takes the lock (e.g. a job's claim, see :mod:`.holders`): the start of every owner
        #: token of this lock, so the lock's own token names its holder.
        self.owner = owner
        self.name = f"{prefix}{key}"
        if len(self.name) > MAX_NAME_LENGTH:
            raise ValueError(
                f"lock name {self.name[:40]!r}... is {len(self.name)} characters; "
                f"prefix and key together may have at most {MAX_NAME_LENGTH}"
            )
        self.ttl = float(ttl)
        self.blocking = blocking
        self.timeout = timeout
        #: Owner token of the current (or last) acquire; a fresh one for every acquire.
        self.token = ""
        #: Fencing token of the current (or last) acquire; None before the first one.
        self.fencing_token: int | None = None
        self._held = False
        self._mutex = threading.Lock()

    # Back ends implement these; each raises LockUnavailable when the store is unreachable.
    @abc.abstractmethod
    def _try_acquire(self, token: str) -> int | None:
        """Take the lock for ``token`` if free (or expired): the new fencing token, or None."""

    @abc.abstractmethod
    def _release(self) -> bool:
        """Free the lock if our token holds it unexpired; False if it was not ours any more."""

    @abc.abstractmethod
    def _extend(self, ttl: float) -> bool:
        """Reset the TTL to ``ttl`` if our token holds it unexpired; False otherwise."""

    @abc.abstractmethod
    def locked(self) -> bool:
        """Whether anyone (this owner or another) holds the lock now."""

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock; True once taken, False if another owner kept it.

        ``blocking=False`` tries once. Blocking (the default unless the lock was created
        with ``blocking=False``) retries every ``RETRY_INTERVAL_SECONDS`` for up to
        ``timeout`` seconds (default: the lock's ``timeout``; None waits for ever).
        Raises :class:`~django_jobguard.LockUnavailable` if the back end cannot be reached.
        """
        blocking = self.blocking if blocking is None else blocking
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:
                if self._held:
                    raise RuntimeError(
                        f"lock {self.name!r} is already held by this owner; "
                        "create another lock() for a second holder"
                    )
                # A fresh token per acquire: a late release from an earlier hold can never
                # free this one.
                token = f"{self.owner}.{secrets.token_hex(8)}" if self.owner else secrets.token_hex(16)
                fencing = self._try_acquire(token)
                if fencing is not None:
                    self.token = token
                    self.fencing_token = fencing
                    self._held = True
                    return True
            if not blocking or (deadline is not None and time.monotonic() >= deadline):
                return False
            time.sleep(RETRY_INTERVAL_SECONDS)

    def release(self) -> None:
        """Free the lock.

        Raises :class:`~django_jobguard.LockNotAcquired` if this owner does not hold it,
        or if it expired before the release (another owner may have held it meanwhile, so
        the work it guarded may have overlapped), and
        :class:`~django_jobguard.LockUnavailable` if the back end cannot be reached (the
        TTL frees the lock then).
        """
        with self._mutex:
            if not self._held:
                raise LockNotAcquired(f"lock {self.name!r} is not held by this owner")
            self._held = False
            if not self._release():
                raise LockNotAcquired(
                    f"lock {self.name!r} expired before it was released; another owner may have held it"
                )

    def extend(self, ttl: float | None = None) -> bool:
        """Reset the lock's TTL to ``ttl`` seconds from now (default: the lock's ``ttl``).

        False if this owner does not hold it or it already expired: stop the work it guards.
        Raises :class:`~django_jobguard.LockUnavailable` if the back end cannot be reached.
        """
        if ttl is not None and (not math.isfinite(ttl) or ttl <= 0):
            raise ValueError(f"ttl must be a finite number of seconds above 0, not {ttl!r}")
        with self._mutex:
            if not self._held:
                return False
            kept = self._extend(self.ttl if ttl is None else float(ttl))
            if not kept:
                self._held = False
            return kept

    @property
    def held(self) -> bool:
        """Whether this owner believes it holds the lock (it may have expired since the last call)."""
        return self._held

    def __enter__(self) -> BaseLock:
        if not self.acquire():
            raise LockNotAcquired(
                f"could not acquire {self.name!r} within {self.timeout}s"
                if self.blocking
                else f"{self.name!r} is held by another owner"
            )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._held:
            return
        if exc is None:
            self.release()
            return
        # The block failed already: report a failed release without hiding the first error.
        try:
            self.release()
        except Exception:
            logger.warning(
                "lock_release_failed lock=%r after an error in its block", self.name, exc_info=True
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl} held={self._held}>"
