"""Who may make which replay transition, and who may see payloads."""

from __future__ import annotations

from typing import Any

from ..actors import User
from ..conf import get_settings
from ..encryption.payloads import ARGS, KWARGS, readable_json
from ..exceptions import InvalidArgumentsError, ReplayError, ReplayPermissionDenied
from ..models import DeadLetter
from .corrections import CORRECTION_DIGEST_LENGTH, validated_payload
from .transitions import ALLOWED_FROM, APPROVE, REJECT, REQUEST, Transition, check_state

__all__ = [
    "PAYLOAD_EVENT_KEYS",
    "PERMISSIONS",
    "VIEW_PAYLOAD",
    "available_actions",
    "can_view_payload",
    "check_permission",
    "refusal_reason",
    "replay_actions",
    "visible_event_data",
]

#: The permission each user-made transition needs (codenames on DeadLetter.Meta).
PERMISSIONS: dict[str, str] = {
    REQUEST: "jobguard.request_replay",
    APPROVE: "jobguard.approve_replay",
    REJECT: "jobguard.approve_replay",
}
VIEW_PAYLOAD = "jobguard.view_payload"
#: Keys of a ReplayEvent's ``data`` that carry payload (a corrected args / kwargs): shown only
#: to users with VIEW_PAYLOAD, in the admin and the API alike.
PAYLOAD_EVENT_KEYS = frozenset({"args", "kwargs"})


def visible_event_data(data: dict[str, Any] | None, show_payload: bool) -> dict[str, Any]:
    """A ReplayEvent's ``data`` as a user sees it: without payload unless ``show_payload``.

    An approval recorded before the correction digest was keyed holds a plain SHA-256 of the
    payload (16 hex characters), which a few guesses reverse: it is payload, and hidden too.
    """
    visible = dict(data or {})
    if show_payload:
        # A correction of an encrypted payload is recorded sealed: opened for those who may see it.
        for key, field in (("args", ARGS), ("kwargs", KWARGS)):
            if key in visible:
                visible[key] = readable_json(visible[key], field, f"replay_event.{key}")
    else:
        for key in PAYLOAD_EVENT_KEYS:
            visible.pop(key, None)
        digest = visible.get("correction_digest")
        if isinstance(digest, str) and len(digest) != CORRECTION_DIGEST_LENGTH:
            visible.pop("correction_digest")
    return visible


def can_view_payload(user: User | None) -> bool:
    """Whether ``user`` may see job payloads, stored results and tracebacks."""
    return bool(user is not None and user.is_authenticated and user.has_perm(VIEW_PAYLOAD))


def check_permission(dead_letter: DeadLetter, user: User | None, action: str) -> None:
    """Raise :class:`ReplayPermissionDenied` unless ``user`` may ``action`` this dead letter's replay.

    ``action`` is :data:`REQUEST`, :data:`APPROVE` or :data:`REJECT`. State is not checked
    here: a user without the permission is refused whatever the state. Approving a replay
    that runs a corrected payload also needs :data:`VIEW_PAYLOAD`, to see what will run:
    every surface (admin page, bulk action, API) approves through this check.
    """
    permission = PERMISSIONS[action]
    if user is None or not user.is_authenticated or not user.has_perm(permission):
        name = user.get_username() if user is not None and user.is_authenticated else "an anonymous user"
        raise ReplayPermissionDenied(
            f"{name} may not {action} replays: that needs the {permission} permission."
        )
    if (
        action == APPROVE
        and dead_letter.replay_requested_by_id is not None
        and dead_letter.replay_requested_by_id == user.pk
        and not get_settings().replay.allow_self_approval
    ):
        raise ReplayPermissionDenied(
            f"{user.get_username()} requested this replay, so another user with {permission} must "
            "approve it (JOBGUARD['REPLAY']['ALLOW_SELF_APPROVAL'] is False)."
        )
    if (
        action == APPROVE
        and (dead_letter.replay_args is not None or dead_letter.replay_kwargs is not None)
        and not can_view_payload(user)
    ):
        raise ReplayPermissionDenied(
            f"Dead letter #{dead_letter.pk} replays a corrected payload: approving it needs the "
            f"{VIEW_PAYLOAD} permission, to see what will run ({user.get_username()} lacks it)."
        )


def available_actions(dead_letter: DeadLetter, user: User | None) -> list[str]:
    """The transitions ``user`` may make on ``dead_letter`` now (for buttons; each call checks again)."""
    return [action for action, refusal in replay_actions(dead_letter, user).items() if refusal is None]


def replay_actions(dead_letter: DeadLetter, user: User | None) -> dict[str, str | None]:
    """Each transition the dead letter's state allows, with why ``user`` cannot make it now.

    ``None`` means the transition can succeed now; a string is the refusal its service
    function would raise (the permission, self-approval, a task not registered in this
    process, a payload that no longer fits the handler). Transitions the state does not
    allow are left out: the state itself says why. A request stays offered to users who may
    correct the payload (``jobguard.view_payload``) when only the payload does not fit.
    """
    result: dict[str, str | None] = {}
    for action, states in ALLOWED_FROM.items():
        if dead_letter.replay_state not in states:
            continue
        try:
            check_permission(dead_letter, user, action)
            if action == REQUEST:
                try:
                    validated_payload(dead_letter)
                except InvalidArgumentsError:
                    if not can_view_payload(user):
                        raise
            elif action == APPROVE:
                validated_payload(dead_letter, dead_letter.replay_args, dead_letter.replay_kwargs)
        except (ReplayError, InvalidArgumentsError) as exc:
            result[action.value] = str(exc)
        else:
            result[action.value] = None
    return result


def refusal_reason(dead_letter: DeadLetter, user: User | None, action: str) -> str | None:
    """Why ``user`` cannot make ``action`` on the dead letter now (its state included); None if they can.

    The admin shows this instead of a form that could only fail.
    """
    try:
        check_state(dead_letter, Transition(action))
    except ReplayError as exc:
        return str(exc)
    return replay_actions(dead_letter, user).get(action)
