"""The replay steps a user makes: request, approve, reject (each checked, each one transaction)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from ..conf import get_settings
from ..exceptions import ReplayConflict, ReplayPermissionDenied
from ..models import DeadLetter
from .corrections import correction_digest, validated_payload
from .permissions import VIEW_PAYLOAD, can_view_payload, check_permission
from .transitions import (
    APPROVE,
    REJECT,
    REQUEST,
    User,
    check_state,
    checked_reason,
    locked,
    refreshed,
    transition,
)

__all__ = ["approve_replay", "reject_replay", "request_replay"]


def request_replay(
    dead_letter: DeadLetter | int,
    user: User,
    reason: str,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
) -> DeadLetter:
    """Ask for ``dead_letter`` to be replayed, optionally with a corrected payload.

    ``args`` / ``kwargs`` replace the original ones (either may be left out); the payload
    that will run must bind to the handler's signature and be JSON, or
    :class:`InvalidArgumentsError` is raised and nothing changes. Returns the dead letter
    as stored now.
    """
    reason = checked_reason(reason, REQUEST)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = locked(alias, dead_letter)
        check_permission(letter, user, REQUEST)
        corrected = args is not None or kwargs is not None
        if corrected and not can_view_payload(user):
            raise ReplayPermissionDenied(
                f"{user.get_username()} may not correct payloads: that needs the {VIEW_PAYLOAD} permission."
            )
        check_state(letter, REQUEST)
        new_args, new_kwargs = validated_payload(letter, args, kwargs)
        # A "correction" identical to the original is no correction: the replay runs the original.
        corrected = (new_args, new_kwargs) != (letter.args, letter.kwargs)
        data: dict[str, Any] = {"payload_corrected": corrected}
        if corrected:
            data.update(args=new_args, kwargs=new_kwargs)
        transition(
            alias,
            letter,
            REQUEST,
            user,
            reason,
            data,
            replay_args=new_args if corrected else None,
            replay_kwargs=new_kwargs if corrected else None,
            replay_requested_by=user,
            replay_requested_at=Now(),
            replay_reason=reason,
            replay_decided_by=None,
            replay_decided_at=None,
        )
    return refreshed(alias, dead_letter, letter)


def approve_replay(
    dead_letter: DeadLetter | int, user: User, reason: str, *, reviewed: str | None = None
) -> DeadLetter:
    """Approve the requested replay; a worker redrives it within the throttle.

    The payload is checked against the handler again: the code may have changed since the
    request. ``reviewed`` is the :func:`correction_digest` the approver saw: if the
    correction changed since, :class:`ReplayConflict` is raised and nothing changes (the
    admin always sends it; an API client should).
    """
    reason = checked_reason(reason, APPROVE)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = locked(alias, dead_letter)
        check_permission(letter, user, APPROVE)
        check_state(letter, APPROVE)
        digest = correction_digest(letter)
        if reviewed is not None and reviewed != digest:
            raise ReplayConflict(
                f"The replay's payload changed since you reviewed it (digest {reviewed}, now {digest}): "
                "review it again before approving."
            )
        validated_payload(letter, letter.replay_args, letter.replay_kwargs)
        transition(
            alias,
            letter,
            APPROVE,
            user,
            reason,
            {
                "payload_corrected": letter.replay_args is not None or letter.replay_kwargs is not None,
                "correction_digest": digest,
            },
            replay_decided_by=user,
            replay_decided_at=Now(),
        )
    return refreshed(alias, dead_letter, letter)


def reject_replay(dead_letter: DeadLetter | int, user: User, reason: str) -> DeadLetter:
    """Reject a requested replay, or withdraw an approved one that no worker has redriven yet."""
    reason = checked_reason(reason, REJECT)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = locked(alias, dead_letter)
        check_permission(letter, user, REJECT)
        check_state(letter, REJECT)
        transition(
            alias,
            letter,
            REJECT,
            user,
            reason,
            {"previous_state": letter.replay_state},
            replay_decided_by=user,
            replay_decided_at=Now(),
        )
    return refreshed(alias, dead_letter, letter)
