"""Wake-ups through Redis pub/sub, for a job store without LISTEN/NOTIFY.

SQLite and MariaDB/MySQL have no NOTIFY, and a PostgreSQL behind a transaction pooler cannot
LISTEN. With ``JOBGUARD["WAKEUP_CACHE"]`` naming a django-redis cache, an enqueue publishes
its queue names on a Redis channel once its transaction commits, and each idle worker's
:class:`~.listener.Listener` hears it and claims at once instead of at its next poll.

Publishing is best effort: a Redis that is down costs the wake-up, never the enqueue (the
job is committed already, and the worker still polls every ``POLL_INTERVAL``). New jobs wake
workers; a retry's backoff or a reaped lease is found at the next poll, as on PostgreSQL
behind a pooler.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections, transaction

from ..conf import get_settings

__all__ = ["Subscriber", "announce", "channel", "wakeup_source"]

logger = logging.getLogger("django_jobguard.store")

#: Redis pub/sub channels are shared by every logical database of a server, so the channel
#: carries the job database's name: two projects on one Redis do not wake each other.
CHANNEL_PREFIX = "jobguard:wake:"

#: Seconds between two warnings about a Redis that refuses a publish.
_WARN_EVERY_SECONDS = 60.0
_last_warning = [-_WARN_EVERY_SECONDS]

# Queue names waiting for the commit of the enqueueing transaction, per connection. One
# publish per transaction and queue, however many rows it inserted (as NOTIFY is on PostgreSQL).
_pending: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def channel(alias: str) -> str:
    """The channel the enqueues to database ``alias`` publish on."""
    return CHANNEL_PREFIX + str(connections[alias].settings_dict.get("NAME") or alias)


def wakeup_source(alias: str) -> tuple[str, str] | None:
    """``(cache alias, channel)`` a worker of ``alias`` subscribes to, or None when not configured."""
    cache_alias = get_settings().wakeup_cache
    return (cache_alias, channel(alias)) if cache_alias else None


def announce(alias: str, queues: Iterable[str]) -> None:
    """Publish ``queues`` for the idle workers once the current transaction of ``alias`` commits.

    Outside a transaction the publish happens now; a rolled-back transaction publishes nothing
    (its callbacks are dropped, and a name left behind only costs a spare wake-up later).
    """
    cache_alias = get_settings().wakeup_cache
    if not cache_alias:
        return
    conn = connections[alias]
    pending = _pending.setdefault(conn, set())
    pending.update(queues)
    transaction.on_commit(functools.partial(_flush, conn, cache_alias, channel(alias)), using=alias)


def _flush(conn: Any, cache_alias: str, name: str) -> None:
    queues = _pending.pop(conn, None)
    if not queues:
        return  # an earlier callback of this commit published them
    try:
        from django_redis import get_redis_connection

        get_redis_connection(cache_alias).publish(name, "\n".join(sorted(queues)))
    except Exception:
        now = time.monotonic()
        if now - _last_warning[0] >= _WARN_EVERY_SECONDS:
            _last_warning[0] = now
            logger.warning(
                "wakeup_publish_failed cache=%s; workers find the jobs at their next poll",
                cache_alias,
                exc_info=True,
            )


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
