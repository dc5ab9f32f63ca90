"""Worker beats and per-minute outcome counts: what the admin's workers and health pages read.

A *worker beat* is the upsert of the worker's own row (:class:`~django_jobguard.models.WorkerBeat`:
alive, where, with how many jobs in hand); it is not the *heartbeat*, which renews the leases
of the jobs the worker holds (:mod:`django_jobguard.worker.leases`). The heartbeat thread
calls :meth:`Beat.maybe_beat` on each of its ticks; once per
:data:`WORKER_BEAT_INTERVAL_SECONDS` it writes one upsert of its
:class:`~django_jobguard.models.WorkerBeat` row and one upsert of the outcome counts
gathered since (:func:`count`, called where the worker records its metrics), so a job
costs no statement of its own. Once a minute it also samples each queue's oldest due age
and prunes rows older than :data:`KEEP_SECONDS`.

Minutes are the worker's wall clock (UTC), truncated; last-beat times are the database's.
"""

from __future__ import annotations

import datetime
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from .. import events
from ..store import beats as store_beats
from ..store.beats import (
    CONSOLE_ROWS_KEPT_FOR_SECONDS,
    STALE_AFTER_SECONDS,
    WORKER_BEAT_INTERVAL_SECONDS,
    is_stale,
)
from .stats import oldest_due_ages

logger = logging.getLogger("django_jobguard.worker")

__all__ = [
    "OUTCOMES",
    "STALE_AFTER_SECONDS",
    "WORKER_BEAT_INTERVAL_SECONDS",
    "Beat",
    "clash_row_id",
    "count",
    "is_stale",
    "shared_worker_id",
]

#: Seconds between two samples of the oldest due ages (a skip scan of the due index on PostgreSQL).
OLDEST_AGE_SAMPLE_SECONDS = 60.0
#: Per-minute rows and worker rows older than this are deleted by the writers (the rule is the
#: store's, which maintenance's retention also lists).
KEEP_SECONDS = CONSOLE_ROWS_KEPT_FOR_SECONDS
#: What :func:`count` counts, in the order of the per-minute columns.
OUTCOMES = ("succeeded", "failed", "retried", "dead_lettered")
#: Minutes held in memory at most, so a process that never flushes (a web process
#: that dead-letters) cannot grow without bound.
_MAX_PENDING_BUCKETS = 10_000

_pending: dict[tuple[str, int], list[int]] = {}
_pending_lock = threading.Lock()


