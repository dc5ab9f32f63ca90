"""What an operator does with a dead outbox message: replay it, or skip it. Each records who and why.

A dead message of a "hold" destination holds its key: :func:`replay` puts it back in line
(pending, its attempts counted afresh, same id and place), so it and then the messages
behind it are delivered in order; :func:`skip` sets it aside and releases the messages
behind it. A dead message of a "skip" destination was passed over already: :func:`replay`
publishes a copy at the end of its key (a new id and place, since the order it had is
gone), and :func:`skip` only records the decision.

Surfaces (the admin, the API, a command) check the ``operate_outbox`` permission and call
these; the rules live here once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.utils import timezone

from .. import events, store
from ..conf import get_settings
from ..exceptions import OutboxError
from .events import OutboxResolved
from .publisher import publish

if TYPE_CHECKING:
    from ..models import OutboxMessage

logger = logging.getLogger("django_jobguard.outbox")

__all__ = ["replay", "skip"]


def _locked(message: OutboxMessage | int) -> tuple[OutboxMessage, str]:
    from ..models import OutboxMessage, OutboxState

    alias = get_settings().outbox_alias
    pk = message if isinstance(message, int) else message.pk
    found = OutboxMessage.objects.using(alias).select_for_update().filter(pk=pk).first()
    if found is None:
        raise OutboxError(f"outbox message {pk} does not exist (or was deleted).")
    if found.state != OutboxState.DEAD:
        raise OutboxError(
            f"outbox message {pk} is {found.state}: only a dead message can be replayed or skipped."
        )
    return found, alias


def _check_reason(reason: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise OutboxError("give a reason: it is recorded with the decision for the next person to read.")
    return reason.strip()


def replay(message: OutboxMessage | int, *, by: str, reason: str) -> OutboxMessage:
    """Deliver a dead message again; the message that will be delivered (itself, or its copy).

    ``by`` names the operator (``request.user.get_username()``), ``reason`` says why.
    """
    from ..models import OutboxCursor, OutboxState

    reason = _check_reason(reason)
    alias = get_settings().outbox_alias
    with store.atomic(alias):
        found, alias = _locked(message)
        cursor = (
            OutboxCursor.objects.using(alias)
            .select_for_update()
            .get(destination=found.destination, key=found.key)
        )
        resolution = {
            "resolution": "replayed",
            "resolved_by": by[:150],
            "resolution_reason": reason,
            "resolved_at": timezone.now(),
        }
        if cursor.held_seq == found.seq:
            # It holds its key: back in line, first of its key, same id and place.
            for field, value in {
                **resolution,
                "state": OutboxState.PENDING,
                "attempts": 0,
                "next_attempt_at": None,
            }.items():
                setattr(found, field, value)
            found.save(using=alias)
            OutboxCursor.objects.using(alias).filter(pk=cursor.pk).update(held_seq=None, retry_at=None)
            delivered = found
        else:
            # Passed over already ("skip"): its place is gone, so a copy goes to the end of the key.
            delivered = publish(found.destination, found.payload, key=found.key, headers=found.headers)
            resolution["resolution_reason"] = f"{reason} (published again as {delivered.message_id})"
            for field, value in resolution.items():
                setattr(found, field, value)
            found.save(using=alias)
    events.emit(OutboxResolved(found.destination, "replayed"))
    logger.warning(
        "outbox_message_replayed destination=%s key=%r seq=%d message_id=%s by=%r reason=%r delivered_as=%s",
        found.destination,
        found.key,
        found.seq,
        found.message_id,
        by,
        reason,
        delivered.message_id,
    )
    return delivered


def skip(message: OutboxMessage | int, *, by: str, reason: str) -> OutboxMessage:
    """Give up on a dead message: it is never delivered, and a key it held moves on."""
    from ..models import OutboxCursor, OutboxState

    reason = _check_reason(reason)
    alias = get_settings().outbox_alias
    with store.atomic(alias):
        found, alias = _locked(message)
        OutboxCursor.objects.using(alias).filter(
            destination=found.destination, key=found.key, held_seq=found.seq
        ).update(held_seq=None, delivered_seq=found.seq, retry_at=None)
        found.state = OutboxState.SKIPPED
        found.resolution = "skipped"
        found.resolved_by = by[:150]
        found.resolution_reason = reason
        found.resolved_at = timezone.now()
        found.save(using=alias)
    events.emit(OutboxResolved(found.destination, "skipped"))
    logger.warning(
        "outbox_message_skipped destination=%s key=%r seq=%d message_id=%s by=%r reason=%r",
        found.destination,
        found.key,
        found.seq,
        found.message_id,
        by,
        reason,
    )
    return found
