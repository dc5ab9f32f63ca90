"""Lease keeping, the heartbeat: the held jobs' leases extended and their locks renewed.

The heartbeat thread (:mod:`.heartbeat_thread`) asks on each tick; a lease (or lock) is
renewed once :data:`HEARTBEAT_FRACTION` of its visibility timeout (TTL) has passed, the
leases due in one statement. A lease or lock that could not be kept is reported to the
handler (its context's ``lease_lost`` / ``lock_lost``) and its ack refused. The progress
the handlers reported (``context.report_progress``) is written on the same ticks: at most one
statement every :data:`~django_jobguard.context.PROGRESS_WRITE_SECONDS`, however many jobs
report; a job that never reports costs none.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from .. import _faults, events, store
from ..context import PROGRESS_WRITE_SECONDS, ProgressReport
from ..exceptions import LockUnavailable
from ..log import job_fields
from .held import LOGGER_NAME, Held

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["HEARTBEAT_FRACTION", "LeaseKeeper", "renew_lock", "write_last_progress"]

#: Leases are renewed when this fraction of the visibility timeout has passed.
HEARTBEAT_FRACTION = 1 / 3


def renew_lock(held: Held, now: float, worker_id: str) -> None:
    """Extend the job's lock; if it is gone, say so to the handler and refuse the ack."""
    handle = held.lock
    if handle is None:
        return
    try:
        kept = handle.extend()
        cause = "it expired, and another owner may have taken it"
    except LockUnavailable as exc:
        # Unknown is lost: the store may have restarted empty and given the key away.
        kept, cause = False, str(exc)
    if kept:
        held.lock_renewed_at = now
        return
    if held.lock is not handle or held.lock_lost:
        return  # released by the executor meanwhile, or already reported
    held.lock_lost = True
    held.signals.lock_lost = True
    events.emit(events.LockFailed(held.job.queue_name, held.job.task_name, "lost"))
    fields = job_fields(held.job, worker_id, outcome="lock_lost")
    logger.warning(
        "lock_lost job_id=%s lock_key=%r; the job will not be acked: %s",
        held.job.id,
        fields["lock_key"],
        cause,
        extra=fields,
    )


def write_last_progress(alias: str, held: Held) -> None:
    """The handler returned: write its last progress report unless the heartbeat did (fenced).

    Called only for a handler that reported (``context.reported_progress`` set). Inside an
    ``atomic=True`` job's transaction it commits with the ack.
    """
    context = held.context
    report = None if context is None else context.reported_progress
    if report is None or not report.pending:
        return
    with report.lock:  # waits for a heartbeat write in flight, so ours lands last
        count, value = report.snapshot()
        if count == report.written:
            return
        store.write_progress(alias, [(held.job.id, held.job.lease_token, value)])
        report.mark_written(count, time.monotonic())


class LeaseKeeper:
    """Keeps the leases and locks of the jobs a worker holds."""

    def __init__(self, alias: str, worker_id: str) -> None:
        self.alias = alias
        self.worker_id = worker_id
        self._writes_while_busy: bool | None = None

    def write_progress(self, held: Sequence[Held], now: float) -> None:
        """Write the handlers' new progress reports in one statement, once one of them is due.

        A report is due :data:`PROGRESS_WRITE_SECONDS` after its job's last write; the other
        new reports go with it, so a worker sends one statement a second however many of its
        jobs report (a job's own writes stay at most two a second, then fall in step). A job
        whose handler is writing its last report itself is left to it. On SQLite an
        ``atomic=True`` job's open transaction holds the database: its report is written by
        its own thread when the handler returns, not here (the write would wait on it).
        """
        pending: list[tuple[Held, ProgressReport]] = []
        any_due = False
        for h in held:
            context = h.context
            report = None if context is None else context.reported_progress
            if report is None or not report.pending:
                continue
            if h.transaction_started_at and not self._writes_beside_transactions():
                continue
            pending.append((h, report))
            any_due = any_due or now - report.written_at >= PROGRESS_WRITE_SECONDS
        if not any_due:
            return
        taken: list[tuple[ProgressReport, int, tuple[int, str, dict[str, Any]]]] = []
        try:
            for h, report in pending:
                if not report.lock.acquire(blocking=False):
                    continue
                count, value = report.snapshot()
                taken.append((report, count, (h.job.id, h.job.lease_token, value)))
            if taken:
                store.write_progress(self.alias, [row for _, _, row in taken])
                for report, count, _ in taken:
                    report.mark_written(count, now)
        finally:
            for report, _, _ in taken:
                report.lock.release()

    def _writes_beside_transactions(self) -> bool:
        if self._writes_while_busy is None:
            self._writes_while_busy = store.writes_while_busy(self.alias)
        return self._writes_while_busy

    def renew_locks(self, active: Sequence[Held], now: float) -> None:
        """Renew the locks due, even of jobs whose lease is lost: their handlers still run."""
        for h in active:
            handle = h.lock
            if (
                handle is not None
                and not h.lock_lost
                and now - h.lock_renewed_at >= handle.ttl * HEARTBEAT_FRACTION
            ):
                renew_lock(h, now, self.worker_id)

    def renew_leases(self, active: Sequence[Held], now: float) -> list[Held]:
        """Extend the leases due in one statement; the jobs still held (lease not lost)."""
        held = [h for h in active if not h.lease_lost]
        due = [h for h in held if now - h.renewed_at >= h.job.visibility_timeout * HEARTBEAT_FRACTION]
        if not due:
            return held
        if _faults.ENABLED:
            _faults.maybe_crash("in_heartbeat")
        cancels: set[int] = set()
        renewed = store.heartbeat(
            self.alias, [(h.job.id, h.job.lease_token) for h in due], cancel_requested=cancels
        )
        for h in due:
            if h.job.id in renewed:
                h.renewed_at = now
                if h.job.id in cancels:
                    h.signals.cancel_requested = True
            else:
                self._lost(h)
        return held

    def give_up(self, stuck: Sequence[Held], stalled: float) -> None:
        """Stop renewing the leases of jobs stuck behind a blocked event loop past their bound.

        Their leases expire and the reaper puts the jobs back for other workers; the handlers
        see ``context.lease_lost``, and one not started yet is handed back, not started.
        """
        for h in stuck:
            h.lease_lost = True
            h.signals.lease_lost = True
            logger.warning(
                "lease_released job_id=%s task=%s stalled_for=%.2fs; the event loop it waits on is "
                "blocked past the job's timeout: its lease is left to expire, for another worker",
                h.job.id,
                h.job.task_name,
                stalled,
                extra=job_fields(h.job, self.worker_id, outcome="lease_released"),
            )

    def _lost(self, h: Held) -> None:
        h.lease_lost = True
        h.signals.lease_lost = True
        events.emit(events.LeaseLost(h.job.queue_name, h.job.task_name, "heartbeat"))
        logger.warning(
            "lease_lost job_id=%s; another worker may run it now",
            h.job.id,
            extra=job_fields(h.job, self.worker_id, outcome="lease_lost"),
        )
