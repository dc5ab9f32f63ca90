"""``HORIZON``: when a held vacuum horizon is named, and how long an atomic task may hold one.

A transaction, a replication slot or a standby with ``hot_standby_feedback`` that holds
PostgreSQL's xmin horizon keeps every dead job row of the cluster from being vacuumed; the
worker's watcher (:mod:`django_jobguard.maintenance.horizon`) names it past ``WARN_AFTER``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._values import number

__all__ = ["HorizonSettings", "parse_horizon_settings"]


@dataclasses.dataclass(frozen=True, slots=True)
class HorizonSettings:
    """``JOBGUARD["HORIZON"]``: the watcher's threshold and interval, the atomic tasks' bound (seconds)."""

    warn_after: float = 300.0
    interval: float = 30.0
    atomic_timeout: float = 60.0


def parse_horizon_settings(group: Mapping[str, Any]) -> HorizonSettings:
    return HorizonSettings(
        warn_after=number(group["WARN_AFTER"], ("HORIZON", "WARN_AFTER"), allow_zero=False),
        interval=number(group["INTERVAL"], ("HORIZON", "INTERVAL")),
        atomic_timeout=number(group["ATOMIC_TIMEOUT"], ("HORIZON", "ATOMIC_TIMEOUT"), allow_zero=False),
    )
