"""Maintenance services a worker runs between claims: reaper, redrive, key pruning, scheduler tick.

Each service has a public ``run_once()`` that does one pass and returns what it did, for
tests and for running a pass by hand. :class:`Maintenance` is what the worker loop calls:
it runs each service on its interval and, with ``JOBGUARD["MAINTENANCE_LEADER"]`` on, runs
the reaper, redrive and pruning only while this worker is the elected leader.
"""

from __future__ import annotations

from ..conf import get_settings
from ..leadership import MaintenanceLeadership
from .key_pruner import KeyPruner, PruneResult
from .reaper import Reaper, ReapResult
from .redriver import Redriver, RedriveResult
from .scheduler_tick import SchedulerTick, TickResult

__all__ = [
    "KeyPruner",
    "Maintenance",
    "PruneResult",
    "ReapResult",
    "Reaper",
    "RedriveResult",
    "Redriver",
    "SchedulerTick",
    "TickResult",
]


class Maintenance:
    """The maintenance passes of one worker, each on its interval (monotonic clock)."""

    def __init__(
        self, alias: str, worker_id: str, *, reaper_interval: float, run_scheduler: bool = True
    ) -> None:
        self.reaper_interval = reaper_interval
        self.reaper = Reaper(alias, worker_id)
        self.redriver = Redriver(alias, worker_id)
        self.pruner = KeyPruner(alias, worker_id)
        self.scheduler = SchedulerTick(alias, worker_id)
        self.leadership = (
            MaintenanceLeadership(alias, worker_id, reaper_interval)
            if get_settings().maintenance_leader
            else None
        )
        self.next_reap = 0.0
        self.next_schedule = 0.0 if run_scheduler else float("inf")

    @property
    def next_at(self) -> float:
        """When the next pass of any service is due."""
        return min(self.next_reap, self.next_schedule)

    def run_due(self, now: float) -> None:
        """Run the passes due at ``now``; a database error is the caller's (it backs off)."""
        if now >= self.next_reap:
            # With an elected leader, the other workers skip maintenance passes.
            leading = self.leadership is None or self.leadership.hold()
            if leading:
                self.reaper.run_once()
                self.redriver.run_once()
            self.next_reap = now + self.reaper_interval
            if leading:
                self.pruner.tick(now)
        if now >= self.next_schedule:
            self.next_schedule = self.scheduler.run_once(now).next_at

    def resign(self) -> None:
        """Give up maintenance leadership (at shutdown), so another worker takes over at once."""
        if self.leadership is not None:
            self.leadership.resign()
