"""The horizon watcher: names what holds PostgreSQL's vacuum horizon, within a pass of it happening.

A transaction left open anywhere in the cluster (a session idle in transaction, a long report,
a prepared transaction), a replication slot or a standby with ``hot_standby_feedback`` keeps
every dead job row from being vacuumed: claims then walk over more of them each minute and the
backlog grows with nothing else to show why. Each pass reads what holds the horizon
(:func:`django_jobguard.store.horizon.holders`, one query) and:

- logs a WARNING ``vacuum_horizon_held`` for each holder older than ``HORIZON["WARN_AFTER"]``,
  naming its pid, database, user, application, state, age and the start of its query (again
  every ``WARN_AFTER`` while it holds), and an INFO ``vacuum_horizon_released`` once it is gone;
- sets the ``jobguard_vacuum_horizon_age_seconds`` and ``..._xid_age`` gauges.

A slot, a standby and a session whose details the role may not read have no start time: their
age is how long this watcher has seen the same xmin. PostgreSQL only: elsewhere a pass does
nothing. See docs/runbooks/vacuum-horizon-held.md.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from .. import events
from ..conf import get_settings
from ..store.horizon import Holder, holders

logger = logging.getLogger("django_jobguard.worker")

__all__ = ["HorizonResult", "HorizonWatcher", "held_for"]


@dataclasses.dataclass(frozen=True)
class HorizonResult:
    """What one pass saw: every holder read (oldest first), and those past ``WARN_AFTER``."""

    holders: tuple[Holder, ...] = ()
    held: tuple[Holder, ...] = ()
    #: Seconds the oldest holder has held the horizon (0 with none).
    age_seconds: float = 0.0


def _key(holder: Holder) -> tuple[str, int | None, str, str]:
    return (holder.kind, holder.pid, holder.name, holder.xmin)


def held_for(holder: Holder, first_seen: dict[tuple[str, int | None, str, str], float], now: float) -> float:
    """Seconds ``holder`` has held the horizon: as the server says, else since first seen with its xmin."""
    if holder.age_seconds is not None:
        return holder.age_seconds
    return now - first_seen.get(_key(holder), now)


class HorizonWatcher:
    """Names what holds the vacuum horizon of one database alias (a pass per ``HORIZON["INTERVAL"]``)."""

    def __init__(self, alias: str, worker_id: str = "") -> None:
        self.alias = alias
        self.worker_id = worker_id
        #: Holder -> monotonic time this watcher first saw it with the same xmin.
        self._first_seen: dict[tuple[str, int | None, str, str], float] = {}
        #: Holder -> monotonic time of its last warning.
        self._warned: dict[tuple[str, int | None, str, str], float] = {}
        self._warned_holders: dict[tuple[str, int | None, str, str], Holder] = {}

    def run_once(self, now: float | None = None) -> HorizonResult:
        """One pass: read the holders, warn of those past the threshold, set the gauges."""
        now = time.monotonic() if now is None else now
        found = holders(self.alias)
        keys = {_key(holder) for holder in found}
        self._first_seen = {key: self._first_seen.get(key, now) for key in keys}
        warn_after = get_settings().horizon.warn_after
        held = []
        oldest = 0.0
        for holder in found:
            age = held_for(holder, self._first_seen, now)
            oldest = max(oldest, age)
            if age < warn_after:
                continue
            held.append(holder)
            key = _key(holder)
            last = self._warned.get(key)
            if last is None or now - last >= warn_after:
                self._warned[key] = now
                self._warned_holders[key] = holder
                self._warn(holder, age)
        for key in [key for key in self._warned if key not in keys]:
            del self._warned[key]
            gone = self._warned_holders.pop(key)
            logger.info(
                "vacuum_horizon_released holder=%r; it no longer holds the vacuum horizon",
                gone.describe(),
                extra={"worker_id": self.worker_id},
            )
        xid_age = max((holder.xid_age for holder in found), default=0)
        events.emit(events.HorizonSampled(oldest, xid_age))
        return HorizonResult(tuple(found), tuple(held), oldest)

    def _warn(self, holder: Holder, age: float) -> None:
        known = holder.age_seconds is not None
        logger.warning(
            "vacuum_horizon_held kind=%s pid=%s name=%r database=%r user=%r application=%r state=%r "
            "age=%.0fs%s xid_age=%s query=%r; no dead row of the cluster's tables can be vacuumed "
            "while it holds, and claims slow down: see docs/runbooks/vacuum-horizon-held.md",
            holder.kind,
            holder.pid,
            holder.name,
            holder.database,
            holder.user,
            holder.application,
            holder.state,
            age,
            "" if known else " (at least: as long as this worker has seen it)",
            holder.xid_age,
            holder.query if not holder.hidden else "<insufficient privilege: grant pg_read_all_stats>",
            extra={"worker_id": self.worker_id},
        )
