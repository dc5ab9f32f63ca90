"""Queue pause and resume: the one home of the rule, for the admin, the command and the API.

A paused queue keeps accepting jobs; workers stop claiming from it at their next poll
(every claim leaves paused queues alone: on PostgreSQL the claim statement reads the few
paused rows itself, on SQLite the worker reads them just before it), and jobs already
running finish. On PostgreSQL a claim that started before the pause committed may still
take that queue's jobs, once. The state is a row per queue in the database, so every
worker on every host sees the same thing, and each change appends a
:class:`~django_jobguard.models.QueueEvent` (who, when, why).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from django.db import transaction
from django.db.models.functions import Now

from .. import store
from ..actors import User
from ..conf import get_settings
from ..exceptions import QueueError, QueuePermissionDenied
from ..models import Job, QueueAction, QueueEvent, QueueState

logger = logging.getLogger("django_jobguard.queues")

__all__ = ["PERMISSION", "QueueChange", "can_pause", "pause", "paused_queues", "resume", "states"]

#: The permission pausing and resuming needs (``QueueState.Meta.permissions``).
PERMISSION = "jobguard.pause_queue"
#: Longest queue name (``Job.queue_name``'s max_length).
MAX_QUEUE_NAME_LENGTH = 100


@dataclasses.dataclass(frozen=True, slots=True)
class QueueChange:
    """What :func:`pause` or :func:`resume` did."""

    queue: str
    paused: bool
    #: False when the queue already was in that state (nothing written).
    changed: bool
    changed_by: str
    changed_at: datetime.datetime | None
    reason: str


def can_pause(user: User | None) -> bool:
    """Whether ``user`` may pause and resume queues."""
    return bool(user is not None and user.is_authenticated and user.has_perm(PERMISSION))


def paused_queues(using: str | None = None) -> set[str]:
    """Names of the paused queues (one query on the partial index of paused rows)."""

    return store.paused_queue_names(using or get_settings().database_alias)


def states(using: str | None = None) -> list[QueueChange]:
    """Every queue that was ever paused, with its current state and last change, by name."""

    alias = using or get_settings().database_alias
    return [
        QueueChange(row.queue_name, row.paused, False, row.changed_by_name, row.changed_at, row.reason)
        for row in QueueState.objects.using(alias).order_by("queue_name")
    ]


def pause(
    queue: str, *, user: User | None = None, actor: str = "", reason: str, using: str | None = None
) -> QueueChange:
    """Pause ``queue``: workers stop claiming its jobs at their next poll; enqueues still work.

    ``user`` (from the admin or the API) needs ``jobguard.pause_queue``; trusted callers
    (a management command) pass ``user=None`` and name themselves in ``actor``. A reason
    is required: it goes into the audit trail.
    """
    return _change(queue, True, user=user, actor=actor, reason=reason, using=using)


def resume(
    queue: str, *, user: User | None = None, actor: str = "", reason: str = "", using: str | None = None
) -> QueueChange:
    """Resume ``queue``: workers claim its jobs again at their next poll."""
    return _change(queue, False, user=user, actor=actor, reason=reason, using=using)


def _validated_name(queue: str) -> str:
    name = (queue or "").strip()
    if not name:
        raise QueueError("A queue name is required.")
    if name != queue or any(ch.isspace() for ch in name):
        raise QueueError(f"Queue name {queue!r} may not contain spaces.")
    if "\x00" in name:
        raise QueueError(f"Queue name {queue!r} holds a NUL character (\\x00), which no queue name has.")
    if len(name) > MAX_QUEUE_NAME_LENGTH:
        raise QueueError(f"Queue name {queue[:20]!r}... is longer than {MAX_QUEUE_NAME_LENGTH} characters.")
    return name


#: The longest reason a pause or resume may carry (it is shown on the health page).
MAX_REASON_LENGTH = 500
#: Why a reason with a NUL character is refused (PostgreSQL cannot store one in text).
NUL_IN_REASON = "A reason may not hold a NUL character (\\x00): the database cannot store it."


def _exists(name: str, alias: str) -> bool:
    """Whether ``name`` is a queue: declared, or it has jobs, or it was paused before."""
    if name in get_settings().known_queues:
        return True
    if QueueState.objects.using(alias).filter(queue_name=name).exists():
        return True
    return Job.objects.using(alias).filter(queue_name=name).exists()


def _change(
    queue: str, paused: bool, *, user: User | None, actor: str, reason: str, using: str | None
) -> QueueChange:

    verb = "pause" if paused else "resume"
    if user is not None and not can_pause(user):
        raise QueuePermissionDenied(f"You may not {verb} queues: that needs the {PERMISSION!r} permission.")
    name = _validated_name(queue)
    reason = (reason or "").strip()
    if paused and not reason:
        raise QueueError("A reason is required to pause a queue: it goes into the audit trail.")
    if len(reason) > MAX_REASON_LENGTH:
        raise QueueError(f"A reason is at most {MAX_REASON_LENGTH} characters, not {len(reason)}.")
    if "\x00" in reason:
        raise QueueError(NUL_IN_REASON)
    alias = using or get_settings().database_alias
    if paused and not _exists(name, alias):
        known = ", ".join(get_settings().known_queues)
        raise QueueError(
            f"Queue {name!r} does not exist: it is not declared in JOBGUARD['QUEUES'] and no job was "
            f"ever enqueued to it. Known queues: {known}. Check the spelling."
        )
    who = (user.get_username() if user is not None else actor or "system")[:150]
    actor_pk = user.pk if user is not None and user.is_authenticated else None
    with transaction.atomic(using=alias):
        state, created = (
            QueueState.objects.using(alias)
            .select_for_update()
            .get_or_create(queue_name=name, defaults={"paused": False})
        )
        if created and not paused:
            state.delete()  # resuming a queue never paused: leave no row behind
            return QueueChange(name, False, False, "", None, "")
        if state.paused == paused:
            return QueueChange(name, paused, False, state.changed_by_name, state.changed_at, state.reason)
        QueueState.objects.using(alias).filter(pk=name).update(
            paused=paused, changed_by_id=actor_pk, changed_by_name=who, changed_at=Now(), reason=reason
        )
        QueueEvent.objects.using(alias).create(
            queue_name=name,
            action=QueueAction.PAUSED if paused else QueueAction.RESUMED,
            actor_id=actor_pk,
            actor_name=who,
            reason=reason,
        )
        state.refresh_from_db(using=alias)
    logger.warning(
        "queue_%s queue=%r by=%r reason=%r", "paused" if paused else "resumed", name, who, reason or "-"
    )
    return QueueChange(name, paused, True, who, state.changed_at, reason)
