"""The reaper: jobs whose lease expired are made visible again, or dead-lettered on their last attempt."""

from __future__ import annotations

import dataclasses
import logging

from .. import dlq, events, retry, store
from ..exceptions import LeaseLost
from ..log import job_fields
from ..models import DeadLetterReason, Job

logger = logging.getLogger("django_jobguard.worker")

__all__ = ["ReapResult", "Reaper"]


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
        dead = sum(self._dead_letter(job_id, token) for job_id, token in exhausted)
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

    def _dead_letter(self, job_id: int, token: str) -> bool:
        try:
            letter = dlq.dead_letter(
                self.alias,
                job_id,
                token,
                reason=DeadLetterReason.LEASE_EXPIRED,
                category=retry.TRANSIENT,
                error_class="LeaseExpired",
                error_message="the lease expired on the last attempt (worker crashed, froze or cut off)",
                worker_id="",
            )
        except LeaseLost:
            return False  # its worker acked it just in time
        logger.error(
            "job_dead_lettered job_id=%s task=%r reason=%s error=LeaseExpired",
            job_id,
            letter.task_name,
            DeadLetterReason.LEASE_EXPIRED,
            # The dead letter carries the job's fields; its own id is not the job's.
            extra={**job_fields(letter, self.worker_id, outcome="dead"), "job_id": job_id},
        )
        return True
