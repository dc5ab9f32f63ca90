"""The wake-up of processes that wait on a job's outcome (``Job.wait()``): one LISTEN per process.

On PostgreSQL, migration 0027's trigger sends ``pg_notify('jobguard_settled', '<id>')`` when a
job whose ``waited`` column is true settles (succeeded, dead or cancelled). A waiter sets that
column itself (:func:`mark_waited`), so a job nobody waits on costs its worker nothing: the ack
statements are the same, and the trigger's WHEN is false on the first column it reads.

Every waiter of a process shares one :class:`SettleListener` per alias: one thread, one LISTEN
connection (however many waiters), a callback per waiter keyed by job id. The order that misses
no settlement: the waiter subscribes, the listener is LISTENing, then the waiter flags the row
(a statement that does nothing to a row already settled), then it reads the row. A settlement
committed before the flag is seen by that read; one committed after it notifies. While the
connection is down, or after it came back, every waiter is woken to read its row again.

Watchers (``Job.watch()``) subscribe with ``progress=True``: migration 0029's trigger sends
``pg_notify('jobguard_settled', 'p<id>')`` when a waited job's progress changes, which wakes
only them, so ``Job.wait()``'s waiters do not read the row at each report.

A process that dies mid-wait leaves nothing: its LISTEN ends with its connection, and the flag
only makes the job's settlement send a notification nobody hears.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..conf import get_settings
from .common import NOTIFY_CHANNEL, TABLE
from .listener import listen_connection

__all__ = ["PROGRESS_MARK", "SETTLED_CHANNEL", "SettleListener", "mark_waited", "settle_listener"]

logger = logging.getLogger("django_jobguard.store")

#: The channel migration 0027's trigger notifies on (payload: the job's id as text). Migration
#: 0029's notifies a watched job's new progress on it too (payload: ``p`` and the id).
SETTLED_CHANNEL = "jobguard_settled"
#: The payload's prefix of a progress notification (migration 0029).
PROGRESS_MARK = "p"

#: Seconds the LISTEN connection stays open with no waiter. Under 5 s: a ``DROP DATABASE``
#: (a test run's teardown) waits that long for other sessions to end.
IDLE_CLOSE_SECONDS = 2.0
#: Seconds before a failed LISTEN connection is tried again.
RECONNECT_DELAY_SECONDS = 1.0
#: Seconds the dispatcher thread sleeps in one select (it also checks for idleness then).
_SELECT_SECONDS = 0.5

# One statement, its own short transaction (the caller's autocommit), committed without waiting
# for the disk: the row's lock is held for microseconds. A job settled already is left as it
# is (no row: read it instead). A queued job's claim may have passed over the row while this
# held it (the claim skips locked rows), so a job due now is announced to its queue's idle
# workers again, as its enqueue did: the wait costs a NOTIFY, never a poll interval.
_SETTLED = "('succeeded', 'dead', 'cancelled')"
_MARK = (
    f"UPDATE {TABLE} SET waited = TRUE WHERE {{where}} AND status NOT IN {_SETTLED} "
    "AND set_config('synchronous_commit', 'off', true) IS NOT NULL RETURNING id"
)
_ANNOUNCE = (
    ", CASE WHEN status = 'queued' AND run_after <= statement_timestamp() "
    f"THEN (SELECT 1 FROM pg_notify('{NOTIFY_CHANNEL}', queue_name)) END"
)
_MARK_SQL = {True: _MARK.format(where="id = %s") + _ANNOUNCE, False: _MARK.format(where="id = %s")}
_MARK_MANY_SQL = {
    True: _MARK.format(where="id = ANY(%s)") + _ANNOUNCE,
    False: _MARK.format(where="id = ANY(%s)"),
}

Callback = Callable[[], None]


def mark_waited(alias: str, job_id: int) -> bool:
    """Flag job ``job_id`` as waited on, unless it settled already: True if flagged (its
    settlement will notify), False if it settled or does not exist (read it)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_MARK_SQL[get_settings().notify != "none"], [job_id])
        return cursor.fetchone() is not None


