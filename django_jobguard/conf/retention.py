"""``RETENTION``: how long finished jobs are kept, per final status and per queue, and the pruning pass.

The same pass deletes settled outbox messages: delivered ones ``OUTBOX_DELIVERED`` seconds
after their delivery, skipped ones ``OUTBOX_SKIPPED`` seconds after the operator's decision.

The worker that leads maintenance deletes finished jobs older than their status's retention
(:mod:`django_jobguard.maintenance.job_pruner`); ``manage.py jobguard_prune`` applies the same
rules by hand. A queue may set its own (``JOBGUARD["QUEUES"][name]["retention"]``, lower-case
keys); the keys it leaves out come from ``RETENTION``. ``None`` keeps that status's jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._values import fail, integer, mapping, number, reject_unknown

__all__ = [
    "RETENTION_STATUSES",
    "RetentionPolicy",
    "RetentionSettings",
    "parse_queue_retention",
    "parse_retention_settings",
]

#: The final statuses a retention is given for, as the keys of a queue's ``retention``
#: (``RETENTION`` spells them in upper case).
RETENTION_STATUSES = ("succeeded", "cancelled", "dead")

DAY_SECONDS = 24 * 3600.0


@dataclasses.dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Seconds a finished job is kept after its ``finished_at``, per final status; None: kept."""

    succeeded: float | None = DAY_SECONDS
    cancelled: float | None = 7 * DAY_SECONDS
    dead: float | None = 7 * DAY_SECONDS

    def for_status(self, status: str) -> float | None:
        """The retention of jobs that finished as ``status`` (one of :data:`RETENTION_STATUSES`)."""
        value: float | None = getattr(self, status)
        return value

    @property
    def prunes(self) -> bool:
        """Whether any status's jobs are ever deleted under this policy."""
        return any(self.for_status(status) is not None for status in RETENTION_STATUSES)


@dataclasses.dataclass(frozen=True, slots=True)
class RetentionSettings:
    """``JOBGUARD["RETENTION"]``: the global policy, the workers' pass interval and batch size.

    A queue's own policy is its :attr:`~django_jobguard.conf.QueueConfig.retention`;
    :meth:`django_jobguard.conf.Settings.retention_for` resolves one.
    """

    policy: RetentionPolicy = RetentionPolicy()
    #: Seconds between two pruning passes of the worker that leads it; 0: workers do not prune.
    interval: float = 60.0
    #: Jobs deleted per transaction.
    batch_size: int = 500
    #: Seconds a succeeded job's result may be waited for after it finished (``RESULTS``);
    #: None: as long as the job's row is kept. A task's ``result_retention`` comes first.
    results: float | None = None
    #: Seconds a delivered outbox message is kept after its delivery; None: kept.
    outbox_delivered: float | None = DAY_SECONDS
    #: Seconds a skipped outbox message is kept after an operator skipped it; None: kept.
    outbox_skipped: float | None = 7 * DAY_SECONDS


def _seconds(value: Any, path: tuple[str, ...], what: str = "jobs") -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(path, f"must be a number of seconds, or None to keep these {what}, not {value!r}.")
    return number(value, path)


def parse_retention_settings(group: Mapping[str, Any]) -> RetentionSettings:
    """``RETENTION`` (the queues' own retention is parsed with their options)."""
    policy = RetentionPolicy(
        **{
            status: _seconds(group[status.upper()], ("RETENTION", status.upper()))
            for status in RETENTION_STATUSES
        }
    )
    return RetentionSettings(
        policy=policy,
        interval=number(group["INTERVAL"], ("RETENTION", "INTERVAL")),
        batch_size=integer(group["BATCH_SIZE"], ("RETENTION", "BATCH_SIZE"), minimum=1),
        results=_seconds(group["RESULTS"], ("RETENTION", "RESULTS")),
        outbox_delivered=_seconds(group["OUTBOX_DELIVERED"], ("RETENTION", "OUTBOX_DELIVERED"), "messages"),
        outbox_skipped=_seconds(group["OUTBOX_SKIPPED"], ("RETENTION", "OUTBOX_SKIPPED"), "messages"),
    )


def parse_queue_retention(value: Any, path: tuple[str, ...], fallback: RetentionPolicy) -> RetentionPolicy:
    """A queue's ``retention``: any of ``succeeded``, ``cancelled``, ``dead``; the rest from ``fallback``."""
    if isinstance(value, RetentionPolicy):
        return value
    given = mapping(value, path)
    reject_unknown(given, set(RETENTION_STATUSES), path)
    return dataclasses.replace(
        fallback, **{status: _seconds(given[status], (*path, status)) for status in sorted(given)}
    )
