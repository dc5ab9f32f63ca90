"""The consistency audit: states the database should never hold, or not for long.

Every rule of the engine is written in one transaction (a job and its key at enqueue, the
ack and the key's result, the dead-letter row and the job's ``dead`` status), so a
disagreement between those rows means something outside those rules touched them: a
manual ``UPDATE``, a restored backup, a migration, a bug. Two more checks look at time:
leases that expired long ago (no worker is reaping on this database) and approved
replays that no worker has redriven.

:func:`audit` runs each check as one query and returns every check, found or not, so a
report also shows what was looked at. ``manage.py jobguard_audit`` prints it and exits 1
when anything was found, for cron jobs and CI.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Now

from ..conf import get_settings
from ..models import DeadLetter, IdempotencyKey, IdempotencyStatus, Job, JobStatus, ReplayState

__all__ = ["CHECKS", "DEFAULT_GRACE_SECONDS", "SAMPLE_SIZE", "Finding", "audit"]

#: How long a lease may stay expired, or an approved replay wait, before the audit reports it.
DEFAULT_GRACE_SECONDS = 600.0
#: Ids listed per finding; the count covers them all.
SAMPLE_SIZE = 20


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check's result: how many rows break it, the first ids, and what to do about them."""

    check: str
    description: str
    model: str
    count: int
    sample: list[int]
    hint: str

    @property
    def ok(self) -> bool:
        return self.count == 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class _Check:
    name: str
    description: str
    hint: str
    rows: Callable[[str, datetime.timedelta], QuerySet[Any]]


def _expired_leases(alias: str, grace: datetime.timedelta) -> QuerySet[Any]:
    return Job.objects.using(alias).filter(status=JobStatus.RUNNING, lease_expires_at__lt=Now() - grace)


def _dead_without_letter(alias: str, grace: datetime.timedelta) -> QuerySet[Any]:
    letters = DeadLetter.objects.using(alias).filter(job=OuterRef("pk"))
    return Job.objects.using(alias).filter(status=JobStatus.DEAD).filter(~Exists(letters))


# The key's status each owner status implies: the enqueue, the ack, the dead-lettering,
# a cancel and a replay each write both rows in one transaction.
_KEY_STATUS_FOR_JOB = {
    JobStatus.WAITING: IdempotencyStatus.IN_PROGRESS,
    JobStatus.QUEUED: IdempotencyStatus.IN_PROGRESS,
    JobStatus.RUNNING: IdempotencyStatus.IN_PROGRESS,
    JobStatus.SUCCEEDED: IdempotencyStatus.SUCCEEDED,
    JobStatus.DEAD: IdempotencyStatus.FAILED,
    JobStatus.CANCELLED: IdempotencyStatus.FAILED,
}


def _keys_disagreeing(alias: str, grace: datetime.timedelta) -> QuerySet[Any]:
    agree = Q()
    for job_status, key_status in _KEY_STATUS_FOR_JOB.items():
        agree |= Q(job__status=job_status, status=key_status)
    return IdempotencyKey.objects.using(alias).filter(job__isnull=False).exclude(agree)


def _approved_not_redriven(alias: str, grace: datetime.timedelta) -> QuerySet[Any]:
    return DeadLetter.objects.using(alias).filter(
        replay_state=ReplayState.APPROVED, replay_decided_at__lt=Now() - grace
    )


#: The checks, in the order reports list them.
CHECKS: tuple[_Check, ...] = (
    _Check(
        "expired_leases",
        "running jobs whose lease expired more than the grace period ago",
        "Every worker reaps expired leases; these mean no worker runs on this database, or its "
        "reaper fails (see the worker's logs). A worker started on it puts them back.",
        _expired_leases,
    ),
    _Check(
        "dead_without_dead_letter",
        "dead jobs with no dead-letter row",
        "The job's status was set to dead outside the worker (a manual UPDATE?), so nothing can "
        "replay it. Read what it was meant to do; if it must still run, enqueue it again (with "
        "its idempotency key, if it had one).",
        _dead_without_letter,
    ),
    _Check(
        "keys_disagreeing_with_their_job",
        "idempotency keys whose status does not match their owner job's",
        "A succeeded key on an unfinished job lets duplicates skip work that never committed; "
        "an in-progress key on a finished job makes duplicates wait for ever. Fix the key "
        "(status, or delete it if the action never happened) after checking the business data.",
        _keys_disagreeing,
    ),
    _Check(
        "approved_replays_waiting",
        "approved replays not redriven within the grace period",
        "Workers redrive approved replays at JOBGUARD['REPLAY']['RATE_PER_MINUTE'] per minute. A long "
        "wait with few approvals means no worker runs, or redrive fails (see the worker's logs).",
        _approved_not_redriven,
    ),
)


def audit(
    using: str | None = None, grace: float = DEFAULT_GRACE_SECONDS, sample_size: int = SAMPLE_SIZE
) -> list[Finding]:
    """Run every check on database ``using``; one :class:`Finding` per check, in order.

    ``grace``: seconds an expired lease or an approved replay may wait before it counts.
    ``sample_size``: ids listed per finding (the first by id); ``count`` covers every row.
    """
    if grace < 0:
        raise ValueError(f"grace must be 0 seconds or more, not {grace}")
    alias = using or get_settings().database_alias
    window = datetime.timedelta(seconds=grace)
    findings = []
    for check in CHECKS:
        rows = check.rows(alias, window)
        sample = list(rows.order_by("pk").values_list("pk", flat=True)[:sample_size])
        count = len(sample) if len(sample) < sample_size else rows.count()
        findings.append(
            Finding(
                check=check.name,
                description=check.description,
                model=rows.model._meta.label,
                count=count,
                sample=sample,
                hint=check.hint,
            )
        )
    return findings
