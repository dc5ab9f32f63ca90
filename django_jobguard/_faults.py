"""Fault points for the reliability suite: the worker SIGKILLs itself at a named point.

Enabled only by the ``JOBGUARD_TEST_FAULTS`` environment variable, read once at import,
for example ``JOBGUARD_TEST_FAULTS="after_claim=0.01,in_complete=0.01"``. Unset (always,
in production) the hot path pays one boolean check.
"""

from __future__ import annotations

import os
import random
import signal

POINTS = (
    "after_claim",  # the claim committed, the handler has not started
    "mid_task",  # inside the handler (the probe task calls maybe_crash itself)
    "after_effect",  # the handler returned (its external effect happened), before the ack
    "in_complete",  # inside the ack's transaction, before commit
    "after_complete",  # the ack committed
    "in_heartbeat",  # while renewing leases
    "in_retry",  # while scheduling a retry
    "in_dead_letter",  # inside the dead-lettering transaction
    "in_schedule_tick",  # the tick's job inserted and its schedule advanced, before commit
    "cache_after_commit",  # a durable invalidation's write committed, its on_commit delete not yet run
)


def _parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, probability = part.partition("=")
        if name not in POINTS:
            raise ValueError(
                f"JOBGUARD_TEST_FAULTS: unknown fault point {name!r}; known: {', '.join(POINTS)}"
            )
        points[name] = float(probability or 1)
    return points


_POINTS = _parse(os.environ.get("JOBGUARD_TEST_FAULTS", ""))
ENABLED = bool(_POINTS)
_rng = random.Random(os.environ.get("JOBGUARD_TEST_FAULTS_SEED"))  # noqa: S311 - test-only chaos


def maybe_crash(point: str) -> None:
    """SIGKILL this process with the configured probability of ``point``."""
    probability = _POINTS.get(point)
    if probability and _rng.random() < probability:
        os.kill(os.getpid(), signal.SIGKILL)
