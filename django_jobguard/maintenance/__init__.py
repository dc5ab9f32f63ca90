"""Maintenance services a worker runs between claims: reaper, redrive, key pruning, scheduler tick,
the horizon watcher; and job pruning, on a thread of its own.

Each service has a public ``run_once()`` that does one pass and returns what it did, for
tests and for running a pass by hand. :class:`Maintenance` is what the worker loop calls:
it runs each service on its interval and, with ``JOBGUARD["MAINTENANCE_LEADER"]`` on, runs
the reaper, redrive, pruning and the horizon watcher only while this worker is the elected leader.
Job pruning (:mod:`.job_pruner`) runs on the thread :meth:`Maintenance.start_pruning` starts,
so a pass never holds up a claim; one worker prunes, elected even with that setting off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..conf import get_settings
from .horizon import HorizonResult, HorizonWatcher
from .job_pruner import JobPruner
from .key_pruner import KeyPruner, PruneResult
from .leadership import MaintenanceLeadership
from .reaper import Reaper, ReapResult
from .redriver import Redriver, RedriveResult
from .scheduler_tick import SchedulerTick, TickResult

__all__ = [
    "HorizonResult",
    "HorizonWatcher",
    "JobPruner",
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


#: Seconds the shutdown waits for the job pruner to end its batch.
PRUNER_JOIN_SECONDS = 2.0


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
        self.horizon = HorizonWatcher(alias, worker_id)
        horizon_interval = get_settings().horizon.interval
        #: Seconds between two passes of the horizon watcher (inf: HORIZON["INTERVAL"] is 0, off).
        self.horizon_interval = horizon_interval if horizon_interval > 0 else float("inf")
        self.next_horizon = 0.0 if horizon_interval > 0 else float("inf")
        self.leading = False
        self.leadership = (
            MaintenanceLeadership(alias, worker_id, reaper_interval)
            if get_settings().maintenance_leader
            else None
        )
        self.next_reap = 0.0
        self.next_schedule = 0.0 if run_scheduler else float("inf")
        #: Finished jobs past their retention: this worker's pruner, elected as the maintenance
        #: leader when there is one, else through its own lease row.
        self.job_pruner = JobPruner(
            alias, worker_id, leading=(lambda: self.leading) if self.leadership is not None else None
        )
        self._pruning: threading.Thread | None = None

    @property
    def next_at(self) -> float:
        """When the next pass of any service is due."""
        return min(self.next_reap, self.next_schedule, self.next_horizon)

    def run_due(self, now: float) -> None:
        """Run the passes due at ``now``; a database error is the caller's (it backs off)."""
        if now >= self.next_reap:
            # With an elected leader, the other workers skip maintenance passes.
            leading = self.leadership is None or self.leadership.hold()
            self.leading = leading
            if leading:
                self.reaper.run_once()
                self.redriver.run_once()
            self.next_reap = now + self.reaper_interval
            if leading:
                self.pruner.tick(now)
        if now >= self.next_schedule:
            self.next_schedule = self.scheduler.run_once(now).next_at
        if now >= self.next_horizon:
            self.next_horizon = now + self.horizon_interval
            if self.leading:  # one worker names the holder, not every one
                self.horizon.run_once(now)

    def start_pruning(self, spawn: Callable[[Callable[[], None], str], threading.Thread]) -> None:
        """Start the job pruner's thread with ``spawn`` (the worker's, which watches its threads),
        unless ``RETENTION["INTERVAL"]`` is 0."""
        if get_settings().retention.interval > 0:
            self._pruning = spawn(self.job_pruner.run, "jobguard-retention")

    def resign(self) -> None:
        """Give up maintenance leadership (at shutdown), so another worker takes over at once.

        The job pruner stops after its current batch, gives up its own lease and closes its
        connection; a batch still running when the process exits is rolled back.
        """
        self.job_pruner.stop()
        if self.leadership is not None:
            self.leadership.resign()
        if self._pruning is not None:
            self._pruning.join(timeout=PRUNER_JOIN_SECONDS)
