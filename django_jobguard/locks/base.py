"""The lock contract every back end keeps.

A lock guards one business resource (``order:123``, stored as ``jobguard:lock:order:123``).
It always has a TTL and an owner token: only the holder of the token can extend or
release it, and a holder that stops renewing loses it when the TTL runs out. Every
successful acquire of a key increments that key's fencing token, so a downstream write
can refuse a holder older than the newest one.
"""

from __future__ import annotations

import abc
import secrets
import time
from types import TracebackType

from ..exceptions import LockNotAcquired

__all__ = ["BaseLock"]

#: Seconds between attempts of a blocking acquire.
RETRY_INTERVAL_SECONDS = 0.05


class BaseLock(abc.ABC):
    """One lock on one key. Not shared between threads; create one per holder."""

    def __init__(self, key: str, *, ttl: float, prefix: str) -> None:
        if not key:
            raise ValueError("a lock key names a resource, e.g. 'order:123'")
        if ttl is None or ttl <= 0:
            raise ValueError("every lock needs a TTL in seconds (ttl > 0)")
        self.key = key
        self.name = f"{prefix}{key}"
        self.ttl = float(ttl)
        self.token = secrets.token_hex(16)
        self.fencing_token: int | None = None
        self._held = False

    # Back ends implement these three; each raises LockUnavailable when unreachable.
    @abc.abstractmethod
    def _try_acquire(self) -> int | None:
        """Take the lock if free (or expired); the new fencing token, or None if held."""

    @abc.abstractmethod
    def _release(self) -> bool:
        """Free the lock if our token holds it; False if it was not ours any more."""

    @abc.abstractmethod
    def _extend(self) -> bool:
        """Reset the TTL if our token holds it; False if it was not ours any more."""

    @abc.abstractmethod
    def locked(self) -> bool:
        """Whether anyone holds the lock now."""

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock. Non-blocking returns at once; blocking waits up to ``timeout`` (None: forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            fencing = self._try_acquire()
            if fencing is not None:
                self.fencing_token = fencing
                self._held = True
                return True
            if not blocking or (deadline is not None and time.monotonic() >= deadline):
                return False
            time.sleep(RETRY_INTERVAL_SECONDS)

    def release(self) -> None:
        """Free the lock; :class:`LockNotAcquired` if it had expired and been taken by someone else."""
        if not self._held:
            raise LockNotAcquired(f"lock {self.name!r} is not held by this owner")
        self._held = False
        if not self._release():
            raise LockNotAcquired(f"lock {self.name!r} expired and was no longer ours to release")

    def extend(self) -> bool:
        """Renew the TTL; False if the lock expired and someone else took it (stop working)."""
        if not self._held:
            return False
        kept = self._extend()
        if not kept:
            self._held = False
        return kept

    @property
    def held(self) -> bool:
        """Whether this owner believes it holds the lock (it may have expired since)."""
        return self._held

    def __enter__(self) -> BaseLock:
        if not self.acquire():
            raise LockNotAcquired(f"could not acquire {self.name!r}")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._held:
            self.release()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl} held={self._held}>"
