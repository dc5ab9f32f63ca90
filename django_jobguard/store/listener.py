"""The wake-up of an idle worker when jobs are enqueued: LISTEN/NOTIFY, or Redis pub/sub
(what sends them, and ``JOBGUARD["NOTIFY"]``'s modes: :mod:`.wakeup`)."""

from __future__ import annotations

import logging
import os
import select
import time
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ..conf import get_settings
from .common import NOTIFY_CHANNEL
from .wakeup import Subscriber

logger = logging.getLogger("django_jobguard.store")


def listen_connection(alias: str, channel: str) -> Any:
    """A psycopg connection of its own to ``alias`` (autocommit), listening on ``channel``.

    Not Django's: LISTEN needs a session that outlives Django's per-request connection handling
    (and a direct one, not a transaction pooler's: see ``Settings.listen_alias``).
    """
    import psycopg  # an optional dependency: only PostgreSQL deployments have it

    params = connections[alias].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    conn = psycopg.connect(**params, autocommit=True)
    try:
        conn.execute(f"LISTEN {channel}")
    except BaseException:
        conn.close()
        raise
    return conn


class Listener:
    """Wakes an idle worker when jobs are enqueued: LISTEN/NOTIFY on PostgreSQL, Redis pub/sub
    where ``JOBGUARD["WAKEUP_CACHE"]`` is set (``wakeup``: the cache alias and channel).

    :meth:`wait` sleeps until a notification for one of our queues arrives, :meth:`wake`
    is called (a signal handler may call it: it only writes to a pipe), or the timeout
    passes. Without either source, or while both fail, it is a plain interruptible sleep
    and the worker falls back to polling every ``POLL_INTERVAL`` seconds.
    """

    #: Seconds before a failed LISTEN connection is tried again.
    RECONNECT_DELAY_SECONDS = 5.0
    #: Failed LISTEN connections in a row between two log lines.
    LOG_EVERY_FAILURES = 6

    def __init__(
        self, alias: str | None, queues: Sequence[str] | None, *, wakeup: tuple[str, str] | None = None
    ) -> None:
        # None: no alias can LISTEN (the jobs' alias is pooled and no LISTEN_DATABASE is set).
        self.alias = alias
        self.queues = set(queues) if queues else None
        self._conn: Any = None
        self._failed_at = -self.RECONNECT_DELAY_SECONDS
        self._failures = 0
        self._wake_r, self._wake_w = os.pipe()
        # The Redis subscriber's thread writes here when an enqueue named one of our queues.
        self._heard_r, self._heard_w = os.pipe()
        for fd in (self._wake_r, self._wake_w, self._heard_r, self._heard_w):
            os.set_blocking(fd, False)
        self._subscriber = Subscriber(*wakeup, queues, self._heard_w) if wakeup else None

    def _connect(self) -> Any:
        if self._conn is not None or self.alias is None or connections[self.alias].vendor != "postgresql":
            return self._conn
        if time.monotonic() - self._failed_at < self.RECONNECT_DELAY_SECONDS:
            return None
        try:
            self._conn = listen_connection(self.alias, NOTIFY_CHANNEL)
            self._failures = 0
        except Exception:
            # While the database stays away: the traceback once, then a line every
            # LOG_EVERY_FAILURES tries (about half a minute), not one per try.
            self._failures += 1
            if self._failures == 1:
                logger.warning("listen_failed alias=%s; polling instead", self.alias, exc_info=True)
            elif self._failures % self.LOG_EVERY_FAILURES == 0:
                logger.warning(
                    "listen_failed alias=%s failures=%d; still polling", self.alias, self._failures
                )
            self._failed_at = time.monotonic()
            self._conn = None
        return self._conn

    def start(self) -> bool:
        """LISTEN now (instead of at the first wait); True if notifications will arrive."""
        listening = self._connect() is not None
        if self.alias is None and self._subscriber is None:
            if get_settings().notify == "none":
                logger.info("listen_disabled reason=notify_none; polling (or set JOBGUARD['WAKEUP_CACHE'])")
            else:
                logger.info(
                    "listen_disabled reason=pooled_database; polling (set JOBGUARD['LISTEN_DATABASE'] "
                    "or JOBGUARD['WAKEUP_CACHE'])"
                )
        elif listening:
            logger.info("listening alias=%s channel=%s", self.alias, NOTIFY_CHANNEL)
        if self._subscriber is not None:
            if self._subscriber.start():
                subscriber = self._subscriber
                logger.info("listening cache=%s channel=%s", subscriber.cache_alias, subscriber.channel)
                listening = True
            # else: its thread keeps trying and warns once; polling covers the gap.
        return listening

    def wake(self) -> None:
        """Make a current or the next :meth:`wait` return at once."""
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full or closed: a wake-up is pending or moot

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if a notification for our queues arrived."""
        conn = self._connect()
        watched = [self._wake_r, self._heard_r]
        if conn is not None:
            watched.append(conn.fileno())
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                ready, _, _ = select.select(watched, [], [], remaining)
                if self._wake_r in ready:
                    self._drain_pipe(self._wake_r)
                    return False
                if self._heard_r in ready:
                    self._drain_pipe(self._heard_r)
                    return True
                if not ready:
                    return False
                # Many enqueues wake us once: the claim that follows takes a whole batch.
                payloads = {note.payload for note in conn.notifies(timeout=0)}
                if (self.queues is None and payloads) or payloads & (self.queues or set()):
                    return True
        except Exception:
            logger.warning("listen_lost alias=%s; reconnecting", self.alias, exc_info=True)
            self._close_conn()
            return False

    @staticmethod
    def _drain_pipe(fd: int) -> None:
        try:
            while os.read(fd, 512):
                pass
        except BlockingIOError:
            pass

    def _close_conn(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: S110 - closing a broken connection may fail; nothing to do
                pass
            self._conn = None
            self._failed_at = time.monotonic()

    def close(self) -> None:
        self._close_conn()
        if self._subscriber is not None:
            self._subscriber.stop()
        for fd in (self._wake_r, self._wake_w, self._heard_r, self._heard_w):
            try:
                os.close(fd)
            except OSError:
                pass
