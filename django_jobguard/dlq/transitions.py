"""The ``ReplayState`` machine: which user-made transition leads from which state to which.

Each transition is one transaction: a conditional update of ``replay_state`` (so of two
concurrent approvals exactly one wins) and a :class:`ReplayEvent` row saying who, when and
why. Signals and metrics follow the commit. :mod:`.replay` makes the user's transitions,
:mod:`.redrive` the last one, ``approved`` → ``replayed``.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction

from .. import _dispatch, events, signals
from ..actors import User
from ..exceptions import ReplayError
from ..models import DeadLetter, Job, ReplayAction, ReplayEvent, ReplayState

# The package's logger: records keep the name they had before dlq became a package.
logger = logging.getLogger("django_jobguard.dlq")

__all__ = [
    "ALLOWED_FROM",
    "APPROVE",
    "LEADS_TO",
    "MAX_REASON_LENGTH",
    "REJECT",
    "REQUEST",
    "RacedError",
    "Transition",
    "announce_transition",
    "check_state",
    "checked_reason",
    "locked",
    "refreshed",
    "transition",
    "transition_many",
]


class Transition(enum.StrEnum):
    """A replay step a user makes (the worker's redrive is the step no user makes)."""

    REQUEST = "request"
    APPROVE = "approve"
    REJECT = "reject"


REQUEST = Transition.REQUEST
APPROVE = Transition.APPROVE
REJECT = Transition.REJECT

#: Replay states each transition may start from...
ALLOWED_FROM: dict[Transition, tuple[ReplayState, ...]] = {
    REQUEST: (ReplayState.NONE, ReplayState.REJECTED),
    APPROVE: (ReplayState.REQUESTED,),
    REJECT: (ReplayState.REQUESTED, ReplayState.APPROVED),
}
#: ...and the state it leads to.
LEADS_TO: dict[Transition, ReplayState] = {
    REQUEST: ReplayState.REQUESTED,
    APPROVE: ReplayState.APPROVED,
    REJECT: ReplayState.REJECTED,
}

#: The signal each state a dead letter enters sends.
_SIGNALS = {
    ReplayState.REQUESTED: signals.replay_requested,
    ReplayState.APPROVED: signals.replay_approved,
    ReplayState.REJECTED: signals.replay_rejected,
    ReplayState.REPLAYED: signals.replay_redriven,
}


#: The longest reason a replay step keeps (the API's limit too): a page must stay readable.
MAX_REASON_LENGTH = 10_000


def checked_reason(reason: str, action: Transition) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ReplayError(f"A reason is required to {action} a replay: it goes into the audit trail.")
    if len(reason) > MAX_REASON_LENGTH:
        raise ReplayError(f"A reason is at most {MAX_REASON_LENGTH} characters, not {len(reason)}.")
    return reason


def locked(alias: str, dead_letter: DeadLetter | int) -> DeadLetter:
    pk = dead_letter.pk if isinstance(dead_letter, DeadLetter) else dead_letter
    return DeadLetter.objects.using(alias).select_for_update().get(pk=pk)


def refreshed(alias: str, given: DeadLetter | int, letter: DeadLetter) -> DeadLetter:
    letter.refresh_from_db(using=alias)
    if isinstance(given, DeadLetter) and given is not letter:
        given.refresh_from_db(using=alias)
    return letter


def check_state(letter: DeadLetter, action: Transition) -> None:
    if letter.replay_state in ALLOWED_FROM[action]:
        return
    if letter.replay_state == ReplayState.REPLAYED:
        detail = f"it was replayed already as job #{letter.replay_job_id}"
    else:
        detail = f"its replay is {letter.replay_state}"
    allowed = " or ".join(ALLOWED_FROM[action])
    raise ReplayError(
        f"Cannot {action} a replay of dead letter #{letter.pk}: {detail} (allowed from {allowed})."
    )


class RacedError(ReplayError):
    """A dead letter moved between the read and the update (a concurrent step won)."""


def transition(
    alias: str,
    letter: DeadLetter,
    action: Transition,
    user: User,
    reason: str,
    data: dict[str, Any],
    **fields: Any,
) -> None:
    """Move one locked dead letter; see :func:`transition_many`."""
    transition_many(alias, [letter], action, user, reason, lambda _letter: data, **fields)


def transition_many(
    alias: str,
    letters: Sequence[DeadLetter],
    action: Transition,
    user: User,
    reason: str,
    data: Callable[[DeadLetter], dict[str, Any]],
    **fields: Any,
) -> None:
    """Move ``letters`` (read under a row lock, each allowed to make ``action``) in a few statements.

    One conditional UPDATE per starting state, one INSERT of every :class:`ReplayEvent`
    (``data(letter)`` is each one's data), and one commit hook that announces them all.
    Raises :class:`RacedError` if any row was no longer in the state it was read in; the caller's
    transaction then rolls back whole.
    """
    if not letters:
        return
    to_state = LEADS_TO[action]
    by_state: dict[str, list[int]] = {}
    for letter in letters:
        by_state.setdefault(letter.replay_state, []).append(letter.pk)
    for state, pks in by_state.items():
        # The row lock already serialises us; the state in the WHERE is what makes the
        # transition exactly-once on databases without row locks as well.
        moved = (
            DeadLetter.objects.using(alias)
            .filter(pk__in=pks, replay_state=state)
            .update(replay_state=to_state, **fields)
        )
        if moved != len(pks):
            named = f"#{pks[0]}" if len(pks) == 1 else f"{len(pks) - moved} of {len(pks)}"
            raise RacedError(f"Dead letter {named} changed while this {action} was made; reload it.")
    actor_name = user.get_username()[:150]
    ReplayEvent.objects.using(alias).bulk_create(
        ReplayEvent(
            dead_letter_id=letter.pk,
            action=ReplayAction(to_state),
            actor_id=user.pk,
            actor_name=actor_name,
            reason=reason,
            data=data(letter),
        )
        for letter in letters
    )
    for letter in letters:
        logger.info(
            "replay_%s dead_letter_id=%s task=%r user=%r",
            to_state,
            letter.pk,
            letter.task_name,
            actor_name,
            extra={"dead_letter_id": letter.pk, "job_type": letter.task_name, "queue": letter.queue_name},
        )
    pks = [letter.pk for letter in letters]
    transaction.on_commit(functools.partial(_announce_many, alias, pks, to_state, user), using=alias)


def _announce_many(alias: str, pks: list[int], state: ReplayState, user: User | None) -> None:
    for letter in DeadLetter.objects.using(alias).filter(pk__in=pks).iterator(chunk_size=500):
        _announce(letter, state, user, None)


def announce_transition(
    alias: str, letter_pk: int, state: ReplayState, user: User | None, job: Job | None
) -> None:
    """After the commit: the metric and the signal of the state the dead letter entered."""
    letter = DeadLetter.objects.using(alias).filter(pk=letter_pk).first()
    if letter is not None:
        _announce(letter, state, user, job)


def _announce(letter: DeadLetter, state: ReplayState, user: User | None, job: Job | None) -> None:
    events.emit(events.ReplayMoved(letter.queue_name, letter.task_name, state.value))
    extra = {"job": job} if state == ReplayState.REPLAYED else {}
    _dispatch.send(_SIGNALS[state], dead_letter=letter, user=user, **extra)
