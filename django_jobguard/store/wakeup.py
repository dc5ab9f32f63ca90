"""How an enqueue wakes idle workers: PostgreSQL's NOTIFY as ``JOBGUARD["NOTIFY"]`` says, and
Redis pub/sub where ``JOBGUARD["WAKEUP_CACHE"]`` names a cache.

**NOTIFY.** A PostgreSQL transaction that has called NOTIFY takes one lock of the whole server
(the notification queue's) as it commits, and holds it until its commit record is flushed: the
notifying commits of every database of the cluster run one at a time, however many clients
commit at once. So the mode decides which transactions notify:

- ``"coalesced"`` (the default): not the enqueuing transaction. Its commit hands the queue
  names to a thread of the process (:class:`_Notifier`, with a connection of its own), which
  sends them in a statement that commits without waiting for the disk (a lost NOTIFY costs a
  poll, never a job), then waits ``NOTIFY_INTERVAL`` seconds and sends what came meanwhile:
  at most one NOTIFY per queue per interval from each process, none on the committing thread,
  and every job announced within the interval after its commit.
- ``"row"``: the trigger notifies inside every enqueuing transaction (what every release did
  before the setting came): each of those commits takes the lock.
- ``"none"``: no NOTIFY; workers poll every ``POLL_INTERVAL``, or wake through Redis.

The database's triggers read the mode from ``jobguard_notify_mode()``, an IMMUTABLE function
returning a constant that :func:`install_notify_mode` replaces (``migrate`` runs it): the
triggers' WHEN is folded once per statement, so no row pays a lookup, and replacing a function
takes no lock on the jobs table. Why not a setting read per connection: a session's ``SET`` does
not follow a client through a transaction-mode pooler (PgBouncer), and a ``SET LOCAL`` per
transaction costs a round trip. A job put back in the queue (a lease handed back, an operator's
retry) is still notified by its trigger in the "row" and "coalesced" modes: those commits are
the workers' and the operators', not the application's.

**Redis.** SQLite and MariaDB/MySQL have no NOTIFY, and a PostgreSQL behind a transaction pooler
cannot LISTEN. With ``WAKEUP_CACHE`` naming a django-redis cache, an enqueue publishes its
queue names on a Redis channel once its transaction commits, and each idle worker's
:class:`~.listener.Listener` hears it and claims at once instead of at its next poll. This is
independent of ``NOTIFY``.

Both are best effort: a Redis or a NOTIFY that fails costs the wake-up, never the enqueue (the
job is committed already, and the worker still polls every ``POLL_INTERVAL``). Jobs due now
wake workers; a delayed job, a retry's backoff or a reaped lease is found at the next poll.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import Error, connections, transaction

from ..conf import NOTIFY_MODES, get_settings
from .common import NOTIFY_CHANNEL

__all__ = [
    "MODE_FUNCTION",
    "Subscriber",
    "announce",
    "channel",
    "install_notify_mode",
    "installed_notify_mode",
    "wakeup_source",
]

logger = logging.getLogger("django_jobguard.store")

#: Redis pub/sub channels are shared by every logical database of a server, so the channel
#: carries the job database's name: two projects on one Redis do not wake each other.
CHANNEL_PREFIX = "jobguard:wake:"

#: The PostgreSQL function (migration 0025) whose constant the NOTIFY triggers compare.
MODE_FUNCTION = "jobguard_notify_mode"

#: Seconds between two warnings about a Redis that refuses a publish, or a failed NOTIFY.
_WARN_EVERY_SECONDS = 60.0
_last_warning = {"redis": -_WARN_EVERY_SECONDS, "notify": -_WARN_EVERY_SECONDS}

# Per connection: the queue names its open transaction announces, the on-commit callback that
# sends them, and where that callback sits in the connection's run_on_commit list. One wake-up
# per transaction and queue, however many rows it inserted (as NOTIFY is on PostgreSQL); names
# of a transaction rolled back go with its callback.
_Pending = tuple[set[str], Callable[[], None], int]
_pending: weakref.WeakKeyDictionary[Any, _Pending] = weakref.WeakKeyDictionary()

#: Seconds a process's NOTIFY connection stays open with nothing to send. Under 5 s: a
#: ``DROP DATABASE`` (a test run's teardown) waits that long for other sessions to end.
IDLE_CLOSE_SECONDS = 2.0

# alias -> the thread that sends this process's coalesced NOTIFYs to it.
_notifiers: dict[str, _Notifier] = {}
_notifiers_lock = threading.Lock()

# One statement, its own transaction (the caller is in autocommit after its commit): NOTIFY
# each queue, and commit without waiting for the WAL flush, so the server-wide lock the
# commit takes is held for microseconds. SET LOCAL lasts for this transaction only, which
# is what a transaction-mode pooler allows.
_NOTIFY_SQL = (
    "SELECT set_config('synchronous_commit', 'off', true), pg_notify(%s, queue_name) "
    "FROM unnest(%s::text[]) AS queue_name"
)
# In a transaction run by hand (autocommit off, outside atomic): no commit hook to wait for,
# so the NOTIFY joins that transaction, as with the "row" mode.
_NOTIFY_IN_TRANSACTION_SQL = "SELECT pg_notify(%s, queue_name) FROM unnest(%s::text[]) AS queue_name"


def channel(alias: str) -> str:
    """The channel the enqueues to database ``alias`` publish on."""
    return CHANNEL_PREFIX + str(connections[alias].settings_dict.get("NAME") or alias)


def wakeup_source(alias: str) -> tuple[str, str] | None:
    """``(cache alias, channel)`` a worker of ``alias`` subscribes to, or None when not configured."""
    cache_alias = get_settings().wakeup_cache
    return (cache_alias, channel(alias)) if cache_alias else None


def announce(alias: str, queues: Iterable[str]) -> None:
    """Wake the idle workers of ``queues`` (whose new jobs are due) once the current transaction
    of ``alias`` commits: a coalesced NOTIFY on PostgreSQL and a Redis publish, as configured.

    Outside a transaction this happens now; a rolled-back transaction sends nothing (its
    callback is dropped with the names it holds).
    """
    conf = get_settings()
    conn = connections[alias]
    notify = conf.notify == "coalesced" and conn.vendor == "postgresql"
    if not (notify or conf.wakeup_cache):
        return
    names = set(queues)
    if not names:
        return
    if not conn.in_atomic_block and not conn.get_autocommit():
        if notify:
            _notify_in_transaction(conn, names)
        return  # (Redis: nothing tells when that transaction commits; workers poll)
    entry = _pending.get(conn)
    if entry is not None and conn.in_atomic_block and _still_to_run(conn, entry[1], entry[2]):
        entry[0].update(names)  # this transaction's wake-up, not sent yet
        return
    callback = functools.partial(
        _flush, names, alias, conf.wakeup_cache, channel(alias) if conf.wakeup_cache else "", notify
    )
    _pending[conn] = (names, callback, len(conn.run_on_commit))
    transaction.on_commit(callback, using=alias)


def _still_to_run(conn: Any, callback: Callable[[], None], index: int) -> bool:
    """Whether ``callback`` still waits in ``conn``'s on-commit list (not run, not rolled back)."""
    waiting = conn.run_on_commit
    if index < len(waiting) and waiting[index][1] is callback:
        return True
    # A savepoint's rollback rebuilds the list, moving what it kept.
    return any(item[1] is callback for item in waiting)


