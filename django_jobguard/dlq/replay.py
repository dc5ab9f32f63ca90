"""The replay steps a user makes: request, approve, reject (each checked, each one transaction)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from ..actors import User
from ..conf import get_settings
from ..encryption import DecryptionError
from ..encryption.payloads import ARGS, KWARGS, open_json, seal_json
from ..exceptions import (
    InvalidArgumentsError,
    ReplayConflict,
    ReplayError,
    ReplayPermissionDenied,
    ReplayReviewRequired,
)
from ..models import DeadLetter
from .corrections import (
    correction_digest,
    digest_matches,
    original_payload,
    sealed_letter,
    validated_payload,
)
from .patch import PatchOperation, apply_patch
from .permissions import VIEW_PAYLOAD, can_view_payload, check_permission
from .transitions import (
    APPROVE,
    REJECT,
    REQUEST,
    RacedError,
    Transition,
    check_state,
    checked_reason,
    locked,
    refreshed,
    transition,
    transition_many,
)

__all__ = [
    "BULK_CHUNK",
    "BulkDecision",
    "approve_replay",
    "check_review",
    "decide_many",
    "reject_replay",
    "request_many_corrected",
    "request_replay",
]

#: Dead letters per transaction of :func:`decide_many`: each chunk holds its row locks until
#: its commit, so the chunk bounds how long a worker's redrive may wait on them.
BULK_CHUNK = 500


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
        corrected = (new_args, new_kwargs) != original_payload(letter)
        data: dict[str, Any] = {"payload_corrected": corrected}
        if corrected and sealed_letter(letter):
            # The correction is payload too: stored sealed, in the letter and in its event.
            new_args, new_kwargs = seal_json(new_args, ARGS), seal_json(new_kwargs, KWARGS)
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
    dead_letter: DeadLetter | int,
    user: User,
    reason: str,
    *,
    reviewed: str | None = None,
    require_review: bool = False,
) -> DeadLetter:
    """Approve the requested replay; a worker redrives it within the throttle.

    The payload is checked against the handler again: the code may have changed since the
    request. A corrected payload is approved only by a user with ``jobguard.view_payload``
    (:class:`ReplayPermissionDenied`). ``reviewed`` is the :func:`correction_digest` the
    approver saw: if the payload changed since, :class:`ReplayConflict` is raised and nothing
    changes. With ``require_review`` (the admin and the API), a letter that carries a
    correction is not approved without ``reviewed`` (:class:`ReplayReviewRequired`).
    """
    reason = checked_reason(reason, APPROVE)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = locked(alias, dead_letter)
        check_permission(letter, user, APPROVE)
        check_state(letter, APPROVE)
        check_review(letter, reviewed, require_review)
        validated_payload(letter, letter.replay_args, letter.replay_kwargs)
        digest = correction_digest(letter)
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


def check_review(letter: DeadLetter, reviewed: str | None, required: bool) -> None:
    """Raise unless the approval is bound to ``letter``'s replay payload as it is now.

    ``reviewed`` is the :func:`correction_digest` the approver was shown (None: none was).
    A digest that no longer matches raises :class:`ReplayConflict`; none at all, when
    ``required`` and the letter carries a correction, :class:`ReplayReviewRequired`.
    """
    corrected = letter.replay_args is not None or letter.replay_kwargs is not None
    if reviewed is None:
        if required and corrected:
            raise ReplayReviewRequired(
                f"Dead letter #{letter.pk} replays a corrected payload, and this approval does not say "
                "which one was reviewed: send the correction_digest you were shown with it (in the admin, "
                "approve it on its own page or from a confirmation page that lists it)."
            )
        return
    if not digest_matches(letter, reviewed):
        raise ReplayConflict(
            f"Dead letter #{letter.pk}'s replay payload changed since you reviewed it (digest "
            f"{reviewed[:64]!r}, now {correction_digest(letter)!r}): review it again before approving."
        )


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


@dataclasses.dataclass(frozen=True)
class BulkDecision:
    """What :func:`decide_many` did: the dead letters moved, and each refused one with its reason."""

    moved: list[int]
    refused: list[tuple[int, str]]


def decide_many(
    action: str,
    ids: Iterable[int],
    user: User,
    reason: str,
    *,
    reviewed: Mapping[int, str] | None = None,
) -> BulkDecision:
    """Make ``action`` (request, approve or reject) on each dead letter of ``ids``, with one reason.

    The same checks as the one-letter functions (permission, self-approval, state, the payload
    against the handler), letter by letter; a refused letter is reported and the rest go on.
    An approver without ``jobguard.view_payload`` is refused the letters that replay a corrected
    payload, as :func:`approve_replay` refuses them. ``reviewed`` (approve) maps dead-letter
    ids to the :func:`correction_digest` the approver was shown: given, each approval is bound
    to it as :func:`approve_replay`'s is with ``require_review`` (a letter whose payload changed
    since, or that carries a correction the approver was not shown, is refused).
    Set-based: each chunk of :data:`BULK_CHUNK` letters is one transaction of a few statements
    (the locked read, one update per starting state, one insert of the events), instead of a
    transaction of several statements per letter. A bulk request asks for the original payload;
    a corrected one is approved as it was reviewed. If another step moved a letter of a chunk
    in between (possible on databases without row locks), that chunk is made again letter by
    letter.
    """
    step = Transition(action)
    reason = checked_reason(reason, step)
    alias = get_settings().database_alias
    wanted = sorted(set(ids))
    moved: list[int] = []
    refused: list[tuple[int, str]] = []
    for start in range(0, len(wanted), BULK_CHUNK):
        chunk = wanted[start : start + BULK_CHUNK]
        try:
            with transaction.atomic(using=alias):
                done, said_no = _decide_chunk(alias, step, chunk, user, reason, reviewed)
        except RacedError:
            done, said_no = _decide_one_by_one(step, chunk, user, reason, reviewed)
        moved += done
        refused += said_no
    return BulkDecision(moved, refused)


def _decide_chunk(
    alias: str,
    step: Transition,
    chunk: list[int],
    user: User,
    reason: str,
    reviewed: Mapping[int, str] | None,
) -> tuple[list[int], list[tuple[int, str]]]:
    letters = {
        letter.pk: letter
        for letter in DeadLetter.objects.using(alias).select_for_update().filter(pk__in=chunk).order_by("pk")
    }
    refused = [(pk, f"Dead letter #{pk} no longer exists.") for pk in chunk if pk not in letters]
    allowed: list[DeadLetter] = []
    data: dict[int, dict[str, Any]] = {}
    for letter in letters.values():
        try:
            check_permission(letter, user, step)
            check_state(letter, step)
            if step == REQUEST:
                args, kwargs = validated_payload(letter)
                if (args, kwargs) != original_payload(letter):
                    raise ReplayError(
                        f"Dead letter #{letter.pk}'s payload needs a correction: request it alone."
                    )
                data[letter.pk] = {"payload_corrected": False}
            elif step == APPROVE:
                corrected = letter.replay_args is not None or letter.replay_kwargs is not None
                if reviewed is not None:
                    check_review(letter, reviewed.get(letter.pk), required=True)
                validated_payload(letter, letter.replay_args, letter.replay_kwargs)
                data[letter.pk] = {
                    "payload_corrected": corrected,
                    "correction_digest": correction_digest(letter),
                }
            else:
                data[letter.pk] = {"previous_state": letter.replay_state}
        except (ReplayError, InvalidArgumentsError) as exc:
            refused.append((letter.pk, str(exc)))
        else:
            allowed.append(letter)
    fields: dict[str, Any] = {"replay_decided_by": user, "replay_decided_at": Now()}
    if step == REQUEST:
        fields = {
            "replay_args": None,
            "replay_kwargs": None,
            "replay_requested_by": user,
            "replay_requested_at": Now(),
            "replay_reason": reason,
            "replay_decided_by": None,
            "replay_decided_at": None,
        }
    transition_many(alias, allowed, step, user, reason, lambda letter: data[letter.pk], **fields)
    return [letter.pk for letter in allowed], refused


_ONE: dict[Transition, Callable[[int, User, str, Mapping[int, str] | None], DeadLetter]] = {
    REQUEST: lambda pk, user, reason, reviewed: request_replay(pk, user, reason),
    APPROVE: lambda pk, user, reason, reviewed: approve_replay(
        pk,
        user,
        reason,
        reviewed=None if reviewed is None else reviewed.get(pk),
        require_review=reviewed is not None,
    ),
    REJECT: lambda pk, user, reason, reviewed: reject_replay(pk, user, reason),
}


def _decide_one_by_one(
    step: Transition, chunk: list[int], user: User, reason: str, reviewed: Mapping[int, str] | None
) -> tuple[list[int], list[tuple[int, str]]]:
    moved: list[int] = []
    refused: list[tuple[int, str]] = []
    for pk in chunk:
        try:
            _ONE[step](pk, user, reason, reviewed)
        except DeadLetter.DoesNotExist:
            refused.append((pk, f"Dead letter #{pk} no longer exists."))
        except (ReplayError, InvalidArgumentsError) as exc:
            refused.append((pk, str(exc)))
        else:
            moved.append(pk)
    return moved, refused


def request_many_corrected(
    ids: Iterable[int], user: User, reason: str, patch: Sequence[PatchOperation]
) -> BulkDecision:
    """Request a replay of each dead letter of ``ids``, each corrected by the same JSON Patch.

    The patch (:func:`.patch.parse_patch`) applies to each letter's own kwargs; the result is
    that letter's correction, requested as :func:`request_replay` requests one (the
    ``jobguard.view_payload`` permission, the state, the handler's signature), so each is
    reviewed and approved bound to its own digest. A letter the patch does not apply to, or
    whose corrected payload the handler refuses, is reported and the rest go on. One
    transaction per letter.
    """
    reason = checked_reason(reason, REQUEST)
    if not can_view_payload(user):
        raise ReplayPermissionDenied(
            f"{user.get_username()} may not correct payloads: that needs the {VIEW_PAYLOAD} permission."
        )
    alias = get_settings().database_alias
    moved: list[int] = []
    refused: list[tuple[int, str]] = []
    for pk in sorted(set(ids)):
        try:
            stored = DeadLetter.objects.using(alias).values_list("kwargs", flat=True).get(pk=pk)
            try:
                kwargs = open_json(stored, KWARGS, "dead_letter.kwargs")
            except DecryptionError as exc:
                raise ReplayError(str(exc)) from None
            corrected = apply_patch(list(patch), kwargs if isinstance(kwargs, dict) else {})
            request_replay(pk, user, reason, kwargs=corrected)
        except DeadLetter.DoesNotExist:
            refused.append((pk, f"Dead letter #{pk} no longer exists."))
        except (ReplayError, InvalidArgumentsError) as exc:
            refused.append((pk, f"Dead letter #{pk}: {exc}"))
        else:
            moved.append(pk)
    return BulkDecision(moved, refused)
