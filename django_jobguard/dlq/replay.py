"""The replay workflow: who may make which transition, the ``ReplayState`` machine, and corrections.

A user-made transition (:class:`Transition`) moves a dead letter between the states of
:class:`~django_jobguard.models.ReplayState` as :data:`ALLOWED_FROM` and :data:`LEADS_TO`
say; :mod:`.redrive` makes the last one, ``approved`` → ``replayed``. Each transition is one
transaction: a conditional update of ``replay_state`` (so of two concurrent approvals exactly
one wins) and a :class:`ReplayEvent` row saying who, when and why. Signals and metrics
follow the commit.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import json
import logging
from typing import Any, Protocol

from django.db import transaction
from django.db.models.functions import Now

from .. import _dispatch, events, idempotency, signals
from .._annotations import mismatches
from .._json import validate_payload
from ..conf import get_settings
from ..exceptions import InvalidArgumentsError, ReplayConflict, ReplayError, ReplayPermissionDenied
from ..models import (
    DeadLetter,
    IdempotencyKey,
    IdempotencyStatus,
    Job,
    JobStatus,
    ReplayAction,
    ReplayEvent,
    ReplayState,
)
from ..registry import registry
from ..task import Task, _template_fields

# The package's logger: records keep the name they had before dlq became a package.
logger = logging.getLogger(__name__.rpartition(".")[0])

__all__ = [
    "ABSENT",
    "ALLOWED_FROM",
    "APPROVE",
    "LEADS_TO",
    "PAYLOAD_EVENT_KEYS",
    "PERMISSIONS",
    "REJECT",
    "REQUEST",
    "VIEW_PAYLOAD",
    "CorrectionReview",
    "FieldChange",
    "Transition",
    "User",
    "announce_transition",
    "approve_replay",
    "available_actions",
    "can_view_payload",
    "check_permission",
    "describe_key",
    "reject_replay",
    "replay_actions",
    "request_replay",
    "review_correction",
]


class Transition(enum.StrEnum):
    """A replay step a user makes (the worker's redrive is the step no user makes)."""

    REQUEST = "request"
    APPROVE = "approve"
    REJECT = "reject"


REQUEST = Transition.REQUEST
APPROVE = Transition.APPROVE
REJECT = Transition.REJECT

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


class User(Protocol):
    """What the replay functions need of a user: Django's ``User`` and ``AnonymousUser`` fit."""

    @property
    def pk(self) -> Any: ...

    @property
    def is_authenticated(self) -> bool: ...

    def has_perm(self, perm: str, obj: Any = None) -> bool: ...

    def get_username(self) -> str: ...


# -- permissions ---------------------------------------------------------------------------------


def can_view_payload(user: User | None) -> bool:
    """Whether ``user`` may see job payloads, stored results and tracebacks."""
    return bool(user is not None and user.is_authenticated and user.has_perm(VIEW_PAYLOAD))


def check_permission(dead_letter: DeadLetter, user: User | None, action: str) -> None:
    """Raise :class:`ReplayPermissionDenied` unless ``user`` may ``action`` this dead letter's replay.

    ``action`` is :data:`REQUEST`, :data:`APPROVE` or :data:`REJECT`. State is not checked
    here: a user without the permission is refused whatever the state.
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
                    _validated_payload(dead_letter)
                except InvalidArgumentsError:
                    if not can_view_payload(user):
                        raise
            elif action == APPROVE:
                _validated_payload(dead_letter, dead_letter.replay_args, dead_letter.replay_kwargs)
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
        _check_state(dead_letter, Transition(action))
    except ReplayError as exc:
        return str(exc)
    return replay_actions(dead_letter, user).get(action)


# -- the idempotency key -------------------------------------------------------------------------


def describe_key(dead_letter: DeadLetter, *, using: str | None = None) -> str:
    """What the dead letter's idempotency key row says today, and what that means for its replay.

    ``""`` when the dead letter has no key. Names jobs by id, never payload values.
    """
    letter = dead_letter
    if not letter.idempotency_key:
        return ""
    alias = using or get_settings().database_alias
    scope = idempotency.scope_of_name(letter.task_name)
    row = IdempotencyKey.objects.using(alias).filter(scope=scope, key=letter.idempotency_key).first()
    replayed = letter.replay_state == ReplayState.REPLAYED
    if row is None:
        if replayed:
            return "no row (expired and pruned after the replay)"
        return "no row (expired and pruned): a replay recreates it"
    status = row.get_status_display()
    if row.job_id is not None and row.job_id == letter.replay_job_id:
        outcome = {
            IdempotencyStatus.SUCCEEDED: "the replay ran the action",
            IdempotencyStatus.IN_PROGRESS: "the replay holds the key and has not finished",
            IdempotencyStatus.FAILED: "the replay failed too",
        }[IdempotencyStatus(row.status)]
        return f"{status} (job #{row.job_id}, this dead letter's replay): {outcome}"
    if row.job_id is not None and row.job_id == letter.job_id:
        text = f"{status} (job #{row.job_id}, the dead job)"
        return text if replayed else f"{text}: a replay takes the key over"
    text = f"{status} (job #{row.job_id}, another job)" if row.job_id is not None else f"{status} (no job)"
    return text + _key_held_elsewhere(alias, letter, row, replayed)


def _key_held_elsewhere(alias: str, letter: DeadLetter, row: IdempotencyKey, replayed: bool) -> str:
    """What a key row owned by neither the dead job nor its replay means for the replay."""
    succeeded = row.status == IdempotencyStatus.SUCCEEDED
    if replayed:
        if succeeded and letter.replay_job_id is not None:
            replay = Job.objects.using(alias).filter(pk=letter.replay_job_id).values_list("status", flat=True)
            if replay.first() == JobStatus.SUCCEEDED:
                return ": the action succeeded through that job; the replay was acked as a duplicate"
        return ""
    if succeeded:
        return ": the action succeeded since; a replay is acked as a duplicate without running"
    active = (JobStatus.QUEUED, JobStatus.RUNNING)
    if row.job_id is not None and Job.objects.using(alias).filter(pk=row.job_id, status__in=active).exists():
        return ": that job owns the action now, so an approved replay waits until it finishes"
    return ": a replay takes the key over"


# -- transitions ---------------------------------------------------------------------------------


#: Hex characters of a correction digest: enough to tell two reviews apart, short to show.
CORRECTION_DIGEST_LENGTH = 16


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
    reason = _reason(reason, REQUEST)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = _locked(alias, dead_letter)
        check_permission(letter, user, REQUEST)
        corrected = args is not None or kwargs is not None
        if corrected and not can_view_payload(user):
            raise ReplayPermissionDenied(
                f"{user.get_username()} may not correct payloads: that needs the {VIEW_PAYLOAD} permission."
            )
        _check_state(letter, REQUEST)
        new_args, new_kwargs = _validated_payload(letter, args, kwargs)
        # A "correction" identical to the original is no correction: the replay runs the original.
        corrected = (new_args, new_kwargs) != (letter.args, letter.kwargs)
        data: dict[str, Any] = {"payload_corrected": corrected}
        if corrected:
            data.update(args=new_args, kwargs=new_kwargs)
        _transition(
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
    return _refreshed(alias, dead_letter, letter)


def correction_digest(letter: DeadLetter) -> str:
    """A short digest of the payload a replay of ``letter`` would run (its correction, if any).

    An approver's page or client reads it with the correction it shows, and hands it back
    with the approval, so an approval is bound to what was reviewed.
    """
    payload = {"args": letter.replay_args, "kwargs": letter.replay_kwargs}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:CORRECTION_DIGEST_LENGTH]


def approve_replay(
    dead_letter: DeadLetter | int, user: User, reason: str, *, reviewed: str | None = None
) -> DeadLetter:
    """Approve the requested replay; a worker redrives it within the throttle.

    The payload is checked against the handler again: the code may have changed since the
    request. ``reviewed`` is the :func:`correction_digest` the approver saw: if the
    correction changed since, :class:`ReplayConflict` is raised and nothing changes (the
    admin always sends it; an API client should).
    """
    reason = _reason(reason, APPROVE)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = _locked(alias, dead_letter)
        check_permission(letter, user, APPROVE)
        _check_state(letter, APPROVE)
        digest = correction_digest(letter)
        if reviewed is not None and reviewed != digest:
            raise ReplayConflict(
                f"The replay's payload changed since you reviewed it (digest {reviewed}, now {digest}): "
                "review it again before approving."
            )
        _validated_payload(letter, letter.replay_args, letter.replay_kwargs)
        _transition(
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
    return _refreshed(alias, dead_letter, letter)


def reject_replay(dead_letter: DeadLetter | int, user: User, reason: str) -> DeadLetter:
    """Reject a requested replay, or withdraw an approved one that no worker has redriven yet."""
    reason = _reason(reason, REJECT)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = _locked(alias, dead_letter)
        check_permission(letter, user, REJECT)
        _check_state(letter, REJECT)
        _transition(
            alias,
            letter,
            REJECT,
            user,
            reason,
            {"previous_state": letter.replay_state},
            replay_decided_by=user,
            replay_decided_at=Now(),
        )
    return _refreshed(alias, dead_letter, letter)


#: The longest reason a replay step keeps (the API's limit too): a page must stay readable.
MAX_REASON_LENGTH = 10_000


def _reason(reason: str, action: Transition) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ReplayError(f"A reason is required to {action} a replay: it goes into the audit trail.")
    if len(reason) > MAX_REASON_LENGTH:
        raise ReplayError(f"A reason is at most {MAX_REASON_LENGTH} characters, not {len(reason)}.")
    return reason


def _locked(alias: str, dead_letter: DeadLetter | int) -> DeadLetter:
    pk = dead_letter.pk if isinstance(dead_letter, DeadLetter) else dead_letter
    return DeadLetter.objects.using(alias).select_for_update().get(pk=pk)


def _refreshed(alias: str, given: DeadLetter | int, letter: DeadLetter) -> DeadLetter:
    letter.refresh_from_db(using=alias)
    if isinstance(given, DeadLetter) and given is not letter:
        given.refresh_from_db(using=alias)
    return letter


def _check_state(letter: DeadLetter, action: Transition) -> None:
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


def _validated_payload(
    letter: DeadLetter, args: Any = None, kwargs: Any = None
) -> tuple[list[Any], dict[str, Any]]:
    """The payload a replay would run, checked against the task registered in this process."""
    task = registry.find(letter.task_name)
    if task is None:
        raise ReplayError(
            f"Task {letter.task_name!r} is not registered in this process, so the payload cannot be "
            "checked against its handler; deploy the task first."
        )
    args = letter.args if args is None else args
    kwargs = letter.kwargs if kwargs is None else kwargs
    if not isinstance(args, list | tuple):
        raise InvalidArgumentsError(f"args must be a JSON array, not {type(args).__name__}.")
    if not isinstance(kwargs, dict):
        raise InvalidArgumentsError(f"kwargs must be a JSON object, not {type(kwargs).__name__}.")
    # The same checks as an enqueue (types, unstorable strings, depth, cycles, size).
    clean_args, clean_kwargs = validate_payload(args, kwargs)
    bound = task.bind(clean_args, clean_kwargs)
    # A value that binds can still be the wrong type for the handler (it would only fail
    # when the replay runs): checked where JSON can tell.
    wrong = mismatches(task.func, bound.arguments)
    if wrong:
        raise InvalidArgumentsError(f"Arguments do not fit {task.name}'s annotations: {'; '.join(wrong)}.")
    task.lock_key_for(bound)
    return clean_args, clean_kwargs


def _transition(
    alias: str,
    letter: DeadLetter,
    action: Transition,
    user: User,
    reason: str,
    data: dict[str, Any],
    **fields: Any,
) -> None:
    to_state = LEADS_TO[action]
    # The row lock already serialises us; the state in the WHERE is what makes the
    # transition exactly-once on databases without row locks as well.
    moved = (
        DeadLetter.objects.using(alias)
        .filter(pk=letter.pk, replay_state=letter.replay_state)
        .update(replay_state=to_state, **fields)
    )
    if moved != 1:
        raise ReplayError(f"Dead letter #{letter.pk} changed while this {action} was made; reload it.")
    ReplayEvent.objects.using(alias).create(
        dead_letter_id=letter.pk,
        action=ReplayAction(to_state),
        actor_id=user.pk,
        actor_name=user.get_username()[:150],
        reason=reason,
        data=data,
    )
    logger.info(
        "replay_%s dead_letter_id=%s task=%s user=%s",
        to_state,
        letter.pk,
        letter.task_name,
        user.get_username(),
        extra={"dead_letter_id": letter.pk, "job_type": letter.task_name, "queue": letter.queue_name},
    )
    transaction.on_commit(
        functools.partial(announce_transition, alias, letter.pk, to_state, user, None), using=alias
    )


def announce_transition(
    alias: str, letter_pk: int, state: ReplayState, user: User | None, job: Job | None
) -> None:
    """After the commit: the metric and the signal of the state the dead letter entered."""
    letter = DeadLetter.objects.using(alias).filter(pk=letter_pk).first()
    if letter is None:
        return
    events.emit(events.ReplayMoved(letter.queue_name, letter.task_name, state.value))
    extra = {"job": job} if state == ReplayState.REPLAYED else {}
    _dispatch.send(_SIGNALS[state], dead_letter=letter, user=user, **extra)


# -- reviewing a correction ----------------------------------------------------------------------


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: A FieldChange's value when the argument is not in that payload at all.
ABSENT: Any = _Absent()


@dataclasses.dataclass(frozen=True)
class FieldChange:
    """One argument a correction changes: its name, the original value and the corrected one.

    ``name`` is the handler's parameter name when both payloads fit the handler, else its
    place in the payload (``args[0]``, ``kwargs.amount``). A value is :data:`ABSENT` when
    that payload does not have the argument.
    """

    name: str
    original: Any
    corrected: Any


@dataclasses.dataclass(frozen=True)
class CorrectionReview:
    """What a replay's payload changes, and what that does to its idempotency key and lock key.

    Built by :func:`review_correction` for the surfaces (admin, API) to render. ``warnings``
    name arguments and keys but never their values, so every viewer may see them; the
    ``changes`` (with values) and ``corrected_lock_key`` are for users who may see payloads.
    """

    changes: tuple[FieldChange, ...]
    idempotency_key: str
    #: The correction changes what the key's fingerprint covers (every argument, by name).
    key_affected: bool
    lock_template: str | None
    #: Changed arguments the lock key derives from (the task's ``lock`` template).
    lock_fields: tuple[str, ...]
    original_lock_key: str
    corrected_lock_key: str
    warnings: tuple[str, ...]

    @property
    def corrected(self) -> bool:
        """Whether the replay runs another payload than the dead job did."""
        return bool(self.changes)

    @property
    def changed_fields(self) -> list[str]:
        """The names of the changed arguments (safe to show without ``jobguard.view_payload``)."""
        return [change.name for change in self.changes]


def review_correction(
    dead_letter: DeadLetter, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None
) -> CorrectionReview:
    """Compare the dead letter's payload with a correction: ``args`` / ``kwargs``, or the stored one.

    Left out, the correction is the one stored on the dead letter by :func:`request_replay`
    (none: the replay runs the original). Raises :class:`InvalidArgumentsError` or
    :class:`ReplayError` as :func:`request_replay` would for a payload it refuses.
    """
    letter = dead_letter
    if args is None and kwargs is None:
        args, kwargs = letter.replay_args, letter.replay_kwargs
    if args is None and kwargs is None:
        new_args, new_kwargs = letter.args, letter.kwargs
    else:
        new_args, new_kwargs = _validated_payload(letter, args, kwargs)
    task = registry.find(letter.task_name)
    changes = _changes(task, letter.args, letter.kwargs, new_args, new_kwargs)
    key = letter.idempotency_key or ""
    key_affected = bool(key) and idempotency.replay_fingerprint(
        task, letter.task_name, letter.args, letter.kwargs
    ) != idempotency.replay_fingerprint(task, letter.task_name, new_args, new_kwargs)
    template = task.lock if task is not None else None
    lock_fields: tuple[str, ...] = ()
    corrected_lock = letter.lock_key
    if template and task is not None:
        names = set(_template_fields(template))
        lock_fields = tuple(change.name for change in changes if change.name in names)
        corrected_lock = task.lock_key_for(task.bind(new_args, new_kwargs))
    return CorrectionReview(
        changes=tuple(changes),
        idempotency_key=key,
        key_affected=key_affected,
        lock_template=template,
        lock_fields=lock_fields,
        original_lock_key=letter.lock_key,
        corrected_lock_key=corrected_lock,
        warnings=_review_warnings(letter, changes, key_affected, template, lock_fields, corrected_lock),
    )


def _review_warnings(
    letter: DeadLetter,
    changes: list[FieldChange],
    key_affected: bool,
    template: str | None,
    lock_fields: tuple[str, ...],
    corrected_lock: str,
) -> tuple[str, ...]:
    """The review's warnings: names of arguments and keys, never their values."""
    warnings = []
    if key_affected:
        fields = ", ".join(change.name for change in changes)
        warnings.append(
            # The key itself is made of arguments: approvers without view_payload read this too.
            f"This correction changes {fields}, which the fingerprint of the job's idempotency key covers: "
            "the replay takes the key over with the corrected arguments, so an enqueue of that key with "
            "the original arguments raises IdempotencyConflict instead of returning this replay's job. "
            "To run the original action as well, enqueue it under another key."
        )
    if lock_fields and corrected_lock != letter.lock_key:
        warnings.append(
            f"This correction changes {', '.join(lock_fields)}, from which the lock key derives "
            f"(lock template {template!r}): the replay locks another resource than the dead job did."
        )
    return tuple(warnings)


def _changes(
    task: Task[Any, Any] | None, args: Any, kwargs: Any, new_args: Any, new_kwargs: Any
) -> list[FieldChange]:
    """The arguments that differ, by parameter name when both payloads fit the handler."""
    named_before, named_after = _by_name(task, args, kwargs), _by_name(task, new_args, new_kwargs)
    if named_before is not None and named_after is not None:
        before, after = named_before, named_after
    else:
        before, after = _by_place(args, kwargs), _by_place(new_args, new_kwargs)
    names = list(before) + [name for name in after if name not in before]
    return [
        FieldChange(name, before.get(name, ABSENT), after.get(name, ABSENT))
        for name in names
        if before.get(name, ABSENT) != after.get(name, ABSENT)
    ]


def _by_name(task: Task[Any, Any] | None, args: Any, kwargs: Any) -> dict[str, Any] | None:
    if task is None or not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    try:
        bound = task.bind(args, kwargs)
    except InvalidArgumentsError:
        return None  # e.g. an invalid_payload dead letter: compare by place instead
    values: dict[str, Any] = {}
    for name, param in task.signature.parameters.items():
        if name in bound.arguments:
            value = bound.arguments[name]
            values[name] = list(value) if param.kind is inspect.Parameter.VAR_POSITIONAL else value
        elif param.default is not inspect.Parameter.empty:
            values[name] = param.default  # f(1) and f(1, b=0) run the same call
    return values


def _by_place(args: Any, kwargs: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for index, value in enumerate(args if isinstance(args, list) else [args]):
        values[f"args[{index}]"] = value
    for name, value in (kwargs if isinstance(kwargs, dict) else {"": kwargs}).items():
        values[f"kwargs.{name}"] = value
    return values
