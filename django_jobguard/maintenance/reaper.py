"""The reaper: jobs whose lease expired are made visible again, or dead-lettered on their last attempt."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from .. import dlq, events, retry, store
from ..encryption import DecryptionError, is_encrypted, keyring
from ..encryption.payloads import ERROR, TRACEBACK, open_text
from ..exceptions import LeaseLost
from ..log import job_fields
from ..models import DeadLetterReason, Job

logger = logging.getLogger("django_jobguard.worker")

__all__ = ["LEASE_EXPIRED_MESSAGE", "ReapResult", "Reaper"]

#: What a dead letter says of a lease that expired on the job's last attempt.
LEASE_EXPIRED_MESSAGE = "the lease expired on the last attempt (worker crashed, froze or cut off)"
#: How the attempt history names a lost lease (an attempt the reaper took back).
LEASE_LOST = f"{LeaseLost.__module__}.{LeaseLost.__qualname__}"


@dataclasses.dataclass(frozen=True)
class ReapResult:
    """What one reaper pass did."""

    reappeared: int = 0
    dead_lettered: int = 0


class Reaper:
    """Returns the expired leases of one database alias (a batch per pass)."""

    def __init__(self, alias: str, worker_id: str = "") -> None:
        self.alias = alias
        self.worker_id = worker_id

    def run_once(self) -> ReapResult:
        """One pass: requeue expired leases with attempts left, dead-letter the others."""
        requeued, exhausted = store.reap(self.alias)
        if requeued:
            self._reappeared(requeued)
        histories = (
            dict(
                Job.objects.using(self.alias)
                .filter(pk__in=[job_id for job_id, _ in exhausted])
                .values_list("pk", "attempt_history")
            )
            if exhausted
            else {}
        )
        dead = sum(
            self._dead_letter(job_id, token, histories.get(job_id) or []) for job_id, token in exhausted
        )
        return ReapResult(reappeared=len(requeued), dead_lettered=dead)

    def _reappeared(self, requeued: list[tuple[int, str]]) -> None:
        # Reappearances are rare: one more query gives their records every job field.
        reaped = Job.objects.using(self.alias).in_bulk([job_id for job_id, _ in requeued])
        for job_id, queue_name in requeued:
            events.emit(events.LeaseReappeared(queue_name))
            row = reaped.get(job_id)
            logger.warning(
                "lease_expired job_id=%s queue=%s; job visible again",
                job_id,
                queue_name,
                extra=job_fields(row, self.worker_id, outcome="reappeared")
                if row is not None
                else {"job_id": job_id, "queue": queue_name, "outcome": "reappeared"},
            )

    def _dead_letter(self, job_id: int, token: str, history: list[Any]) -> bool:
        handler = _handler_error(history)
        encrypt = False
        if handler is None:
            error = ("LeaseExpired", LEASE_EXPIRED_MESSAGE, "")
            last_attempt = None
        else:
            # The handler's own error files the letter (grouped with the same error's other
            # letters, in the admin and Sentry); the lost lease stays its reason and is named
            # in its message, and the last attempt's history entry records the lost lease.
            attempt, error_class, message, traceback = handler
            encrypt, message, traceback = _opened(message, traceback)
            error = (
                error_class,
                f"{message}\n\n[The handler's error on attempt {attempt}; then LeaseExpired: "
                f"{LEASE_EXPIRED_MESSAGE}.]",
                traceback,
            )
            last_attempt = ("LeaseExpired", LEASE_EXPIRED_MESSAGE)
        try:
            letter = dlq.dead_letter(
                self.alias,
                job_id,
                token,
                reason=DeadLetterReason.LEASE_EXPIRED,
                category=retry.TRANSIENT,
                error_class=error[0],
                error_message=error[1],
                traceback=error[2],
                worker_id="",
                last_attempt_error=last_attempt,
                encrypt=encrypt,
            )
        except LeaseLost:
            return False  # its worker acked it just in time
        logger.error(
            "job_dead_lettered job_id=%s task=%r reason=%s error=%s",
            job_id,
            letter.task_name,
            DeadLetterReason.LEASE_EXPIRED,
            letter.error_class,
            # The dead letter carries the job's fields; its own id is not the job's.
            extra={**job_fields(letter, self.worker_id, outcome="dead"), "job_id": job_id},
        )
        return True


def _opened(message: str, traceback: str) -> tuple[bool, str, str]:
    """A sealed handler error from the history, opened to be filed (and sealed again) with the
    letter's notes: ``(sealed, message, traceback)``. Without its key, the letter says so."""
    if not (is_encrypted(message) or is_encrypted(traceback)):
        return False, message, traceback
    where = "job.attempt_history"
    try:
        opened = (
            open_text(message, ERROR, f"{where}.error"),
            open_text(traceback, TRACEBACK, f"{where}.traceback"),
        )
    except DecryptionError as exc:
        return keyring().enabled, f"(the error is encrypted: {exc})", ""
    return True, *opened


def _handler_error(history: list[Any]) -> tuple[int, str, str, str] | None:
    """The last error a handler raised in ``history``: (attempt, class, message, traceback).

    None if no attempt failed with one (each ended in a lost lease, or none had an entry).
    """
    for number in range(len(history), 0, -1):
        entry = history[number - 1]
        if not isinstance(entry, dict):
            continue
        error_class = str(entry.get("error_class") or "")
        if error_class and error_class != LEASE_LOST:
            return (
                number,
                error_class.removeprefix("builtins."),
                str(entry.get("error") or ""),
                str(entry.get("traceback") or ""),
            )
    return None
