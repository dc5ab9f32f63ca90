"""The redrive rate: ``JOBGUARD["REPLAY"]["RATE_PER_MINUTE"]``, or what an operator set in the console.

A change is a :class:`~django_jobguard.models.ReplayRateChange` row (who, when, why); the
newest row is the rate in force. Every redrive pass reads it inside its transaction, so the
throttle of every worker of the fleet follows a change at its next pass (within one
``REAPER_INTERVAL``), with no deploy and no restart.
"""

from __future__ import annotations

import dataclasses
import logging

from django.db import transaction

from ..actors import User
from ..conf import get_settings
from ..exceptions import ReplayError, ReplayPermissionDenied
from ..models import ReplayRateChange
from .permissions import PERMISSIONS
from .transitions import APPROVE, MAX_REASON_LENGTH

logger = logging.getLogger("django_jobguard.dlq")

__all__ = [
    "MAX_RATE_PER_MINUTE",
    "RATE_PERMISSION",
    "ReplayRate",
    "current_rate",
    "rate_per_minute",
    "set_rate",
]

#: The highest rate the console sets: a thousand redrives a second across the fleet.
MAX_RATE_PER_MINUTE = 60_000
#: Who may change the rate: those who decide replays (approvers).
RATE_PERMISSION = PERMISSIONS[APPROVE]


@dataclasses.dataclass(frozen=True)
class ReplayRate:
    """The rate in force, the configured one, and the console's change that set it (None: the setting)."""

    rate_per_minute: int
    setting: int
    change: ReplayRateChange | None

    @property
    def overridden(self) -> bool:
        return self.change is not None


def rate_per_minute(alias: str) -> int:
    """The redrive rate in force now: one query (the newest change), the setting without one."""
    rate = (
        ReplayRateChange.objects.using(alias)
        .order_by("-id")
        .values_list("rate_per_minute", flat=True)
        .first()
    )
    return rate if rate is not None else get_settings().replay.rate_per_minute


def current_rate(*, using: str | None = None) -> ReplayRate:
    """The rate in force, with the change that set it, for the console to show."""
    alias = using or get_settings().database_alias
    setting = get_settings().replay.rate_per_minute
    change = ReplayRateChange.objects.using(alias).order_by("-id").first()
    if change is None or change.rate_per_minute is None:
        return ReplayRate(setting, setting, None)
    return ReplayRate(change.rate_per_minute, setting, change)


def set_rate(user: User, rate: int | None, reason: str, *, using: str | None = None) -> ReplayRateChange:
    """Set the redrive rate for every worker (``None``: back to the setting); the change recorded.

    Needs ``jobguard.approve_replay`` (:class:`ReplayPermissionDenied`); a rate outside 1 to
    :data:`MAX_RATE_PER_MINUTE` or an empty reason is a :class:`ReplayError`.
    """
    if user is None or not user.is_authenticated or not user.has_perm(RATE_PERMISSION):
        name = user.get_username() if user is not None and user.is_authenticated else "an anonymous user"
        raise ReplayPermissionDenied(
            f"{name} may not change the redrive rate: that needs the {RATE_PERMISSION} permission."
        )
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)):
        raise ReplayError(f"The redrive rate must be a whole number of replays a minute, not {rate!r}.")
    if rate is not None and not 1 <= rate <= MAX_RATE_PER_MINUTE:
        raise ReplayError(
            f"The redrive rate must be from 1 to {MAX_RATE_PER_MINUTE:,} a minute, not {rate:,}."
        )
    reason = (reason or "").strip()
    if not reason:
        raise ReplayError("A reason is required to change the redrive rate: it goes into the audit trail.")
    if len(reason) > MAX_REASON_LENGTH:
        raise ReplayError(f"A reason is at most {MAX_REASON_LENGTH} characters, not {len(reason)}.")
    alias = using or get_settings().database_alias
    with transaction.atomic(using=alias):
        change = ReplayRateChange.objects.using(alias).create(
            rate_per_minute=rate, actor_id=user.pk, actor_name=user.get_username()[:150], reason=reason
        )
    logger.info(
        "replay_rate_changed rate_per_minute=%s user=%r reason=%r",
        rate if rate is not None else f"setting ({get_settings().replay.rate_per_minute})",
        user.get_username(),
        reason,
    )
    return change