def _flush(queues: set[str], alias: str, cache_alias: str, name: str, notify: bool) -> None:
    if notify:
        _notifier(alias).add(queues)
    if cache_alias:
        _publish(cache_alias, name, queues)


def _notifier(alias: str) -> _Notifier:
    notifier = _notifiers.get(alias)
    if notifier is None or notifier.pid != os.getpid():  # none yet, or a forked child's copy
        with _notifiers_lock:
            notifier = _notifiers.get(alias)
            if notifier is None or notifier.pid != os.getpid():
                notifier = _notifiers[alias] = _Notifier(alias)
    return notifier


class _Notifier:
    """The thread of one process that sends the coalesced NOTIFYs of one alias.

    A commit only adds its queue names here (no I/O on the committing thread). The thread sends
    them at once in one statement, then waits ``NOTIFY_INTERVAL`` and sends what came meanwhile:
    at most one NOTIFY per queue per interval from this process, and every job announced within
    the interval after its commit. Its connection is its own (Django's, for this thread), closed
    once idle for :data:`IDLE_CLOSE_SECONDS`.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.pid = os.getpid()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"jobguard-notify-{alias}", daemon=True)
        self._thread.start()

    def add(self, queues: Iterable[str]) -> None:
        with self._lock:
            self._pending.update(queues)
        self._wake.set()

    def _run(self) -> None:
        while True:
            if not self._wake.wait(IDLE_CLOSE_SECONDS):
                self._close()
                self._wake.wait()
            self._wake.clear()
            with self._lock:
                queues, self._pending = self._pending, set()
            if queues:
                self._send(sorted(queues))
                interval = get_settings().notify_interval
                if interval >= IDLE_CLOSE_SECONDS:
                    self._close()  # idle that long: not kept open (see IDLE_CLOSE_SECONDS)
                time.sleep(interval)  # what comes meanwhile waits for the next

    def _send(self, queues: list[str]) -> None:
        for _ in range(2):  # a stale connection (a restarted server, a backend ended): once more on a new one
            try:
                with connections[self.alias].cursor() as cursor:
                    cursor.execute(_NOTIFY_SQL, [NOTIFY_CHANNEL, queues])
                return
            except Error:  # InterfaceError too: a closed connection
                self._close()
        _warn("notify", "wakeup_notify_failed alias=%s; workers find the jobs at their next poll", self.alias)

    def _close(self) -> None:
        try:
            connections[self.alias].close()
        except Error:  # closing a broken connection may fail; nothing to do
            pass


def _notify_in_transaction(conn: Any, queues: set[str]) -> None:
    try:
        with conn.cursor() as cursor:
            cursor.execute(_NOTIFY_IN_TRANSACTION_SQL, [NOTIFY_CHANNEL, sorted(queues)])
    except Error:  # InterfaceError too: a closed connection
        _warn("notify", "wakeup_notify_failed alias=%s; workers find the jobs at their next poll", conn.alias)
        raise  # the caller's transaction is aborted now: it must learn it here


def _publish(cache_alias: str, name: str, queues: set[str]) -> None:
    try:
        from django_redis import get_redis_connection

        get_redis_connection(cache_alias).publish(name, "\n".join(sorted(queues)))
    except Exception:
        _warn(
            "redis", "wakeup_publish_failed cache=%s; workers find the jobs at their next poll", cache_alias
        )


def _warn(kind: str, message: str, *args: Any) -> None:
    now = time.monotonic()
    if now - _last_warning[kind] >= _WARN_EVERY_SECONDS:
        _last_warning[kind] = now
        logger.warning(message, *args, exc_info=True)


# -- the mode installed in the database ------------------------------------------------------

#: The statement that installs each mode (the modes are a closed set: no value is formatted in).
_INSTALL_SQL = {
    mode: (
        f"CREATE OR REPLACE FUNCTION {MODE_FUNCTION}() RETURNS text "
        f"LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '{mode}'::text $$"
    )
    for mode in NOTIFY_MODES
}


def installed_notify_mode(alias: str) -> str | None:
    """The NOTIFY mode the database of ``alias`` runs; None off PostgreSQL or before migration 0025."""
    conn = connections[alias]
    if conn.vendor != "postgresql":
        return None
    with conn.cursor() as cursor:
        cursor.execute("SELECT to_regproc(%s) IS NOT NULL", [MODE_FUNCTION])
        if not cursor.fetchone()[0]:
            return None
        cursor.execute(f"SELECT {MODE_FUNCTION}()")
        return str(cursor.fetchone()[0])


def install_notify_mode(alias: str) -> str | None:
    """Make the triggers of ``alias`` follow ``JOBGUARD["NOTIFY"]``; the mode installed (None:
    not PostgreSQL, or migration 0025 not applied). Replaces the function only if it differs.

    Needs the right to replace the function (its owner: the role that ran the migrations).
    """
    installed = installed_notify_mode(alias)
    wanted = get_settings().notify
    if installed is None or installed == wanted:
        return installed
    with connections[alias].cursor() as cursor:
        cursor.execute(_INSTALL_SQL[wanted])
    logger.info("notify_mode_installed alias=%s mode=%s previous=%s", alias, wanted, installed)
    return wanted


def install_after_migrate(using: str = "default", **kwargs: Any) -> None:
    """``post_migrate`` receiver: install the setting's NOTIFY mode where the jobs' triggers are."""
    install_notify_mode(using)


class Subscriber:
    """A daemon thread that listens on the wake-up channel and writes a byte to ``fd`` per match.

    The worker's :class:`~.listener.Listener` selects on the other end of that pipe beside
    its own, so one wait covers LISTEN, Redis and the worker's own wake-ups.
    """

    #: Seconds before a lost subscription is tried again.
    RECONNECT_DELAY_SECONDS = 5.0

    def __init__(self, cache_alias: str, name: str, queues: Sequence[str] | None, fd: int) -> None:
        self.cache_alias = cache_alias
        self.channel = name
        self.queues = set(queues) if queues else None
        self._fd = fd
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobguard-wakeup", daemon=True)

    def start(self, timeout: float = 5.0) -> bool:
        """Start listening; True once subscribed (waits up to ``timeout`` seconds for it)."""
        self._thread.start()
        return self._subscribed.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started (a burst worker never starts it)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        from django_redis import get_redis_connection

        failing = False
        while not self._stop.is_set():
            pubsub = None
            try:
                pubsub = get_redis_connection(self.cache_alias).pubsub()
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        # Confirmed by the server: from here no publish is missed.
                        self._subscribed.set()
                        if failing:
                            logger.info("wakeup_resumed cache=%s channel=%s", self.cache_alias, self.channel)
                            failing = False
                    elif message["type"] == "message" and self._wanted(message["data"]):
                        self._notify()
            except Exception:
                self._subscribed.clear()
                if not failing:  # once per outage, not once per attempt
                    logger.warning(
                        "wakeup_lost cache=%s channel=%s; polling until Redis answers",
                        self.cache_alias,
                        self.channel,
                        exc_info=True,
                    )
                    failing = True
                self._stop.wait(self.RECONNECT_DELAY_SECONDS)
            finally:
                if pubsub is not None:
                    try:
                        pubsub.close()
                    except Exception:  # noqa: S110 - closing a broken connection may fail; nothing to do
                        pass

    def _notify(self) -> None:
        try:
            os.write(self._fd, b"x")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending already

    def _wanted(self, data: Any) -> bool:
        if self.queues is None:
            return True
        text = data.decode() if isinstance(data, bytes) else str(data)
        return bool(self.queues & set(text.split("\n")))
