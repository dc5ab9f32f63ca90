"""Key pruning: a batch of expired idempotency keys deleted, at most once per interval."""

from __future__ import annotations

import dataclasses
import logging

from django.db import DatabaseError, InterfaceError

from ..conf import get_settings
from . import retention

logger = logging.getLogger("django_jobguard.worker")

__all__ = ["KeyPruner", "PruneResult"]


@dataclasses.dataclass(frozen=True)
class PruneResult:
    """What one pruning pass did (``ran`` is False when it was not due or is turned off)."""

    ran: bool = False
    deleted: int = 0


class KeyPruner:
    """Deletes expired idempotency keys in the worker when ``IDEMPOTENCY.PRUNE_IN_WORKER`` is on."""

    def __init__(self, alias: str, worker_id: str = "") -> None:
        self.alias = alias
        self.worker_id = worker_id
        self._next_prune = 0.0

    def tick(self, now: float) -> PruneResult:
        """Prune if on and :data:`.retention.WORKER_PRUNE_INTERVAL_SECONDS` passed."""
        if now < self._next_prune or not get_settings().idempotency.prune_in_worker:
            return PruneResult()
        self._next_prune = now + retention.WORKER_PRUNE_INTERVAL_SECONDS
        return self.run_once()

    def run_once(self) -> PruneResult:
        """Delete one batch of expired keys now; a database error is logged, not raised."""
        try:
            deleted = retention.prune_expired_keys(
                self.alias, batch_size=retention.WORKER_PRUNE_BATCH_SIZE, max_batches=1
            )
        except (DatabaseError, InterfaceError):
            logger.warning("prune_failed worker_id=%s", self.worker_id, exc_info=True)
            return PruneResult(ran=True)
        if deleted:
            logger.info("idempotency_keys_pruned worker_id=%s deleted=%d", self.worker_id, deleted)
        return PruneResult(ran=True, deleted=deleted)