def mark_many_waited(alias: str, job_ids: list[int]) -> set[int]:
    """:func:`mark_waited` for many jobs in one statement: the ids flagged."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_MARK_MANY_SQL[get_settings().notify != "none"], [job_ids])
        return {int(row[0]) for row in cursor.fetchall()}


# alias -> its database's vendor. Read once: in async code every coroutine has a context of its
# own, so ``connections[alias]`` there builds a DatabaseWrapper per coroutine (about 2.5 KB
# each, the most of what 10,000 waiting coroutines cost before this).
_vendors: dict[str, str] = {}


def _vendor(alias: str) -> str:
    vendor = _vendors.get(alias)
    if vendor is None:
        vendor = _vendors[alias] = connections[alias].vendor
    return vendor


# (alias, listen alias) -> this process's listener.
_listeners: dict[tuple[str, str], SettleListener] = {}
_listeners_lock = threading.Lock()


def settle_listener(alias: str) -> SettleListener | None:
    """The process's listener for waiters on jobs of ``alias``; None where settlements are not
    notified (not PostgreSQL) or cannot be heard (a transaction-pooled alias without
    ``LISTEN_DATABASE``): waiters poll there."""
    if _vendor(alias) != "postgresql":
        return None
    conf = get_settings()
    listen = conf.listen_database or (None if alias in conf.pooled_databases else alias)
    if listen is None:
        return None
    key = (alias, listen)
    listener = _listeners.get(key)
    if listener is None or listener.pid != os.getpid():  # none yet, or a forked child's copy
        with _listeners_lock:
            listener = _listeners.get(key)
            if listener is None or listener.pid != os.getpid():
                listener = _listeners[key] = SettleListener(listen)
    return listener


class SettleListener:
    """One thread and one LISTEN connection that wake this process's waiters when jobs settle.

    :meth:`subscribe` registers a callback for a job id (called on the dispatcher thread: it
    must only set an event or hand over to an event loop); :meth:`listening` tells whether
    notifications arrive now. The connection opens at the first subscription and closes after
    :data:`IDLE_CLOSE_SECONDS` without one.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.pid = os.getpid()
        self._waiters: dict[int, list[Callback]] = {}
        # The callbacks of _waiters that a new progress of their job wakes too (watchers).
        self._watchers: dict[int, list[Callback]] = {}
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._failures = 0
        #: Connections opened so far (a benchmark and a test read it).
        self.connections_opened = 0

    def subscribe(self, job_id: int, callback: Callback, *, progress: bool = False) -> None:
        """Call ``callback`` when job ``job_id`` settles, or when a settlement may have been
        missed; with ``progress``, also when its progress changes (a watched job, 0029)."""
        with self._lock:
            self._waiters.setdefault(job_id, []).append(callback)
            if progress:
                self._watchers.setdefault(job_id, []).append(callback)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"jobguard-settled-{self.alias}", daemon=True
                )
                self._thread.start()
        if not self._listening.is_set():
            self._poke()

    def unsubscribe(self, job_id: int, callback: Callback) -> None:
        with self._lock:
            callbacks = self._waiters.get(job_id)
            if callbacks is not None and callback in callbacks:
                callbacks.remove(callback)
                if not callbacks:
                    del self._waiters[job_id]
            watchers = self._watchers.get(job_id)
            if watchers is not None and callback in watchers:
                watchers.remove(callback)
                if not watchers:
                    del self._watchers[job_id]

    def listening(self, timeout: float = 0.0) -> bool:
        """Whether notifications arrive now (waits up to ``timeout`` seconds for the LISTEN)."""
        return self._listening.wait(timeout) if timeout > 0 else self._listening.is_set()

    @property
    def waiters(self) -> int:
        """Waiters subscribed now (each waiter of each job)."""
        with self._lock:
            return sum(len(callbacks) for callbacks in self._waiters.values())

    # -- the dispatcher thread ----------------------------------------------------------------

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _run(self) -> None:
        conn: Any = None
        idle_since: float | None = None
        while True:
            if conn is None:
                with self._lock:
                    wanted = bool(self._waiters)
                if not wanted:
                    select.select([self._wake_r], [], [])  # until a waiter subscribes
                    self._drain()
                    continue
                conn = self._connect()
                if conn is None:
                    time.sleep(RECONNECT_DELAY_SECONDS)  # waiters poll meanwhile
                    continue
                self._listening.set()
                # Whatever settled while nobody listened: every waiter reads its row again.
                self._fire(None)
                idle_since = None
            try:
                ready, _, _ = select.select([conn.fileno(), self._wake_r], [], [], _SELECT_SECONDS)
                if self._wake_r in ready:
                    self._drain()
                if conn.fileno() in ready:
                    ids = {note.payload for note in conn.notifies(timeout=0)}
                    self._fire(ids)
            except Exception:
                logger.warning("settle_listen_lost alias=%s; reconnecting", self.alias, exc_info=True)
                self._listening.clear()
                _close(conn)
                conn = None
                self._fire(None)  # they poll their row once, then wait for the reconnect's wake-up
                continue
            now = time.monotonic()
            with self._lock:
                if self._waiters:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= IDLE_CLOSE_SECONDS:
                    # Under the lock: a waiter that subscribes from here on sees no LISTEN and
                    # waits for the next connection (whose opening wakes it) before flagging.
                    self._listening.clear()
                    _close(conn)
                    conn = None

    def _connect(self) -> Any:
        try:
            conn = listen_connection(self.alias, SETTLED_CHANNEL)
        except Exception:
            self._failures += 1
            if self._failures == 1 or self._failures % 30 == 0:
                logger.warning(
                    "settle_listen_failed alias=%s failures=%d; waiters poll",
                    self.alias,
                    self._failures,
                    exc_info=self._failures == 1,
                )
            return None
        self._failures = 0
        self.connections_opened += 1
        return conn

    def _fire(self, payloads: set[str] | None) -> None:
        """Call the callbacks of the jobs in ``payloads`` (their ids as text; a progress one,
        ``p`` and the id, only its watchers'); None: all of them."""
        with self._lock:
            if payloads is None:
                callbacks = [cb for group in self._waiters.values() for cb in group]
            else:
                callbacks = []
                for payload in payloads:
                    progress = payload.startswith(PROGRESS_MARK)
                    try:
                        job_id = int(payload[len(PROGRESS_MARK) :] if progress else payload)
                    except ValueError:
                        continue
                    group = (self._watchers if progress else self._waiters).get(job_id)
                    if group:
                        callbacks.extend(group)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.warning("settle_callback_failed alias=%s", self.alias, exc_info=True)


def _close(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: S110 - closing a broken connection may fail; nothing to do
        pass
