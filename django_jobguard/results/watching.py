"""What wakes ``Job.watch()`` and ``Job.awatch()`` between two reads of the job's row.

On PostgreSQL (where :func:`~django_jobguard.store.settled.settle_listener` gives a listener)
the watcher subscribes to its job's progress and settlement on the process's one LISTEN
connection, flags the row ``waited`` (migration 0029's trigger then notifies each new
progress, 0027's the settlement) and reads the row only when woken, or every
:data:`RECHECK_SECONDS` in case a notification was lost with a reconnect. Elsewhere, inside a
transaction, or while the LISTEN connection cannot open, the watcher polls its row every
``interval`` seconds as before: :func:`watch_wakeup` returns None there.
"""

from __future__ import annotations

import asyncio
import threading

from asgiref.sync import sync_to_async
from django.db import connections

from ..store.settled import SettleListener, mark_waited, settle_listener
from .waiting import LISTEN_TIMEOUT_SECONDS, _Wakeup

__all__ = ["RECHECK_SECONDS", "AsyncWatchWakeup", "WatchWakeup", "awatch_wakeup", "watch_wakeup"]

#: Seconds between two reads of a watched row whose changes are notified: a backstop only.
RECHECK_SECONDS = 5.0


class WatchWakeup:
    """A watcher's subscription: :meth:`wait` until woken, :meth:`close` when done."""

    def __init__(self, listener: SettleListener, job_id: int) -> None:
        self.listener = listener
        self.job_id = job_id
        self.event = threading.Event()
        listener.subscribe(job_id, self.event.set, progress=True)

    def wait(self, seconds: float) -> None:
        """Until woken (or woken since the last wait), or ``seconds``; the next read sees
        whatever woke it."""
        self.event.wait(min(seconds, RECHECK_SECONDS))
        self.event.clear()

    def close(self) -> None:
        self.listener.unsubscribe(self.job_id, self.event.set)


def watch_wakeup(alias: str, job_id: int, listen_timeout: float) -> WatchWakeup | None:
    """Subscribe, make sure the LISTEN is on, flag the row (in this order, so the first read
    after it misses nothing); None where the watcher polls instead."""
    if connections[alias].in_atomic_block:
        return None  # the flag would hold the row's lock until the commit: poll
    listener = settle_listener(alias)
    if listener is None:
        return None
    wakeup = WatchWakeup(listener, job_id)
    try:
        if not listener.listening(min(LISTEN_TIMEOUT_SECONDS, max(listen_timeout, 0.0))):
            wakeup.close()
            return None
        mark_waited(alias, job_id)  # False: settled already, which the first read sees
    except BaseException:
        wakeup.close()
        raise
    return wakeup


class AsyncWatchWakeup:
    """:class:`WatchWakeup` for a coroutine: woken on its event loop."""

    def __init__(self, listener: SettleListener, job_id: int) -> None:
        self.listener = listener
        self.job_id = job_id
        self.wake = _Wakeup(asyncio.get_running_loop())
        listener.subscribe(job_id, self.wake, progress=True)

    async def wait(self, seconds: float) -> None:
        await self.wake.wait(min(seconds, RECHECK_SECONDS))
        self.wake.woken = False

    def close(self) -> None:
        self.listener.unsubscribe(self.job_id, self.wake)


def _flag(alias: str, job_id: int) -> bool:
    """Flag the row outside a transaction; False inside one (poll there)."""
    if connections[alias].in_atomic_block:
        return False
    mark_waited(alias, job_id)
    return True


async def awatch_wakeup(alias: str, job_id: int, listen_timeout: float) -> AsyncWatchWakeup | None:
    """:func:`watch_wakeup` from a coroutine."""
    listener = await sync_to_async(settle_listener, thread_sensitive=True)(alias)
    if listener is None:
        return None
    wakeup = AsyncWatchWakeup(listener, job_id)
    try:
        if not listener.listening():
            wait_for = min(LISTEN_TIMEOUT_SECONDS, max(listen_timeout, 0.0))
            if not await asyncio.get_running_loop().run_in_executor(None, listener.listening, wait_for):
                wakeup.close()
                return None
        if not await sync_to_async(_flag, thread_sensitive=True)(alias, job_id):
            wakeup.close()
            return None
    except BaseException:
        wakeup.close()
        raise
    return wakeup
