"""The jobs one worker holds, and the only code that moves them from one state to the next.

The claimer :meth:`~Slots.add`\\ s jobs; each executor thread takes the :meth:`~Slots.next`
one, :meth:`~Slots.start`\\ s and :meth:`~Slots.finish`\\ es it; the watchdog
:meth:`~Slots.abandon`\\ s one past its hard timeout; shutdown :meth:`~Slots.close`\\ s the
slots and :meth:`~Slots.drain`\\ s them. Every change happens under one lock, so exactly one of
those settles a job: a job the watchdog abandoned is not finished by its thread as well.

With ``--async-slots``, :meth:`~Slots.route` sends the jobs of coroutine tasks to the async
executor (:mod:`.aio`) instead of the executor threads' queue; the same methods settle them.

Nothing here touches the database: the unit tests drive every transition without one.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable

from .. import store
from ..outcome import HeldState
from .held import Held

__all__ = ["Slots"]

_ACTIVE = (HeldState.WAITING, HeldState.RUNNING)


class Slots:
    """The held jobs of one worker: from claim to settle, in one place."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, Held] = {}
        self._ready: queue.SimpleQueue[Held | None] = queue.SimpleQueue()
        self._freed = threading.Event()
        #: Finishes since :meth:`clear_freed`, and how many of them wake the waiter (see
        #: :meth:`wait_freed`; None: only the one that frees the last slot).
        self._finishes = 0
        self._wake_after: int | None = 1
        self._closed = False
        #: Jobs whose executor finished them (run, or handed back before starting).
        self.finished = 0
        #: Running jobs given up on (hard timeout, or shutdown's grace period over).
        self.abandoned = 0
        #: Held jobs that run on the event loop (see :meth:`route`).
        self.on_loop = 0
        self._to_loop: Callable[[store.ClaimedJob], bool] | None = None
        self._loop_sink: Callable[[list[Held]], None] = lambda helds: None

    def __len__(self) -> int:
        """Jobs held: waiting for an executor or running."""
        return len(self._held)

    @property
    def on_threads(self) -> int:
        """Held jobs that run on the executor threads."""
        return len(self._held) - self.on_loop

    def route(self, to_loop: Callable[[store.ClaimedJob], bool], sink: Callable[[list[Held]], None]) -> None:
        """Send the jobs ``to_loop`` picks to ``sink`` (the async executor), not to the threads."""
        self._to_loop = to_loop
        self._loop_sink = sink

    def _forget(self, held: Held) -> None:
        if self._held.pop(held.job.id, None) is not None and held.on_loop:
            self.on_loop -= 1

    # -- the claimer --------------------------------------------------------------------

    def add(self, jobs: Iterable[store.ClaimedJob], now: float) -> int:
        """Hold freshly claimed jobs and queue them for the executors; how many."""
        added = 0
        to_loop, loop_jobs = self._to_loop, []
        with self._lock:
            for job in jobs:
                held = Held(job=job, renewed_at=now)
                self._held[job.id] = held
                if to_loop is not None and to_loop(job):
                    held.on_loop = True
                    self.on_loop += 1
                    loop_jobs.append(held)
                else:
                    self._ready.put(held)
                added += 1
        if loop_jobs:
            self._loop_sink(loop_jobs)
        return added

    def freed(self) -> None:
        """Say that room was made (a job finished, an ack was written, the worker stops)."""
        self._freed.set()

    def wait_freed(self, timeout: float, finishes: int | None = 1) -> bool:
        """Wait until room is made, at most ``timeout`` seconds; whether it was.

        ``finishes``: how many finishes since :meth:`clear_freed` make room worth waking for
        (None: only one that leaves no job held). :meth:`freed` and :meth:`abandon` always wake.
        """
        with self._lock:
            self._wake_after = finishes
            # Finishes between the look and now were judged by the previous count: judge them again.
            if finishes is not None and self._finishes >= finishes:
                return True
        return self._freed.wait(timeout)

    def clear_freed(self) -> None:
        """Forget earlier notices, before looking at the room there is."""
        self._freed.clear()
        with self._lock:
            self._finishes = 0

    # -- executors ----------------------------------------------------------------------

    def next(self) -> Held | None:
        """The next job to run, waiting for one; None tells the executor to exit."""
        return self._ready.get()

    def start(self, held: Held, connection: object) -> bool:
        """Mark the job running on ``connection``; False if it must not start (closing, taken)."""
        with self._lock:
            if self._closed or held.state is not HeldState.WAITING:
                return False
            held.state = HeldState.RUNNING
            held.started_at = time.monotonic()
            held.connection = connection
            return True

    def finish(self, held: Held) -> bool:
        """Release the job's slot once its executor is done; True if the job was abandoned.

        An abandoned job's slot went to a replacement thread already: its old executor
        must exit instead of taking another job.
        """
        with self._lock:
            if held.state is HeldState.ABANDONED:
                return True
            if held.state in _ACTIVE:
                held.state = HeldState.DONE
            self._forget(held)
            self.finished += 1
            self._finishes += 1
            after = self._wake_after
            wake = (after is not None and self._finishes >= after) or not self._held
        # The room was made above, before this check: a loop that clears the notice and then
        # looks at the room sees it, so an Event already set needs no set() (its lock, per job).
        if wake and not self._freed.is_set():
            self._freed.set()
        return False

    def taken_over(self, held: Held) -> bool:
        """Whether the watchdog or shutdown settles this job instead of its own thread."""
        with self._lock:
            return held.state is HeldState.ABANDONED

    def handed_back(self, held: Held) -> None:
        """The job went back to the queue (its lease given up)."""
        with self._lock:
            held.state = HeldState.HANDED_BACK

    # -- the heartbeat and the watchdog -------------------------------------------------

    def active(self) -> list[Held]:
        """The jobs whose leases and locks are still to keep: waiting or running."""
        with self._lock:
            return [h for h in self._held.values() if h.state in _ACTIVE]

    def abandon(self, held: Held) -> bool:
        """Give up on a running job (its thread cannot be stopped); False if it is not running."""
        with self._lock:
            if held.state is not HeldState.RUNNING:
                return False
            held.state = HeldState.ABANDONED
            self._forget(held)
            self.abandoned += 1
        self._freed.set()
        return True

    # -- shutdown -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Start no more jobs. Only sets a flag: safe from a signal handler."""
        self._closed = True

    def release_executors(self, count: int) -> None:
        """Tell ``count`` executors waiting for a job to exit."""
        for _ in range(count):
            self._ready.put(None)

    def drain(self) -> tuple[list[Held], list[Held]]:
        """The running jobs, and the waiting ones, now marked as being handed back."""
        with self._lock:
            running = [h for h in self._held.values() if h.state is HeldState.RUNNING]
            waiting = [h for h in self._held.values() if h.state is HeldState.WAITING]
            for h in waiting:
                h.state = HeldState.HANDING_BACK
        return running, waiting

    def remove(self, held: Held) -> None:
        """Forget a job handed back by shutdown."""
        with self._lock:
            self._forget(held)
