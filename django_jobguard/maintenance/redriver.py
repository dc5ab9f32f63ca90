"""Redrive: approved dead-letter replays become new jobs, as many as the throttle allows."""

from __future__ import annotations

import dataclasses

from .. import dlq

__all__ = ["RedriveResult", "Redriver"]


@dataclasses.dataclass(frozen=True)
class RedriveResult:
    """What one redrive pass did."""

    jobs: int = 0


class Redriver:
    """Runs redrive passes for one database alias."""

    def __init__(self, alias: str, worker_id: str = "") -> None:
        self.alias = alias
        self.worker_id = worker_id

    def run_once(self) -> RedriveResult:
        """One pass (see :func:`django_jobguard.dlq.redrive`)."""
        return RedriveResult(jobs=len(dlq.redrive(worker_id=self.worker_id, using=self.alias)))