def count(queue: str, outcome: str) -> None:
    """Count one outcome of ``queue`` in the current minute (in memory, flushed by a beat)."""
    minute = int(time.time() // 60)
    with _pending_lock:
        bucket = _pending.get((queue, minute))
        if bucket is None:
            if len(_pending) >= _MAX_PENDING_BUCKETS:
                _pending.pop(next(iter(_pending)))
            bucket = _pending[(queue, minute)] = [0, 0, 0, 0]
        bucket[OUTCOMES.index(outcome)] += 1


def _take_pending() -> dict[tuple[str, int], list[int]]:
    global _pending
    with _pending_lock:
        taken, _pending = _pending, {}
    return taken


def _give_back(taken: dict[tuple[str, int], list[int]]) -> None:
    with _pending_lock:
        for key, values in taken.items():
            bucket = _pending.setdefault(key, [0, 0, 0, 0])
            for index, value in enumerate(values):
                bucket[index] += value


#: The row id a process takes once it finds another live process beating under its worker id.
_CLASH_SUFFIX = " (pid {pid} on {host})"
_CLASH_ROW = re.compile(r"^(?P<worker_id>.*) \(pid \d+ on [^()]*\)$", re.DOTALL)
#: The beat row's ``worker_id`` column.
_ROW_ID_CHARS = 128


def clash_row_id(worker_id: str, host: str, pid: int) -> str:
    """The beat row of one of two processes sharing ``worker_id``: ``"w1 (pid 42 on web-3)"``."""
    suffix = _CLASH_SUFFIX.format(pid=pid, host=host[:60])
    return worker_id[: max(0, _ROW_ID_CHARS - len(suffix))] + suffix


def shared_worker_id(row_id: str) -> str | None:
    """The worker id a row of :func:`clash_row_id` stands for; None for an ordinary row."""
    match = _CLASH_ROW.match(row_id)
    return match["worker_id"] if match else None


class Beat:
    """Writes one worker's beat (its row) and the outcome counts, once per interval."""

    def __init__(
        self,
        *,
        worker_id: str,
        alias: str,
        queues: Sequence[str] | None,
        concurrency: int,
        pid: int,
        async_slots: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self.async_slots = async_slots
        self.alias = alias
        self.queues = ",".join(queues) if queues else "*"
        self.concurrency = concurrency
        self.pid = pid
        self.host = socket.gethostname()[:255]
        self.started_at = timezone.now()
        self._next_beat = 0.0
        self._next_sample = 0.0
        #: The row this process upserts: its worker id, or its own once another live process
        #: turned out to beat under the same id (the two would flap one row between them).
        self.row_id = worker_id
        self._beaten = False

    def maybe_beat(
        self, now: float, jobs_in_hand: int, loop: Callable[[], tuple[int, float]] | None = None
    ) -> bool:
        """Beat if the interval has passed since the last one; whether it did.

        ``loop`` gives the event loop's coroutines running and its worst lag (seconds) since
        it was last asked (workers with async slots).
        """
        if now < self._next_beat:
            return False
        self._next_beat = now + WORKER_BEAT_INTERVAL_SECONDS
        in_use, lag = loop() if loop is not None else (0, 0.0)
        self.beat(jobs_in_hand, in_use, round(lag * 1000))
        if now >= self._next_sample:
            self._next_sample = now + OLDEST_AGE_SAMPLE_SECONDS
            self.sample_oldest_ages()
            self.prune()
        return True

    def beat(self, jobs_in_hand: int, async_in_use: int = 0, loop_lag_ms: int = 0) -> None:
        """Upsert this worker's row and add the pending outcome counts (two statements).

        After its first beat, a process reads its row's process first (one more statement):
        another process wrote it since, so two live processes share the worker id. It warns
        (``worker_id_clash``) and beats in a row of its own from then on (:func:`clash_row_id`).
        A restarted process takes its predecessor's row at its first beat without a warning:
        a dead process does not write again.
        """
        if self._beaten and self.row_id == self.worker_id:
            self._check_clash()
        store_beats.upsert_worker_beat(
            self.alias,
            worker_id=self.row_id,
            host=self.host,
            pid=self.pid,
            queues=self.queues[:1000],
            concurrency=self.concurrency,
            started_at=self.started_at,
            jobs_in_hand=jobs_in_hand,
            async_slots=self.async_slots,
            async_in_use=async_in_use,
            loop_lag_ms=loop_lag_ms,
        )
        self._beaten = True
        self.flush()

    def _check_clash(self) -> None:
        other = store_beats.worker_beat_process(self.alias, self.worker_id)
        if other is None or other == (self.host, self.pid):
            return
        self.row_id = clash_row_id(self.worker_id, self.host, self.pid)
        logger.warning(
            "worker_id_clash worker_id=%r host=%r pid=%s other_host=%r other_pid=%s; another live "
            "process beats under this worker id: give each process its own (--worker-id, "
            'JOBGUARD["WORKER_ID"]); this one now beats as %r',
            self.worker_id,
            self.host,
            self.pid,
            other[0],
            other[1],
            self.row_id,
            extra={"worker_id": self.worker_id},
        )

    def leave(self) -> None:
        """Take this worker's row off the workers list: it stopped cleanly (its last beat).

        What remains in the list is what is running, and the workers that vanished without a
        word (killed, frozen, cut off from the database), shown as not beating. A database
        that does not answer keeps the row, which then reads as not beating.
        """
        try:
            store_beats.delete_worker_beat(self.alias, self.row_id, self.host, self.pid)
        except DatabaseError:
            logger.warning(
                "worker_beat_not_removed worker_id=%s; the workers list shows it as not beating",
                self.worker_id,
                exc_info=True,
                extra={"worker_id": self.worker_id},
            )

    def flush(self) -> None:
        """Add the outcome counts gathered since the last flush to their minutes (one statement)."""
        taken = _take_pending()
        if not taken:
            return
        counts = [
            (queue, datetime.datetime.fromtimestamp(minute * 60, tz=datetime.UTC), values)
            for (queue, minute), values in sorted(taken.items())
        ]
        try:
            store_beats.add_minute_counts(self.alias, OUTCOMES, counts)
        except Exception:
            _give_back(taken)  # counted again at the next beat
            raise

    def sample_oldest_ages(self) -> None:
        """Record each queue's oldest due age in this minute (the largest sample wins)."""
        ages = oldest_due_ages(self.alias)
        if not ages:
            return
        at = datetime.datetime.fromtimestamp(int(time.time() // 60) * 60, tz=datetime.UTC)
        store_beats.record_oldest_ages(self.alias, at, sorted(ages.items()))

    def prune(self) -> None:
        """Delete per-minute rows and worker rows older than :data:`KEEP_SECONDS`."""
        store_beats.prune_console_rows(self.alias, datetime.timedelta(seconds=KEEP_SECONDS))


def sink(event: Any) -> None:
    """The console's sink of :mod:`django_jobguard.events`: outcomes per queue and minute."""
    kind = type(event)
    if kind is events.JobSucceeded:
        count(event.queue, "succeeded")
    elif kind is events.JobFailed:
        count(event.queue, "failed")
        if event.retried:
            count(event.queue, "retried")
    elif kind is events.JobDeadLettered:
        count(event.queue, "dead_lettered")
