"""The dead-letter queue: dead-lettering, and the replay workflow (request, approve, reject, redrive).

Admin, API and commands call these functions; the rules live here once.

- :func:`request_replay` (permission ``jobguard.request_replay``; a corrected payload also
  needs ``jobguard.view_payload``) moves a dead letter from ``none`` or ``rejected`` to
  ``requested``. The payload, corrected or not, must bind to the handler's signature and be JSON.
- :func:`approve_replay` (``jobguard.approve_replay``; not by the requester unless
  ``JOBGUARD["REPLAY"]["ALLOW_SELF_APPROVAL"]``) moves it to ``approved``;
  :func:`reject_replay` (``jobguard.approve_replay``) moves a requested or approved, not yet
  redriven, replay to ``rejected``.
- :func:`redrive`, run by every worker between claims, turns approved replays into new jobs,
  at most ``JOBGUARD["REPLAY"]["RATE_PER_MINUTE"]`` a minute across all workers, and marks
  them ``replayed``. The new job keeps the idempotency key, and the key's row points at it
  under the fingerprint of the payload it runs: after a corrected replay, an enqueue of the key
  with the original arguments is an :class:`IdempotencyConflict` (docs/runbooks/dead-letters.md).
- :func:`review_correction` says what a corrected payload changes (by argument name) and
  warns when the idempotency key's fingerprint or the lock key depends on what changed.

Every transition is one transaction: a conditional update of ``replay_state`` (so of two
concurrent approvals, or two workers redriving, exactly one wins) and a :class:`ReplayEvent`
row saying who, when and why. Signals and metrics follow the commit.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import inspect
import json
import logging
import math
from typing import TYPE_CHECKING, Any, Protocol

from django.db import DatabaseError, transaction
from django.db.models import Count, Q
from django.db.models.functions import Now
from django.utils import timezone

from . import _dispatch, idempotency, metrics, signals, store
from .conf import get_settings
from .enqueue import prepare as prepare_job_fields
from .enqueue import validate_payload
from .exceptions import InvalidArgumentsError, LeaseLost, ReplayError, ReplayPermissionDenied
from .registry import registry

if TYPE_CHECKING:
    from .models import DeadLetter, Job
    from .task import Task

logger = logging.getLogger(__name__)

__all__ = [
    "APPROVE",
    "REJECT",
    "REQUEST",
    "CorrectionReview",
    "FieldChange",
    "approve_replay",
    "available_actions",
    "can_view_payload",
    "check_permission",
    "dead_letter",
    "describe_key",
    "redrive",
    "redrive_estimate",
    "reject_replay",
    "replay_actions",
    "request_replay",
    "review_correction",
]

#: The throttle counts redrives in this window against ``RATE_PER_MINUTE``...
RATE_WINDOW_SECONDS = 60
#: ...and in this one against a sixth of it (rounded up), so a minute's budget is spread out
#: instead of spent in one burst the moment a mass approval lands.
BURST_WINDOW_SECONDS = 10
#: Row of ``jobguard_lock`` whose row lock serialises redrive passes across all workers.
THROTTLE_LOCK_KEY = "jobguard:replay-throttle"
#: Candidates looked at past the budget, for when some must wait for their idempotency key.
REDRIVE_LOOKAHEAD = 20

REQUEST = "request"
APPROVE = "approve"
REJECT = "reject"

#: The permission each user-made transition needs (codenames on DeadLetter.Meta).
PERMISSIONS = {
    REQUEST: "jobguard.request_replay",
    APPROVE: "jobguard.approve_replay",
    REJECT: "jobguard.approve_replay",
}
VIEW_PAYLOAD = "jobguard.view_payload"
#: Keys of a ReplayEvent's ``data`` that carry payload (a corrected args / kwargs): shown only
#: to users with VIEW_PAYLOAD, in the admin and the API alike.
PAYLOAD_EVENT_KEYS = frozenset({"args", "kwargs"})

#: Replay states each transition may start from.
_FROM = {
    REQUEST: ("none", "rejected"),
    APPROVE: ("requested",),
    REJECT: ("requested", "approved"),
}
_TO = {REQUEST: "requested", APPROVE: "approved", REJECT: "rejected"}


class User(Protocol):
    """What the replay functions need of a user: Django's ``User`` and ``AnonymousUser`` fit."""

    @property
    def pk(self) -> Any: ...

    @property
    def is_authenticated(self) -> bool: ...

    def has_perm(self, perm: str, obj: Any = None) -> bool: ...

    def get_username(self) -> str: ...


# -- dead-lettering ----------------------------------------------------------------------------


def dead_letter(
    alias: str,
    job_id: int,
    lease_token: str,
    *,
    reason: str,
    category: str,
    error_class: str = "",
    error_message: str = "",
    traceback: str = "",
    worker_id: str = "",
    idempotency_scope: str | None = None,
) -> DeadLetter:
    """Mark the job dead and store its dead letter in one transaction, fenced by the lease.

    Raises :class:`LeaseLost` (and writes nothing) if the lease moved on. The job's
    idempotency key, if any, is marked failed, so an approved replay may use it again.
    """
    from .models import DeadLetter, Job

    summary = f"{error_class}: {error_message}" if error_class else error_message
    with transaction.atomic(using=alias):
        attempt_error = (_class_path(error_class), error_message, traceback)
        if not store.mark_dead(alias, job_id, lease_token, summary, attempt_error):
            raise LeaseLost(f"job {job_id}: lease lost before dead-lettering")
        job = Job.objects.using(alias).get(pk=job_id)
        failed_at = job.finished_at or timezone.now()
        letter = DeadLetter.objects.using(alias).create(
            job=job,
            task_name=job.task_name,
            queue_name=job.queue_name,
            args=job.args,
            kwargs=job.kwargs,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            reason=reason,
            category=category,
            error_class=error_class[:255],
            error_message=error_message,
            traceback=traceback,
            first_failed_at=job.first_failed_at or failed_at,
            last_failed_at=failed_at,
            handler_version=job.handler_version,
            worker_id=(worker_id or job.worker_id)[:128],
            idempotency_key=job.idempotency_key,
            lock_key=job.lock_key,
        )
        if job.idempotency_key:
            # The reaper has no task at hand; a task with its own idempotency_scope keeps its
            # keys there, so look it up rather than assume the task name.
            scope = idempotency_scope or _scope(registry.find(job.task_name), job.task_name)
            idempotency.record_failure(alias, scope, job.idempotency_key, job.pk)
        transaction.on_commit(functools.partial(_announce_dead_letter, letter), using=alias)
    return letter


def _class_path(error_class: str) -> str:
    """The importable path of a recorded error class (Django's ``TaskError`` resolves it)."""
    import builtins

    from . import exceptions

    if "." in error_class or not error_class:
        return error_class
    if error_class == "LeaseExpired":  # the reaper's name for a lost lease
        return f"{exceptions.__name__}.LeaseLost"
    if isinstance(getattr(builtins, error_class, None), type):
        return f"builtins.{error_class}"
    if isinstance(getattr(exceptions, error_class, None), type):
        return f"{exceptions.__name__}.{error_class}"
    return error_class


def _announce_dead_letter(letter: DeadLetter) -> None:
    metrics.job_dead_lettered(letter.queue_name, letter.task_name, letter.reason)
    _dispatch.send(signals.job_dead_lettered, dead_letter=letter)


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
    for action, states in _FROM.items():
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
            result[action] = str(exc)
        else:
            result[action] = None
    return result


def describe_key(dead_letter: DeadLetter, *, using: str | None = None) -> str:
    """What the dead letter's idempotency key row says today, and what that means for its replay.

    ``""`` when the dead letter has no key. Names jobs by id, never payload values.
    """
    from .models import IdempotencyKey, IdempotencyStatus, Job, JobStatus

    letter = dead_letter
    if not letter.idempotency_key:
        return ""
    alias = using or get_settings().database_alias
    scope = _scope(registry.find(letter.task_name), letter.task_name)
    row = IdempotencyKey.objects.using(alias).filter(scope=scope, key=letter.idempotency_key).first()
    replayed = letter.replay_state == "replayed"
    if row is None:
        if replayed:
            return "no row (expired and pruned after the replay)"
        return "no row (expired and pruned): a replay recreates it"
    status = row.get_status_display()
    succeeded = row.status == IdempotencyStatus.SUCCEEDED
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
    if replayed:
        if succeeded and letter.replay_job_id is not None:
            replay = Job.objects.using(alias).filter(pk=letter.replay_job_id).values_list("status", flat=True)
            if replay.first() == JobStatus.SUCCEEDED:
                return f"{text}: the action succeeded through that job; the replay was acked as a duplicate"
        return text
    if succeeded:
        return f"{text}: the action succeeded since; a replay is acked as a duplicate without running"
    active = (JobStatus.QUEUED, JobStatus.RUNNING)
    if row.job_id is not None and Job.objects.using(alias).filter(pk=row.job_id, status__in=active).exists():
        return f"{text}: that job owns the action now, so an approved replay waits until it finishes"
    return f"{text}: a replay takes the key over"


# -- transitions ---------------------------------------------------------------------------------


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


def approve_replay(dead_letter: DeadLetter | int, user: User, reason: str) -> DeadLetter:
    """Approve the requested replay; a worker redrives it within the throttle.

    The payload is checked against the handler again: the code may have changed since the request.
    """
    reason = _reason(reason, APPROVE)
    alias = get_settings().database_alias
    with transaction.atomic(using=alias):
        letter = _locked(alias, dead_letter)
        check_permission(letter, user, APPROVE)
        _check_state(letter, APPROVE)
        _validated_payload(letter, letter.replay_args, letter.replay_kwargs)
        _transition(
            alias,
            letter,
            APPROVE,
            user,
            reason,
            {"payload_corrected": letter.replay_args is not None or letter.replay_kwargs is not None},
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


def _reason(reason: str, action: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise ReplayError(f"A reason is required to {action} a replay: it goes into the audit trail.")
    return reason


def _locked(alias: str, dead_letter: DeadLetter | int) -> DeadLetter:
    from .models import DeadLetter

    pk = dead_letter.pk if isinstance(dead_letter, DeadLetter) else dead_letter
    return DeadLetter.objects.using(alias).select_for_update().get(pk=pk)


def _refreshed(alias: str, given: DeadLetter | int, letter: DeadLetter) -> DeadLetter:
    from .models import DeadLetter

    letter.refresh_from_db(using=alias)
    if isinstance(given, DeadLetter) and given is not letter:
        given.refresh_from_db(using=alias)
    return letter


def _check_state(letter: DeadLetter, action: str) -> None:
    if letter.replay_state in _FROM[action]:
        return
    if letter.replay_state == "replayed":
        detail = f"it was replayed already as job #{letter.replay_job_id}"
    else:
        detail = f"its replay is {letter.replay_state}"
    allowed = " or ".join(_FROM[action])
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
    task.lock_key_for(task.bind(clean_args, clean_kwargs))
    return clean_args, clean_kwargs


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
    key_affected = bool(key) and _fingerprint(task, letter, letter.args, letter.kwargs) != _fingerprint(
        task, letter, new_args, new_kwargs
    )
    template = task.lock if task is not None else None
    lock_fields: tuple[str, ...] = ()
    corrected_lock = letter.lock_key
    if template and task is not None:
        from .task import _template_fields

        names = set(_template_fields(template))
        lock_fields = tuple(change.name for change in changes if change.name in names)
        corrected_lock = task.lock_key_for(task.bind(new_args, new_kwargs))
    warnings = []
    if key_affected:
        fields = ", ".join(change.name for change in changes)
        warnings.append(
            f"This correction changes {fields}, which the fingerprint of idempotency key {key!r} covers: "
            f"the replay takes the key over with the corrected arguments, so an enqueue of {key!r} with "
            "the original arguments raises IdempotencyConflict instead of returning this replay's job. "
            "To run the original action as well, enqueue it under another key."
        )
    if lock_fields and corrected_lock != letter.lock_key:
        warnings.append(
            f"This correction changes {', '.join(lock_fields)}, from which the lock key derives "
            f"(lock template {template!r}): the replay locks another resource than the dead job did."
        )
    return CorrectionReview(
        changes=tuple(changes),
        idempotency_key=key,
        key_affected=key_affected,
        lock_template=template,
        lock_fields=lock_fields,
        original_lock_key=letter.lock_key,
        corrected_lock_key=corrected_lock,
        warnings=tuple(warnings),
    )


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


def _transition(
    alias: str,
    letter: DeadLetter,
    action: str,
    user: User,
    reason: str,
    data: dict[str, Any],
    **fields: Any,
) -> None:
    from .models import DeadLetter, ReplayEvent

    to_state = _TO[action]
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
        action=to_state,
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
    transaction.on_commit(functools.partial(_announce, alias, letter.pk, to_state, user, None), using=alias)


_SIGNALS = {
    "requested": signals.replay_requested,
    "approved": signals.replay_approved,
    "rejected": signals.replay_rejected,
    "replayed": signals.replay_redriven,
}


def _announce(alias: str, letter_pk: int, state: str, user: User | None, job: Job | None) -> None:
    from .models import DeadLetter

    letter = DeadLetter.objects.using(alias).filter(pk=letter_pk).first()
    if letter is None:
        return
    metrics.replay_transition(letter.queue_name, letter.task_name, state)
    extra = {"job": job} if state == "replayed" else {}
    _dispatch.send(_SIGNALS[state], dead_letter=letter, user=user, **extra)


# -- redrive -------------------------------------------------------------------------------------


def redrive(*, limit: int | None = None, worker_id: str = "", using: str | None = None) -> list[Job]:
    """Turn approved replays into new jobs, as many as the throttle allows now; the jobs created.

    Workers call this between claims (every ``REAPER_INTERVAL`` seconds); call it yourself
    to redrive without a worker. Any number of processes may call it at once: a pass holds
    a row lock that serialises passes (a worker that finds it taken skips its pass), and
    each dead letter moves ``approved`` → ``replayed`` in a conditional update, so it yields
    exactly one job. The throttle allows at most ``RATE_PER_MINUTE`` redrives in any 60
    seconds and a sixth of that (rounded up) in any 10, counted on the database clock.
    """
    from .models import DeadLetter

    alias = using or get_settings().database_alias
    letters = DeadLetter.objects.using(alias)
    if not letters.awaiting_redrive().exists():
        return []
    _ensure_throttle_row(alias)
    redriven: list[tuple[int, Job]] = []
    with transaction.atomic(using=alias):
        if not _take_throttle(alias):
            return []  # another worker is redriving right now
        budget = _budget(alias)
        if limit is not None:
            budget = min(budget, limit)
        if budget <= 0:
            logger.debug("replay_throttled worker_id=%s", worker_id)
            return []
        candidates = list(
            letters.awaiting_redrive()
            .select_for_update(skip_locked=True)
            .order_by("replay_decided_at", "id")[: budget + REDRIVE_LOOKAHEAD]
        )
        for letter in candidates:
            if len(redriven) >= budget:
                break
            job = _redrive_one(alias, letter, worker_id)
            if job is not None:
                redriven.append((letter.pk, job))
        for letter_pk, job in redriven:
            transaction.on_commit(
                functools.partial(_announce_redrive, alias, letter_pk, job, worker_id), using=alias
            )
    return [job for _, job in redriven]


def _ensure_throttle_row(alias: str) -> None:
    from .models import Lock

    locks = Lock.objects.using(alias)
    if not locks.filter(key=THROTTLE_LOCK_KEY).exists():
        # Insert-or-ignore: the first worker ever to redrive creates it; racing workers are fine.
        locks.bulk_create([Lock(key=THROTTLE_LOCK_KEY)], ignore_conflicts=True)


def _take_throttle(alias: str) -> bool:
    """Lock the throttle row for this transaction; False if another worker holds it.

    Databases without row locks (SQLite) serialise write transactions anyway.
    """
    from .models import Lock

    rows = Lock.objects.using(alias).select_for_update(skip_locked=True).filter(key=THROTTLE_LOCK_KEY)
    return bool(list(rows.values_list("key", flat=True)))


@dataclasses.dataclass(frozen=True, slots=True)
class RedriveEstimate:
    """How long the throttle takes to redrive some replays once they are approved."""

    count: int
    #: Approved replays already waiting for a redrive: they go first.
    ahead: int
    rate_per_minute: int
    seconds: float


def redrive_estimate(count: int, *, using: str | None = None) -> RedriveEstimate:
    """The time the throttle needs for ``count`` more replays after those approved already.

    One query. A lower bound: workers redrive every ``REAPER_INTERVAL`` seconds, and only
    while some run.
    """
    from .models import DeadLetter

    alias = using or get_settings().database_alias
    rate = get_settings().replay.rate_per_minute
    ahead = DeadLetter.objects.using(alias).awaiting_redrive().count()
    return RedriveEstimate(count, ahead, rate, (ahead + count) * RATE_WINDOW_SECONDS / rate)


def _budget(alias: str) -> int:
    """Redrives the throttle allows now, from the ``replayed_at`` of recent replays."""
    from .models import DeadLetter

    rate = get_settings().replay.rate_per_minute
    burst = math.ceil(rate * BURST_WINDOW_SECONDS / RATE_WINDOW_SECONDS)
    minute_ago = Now() - datetime.timedelta(seconds=RATE_WINDOW_SECONDS)
    burst_ago = Now() - datetime.timedelta(seconds=BURST_WINDOW_SECONDS)
    counts = (
        DeadLetter.objects.using(alias)
        .filter(replay_state="replayed", replayed_at__gt=minute_ago)
        .aggregate(minute=Count("id"), burst=Count("id", filter=Q(replayed_at__gt=burst_ago)))
    )
    return min(rate - int(counts["minute"]), burst - int(counts["burst"]))


class _SkipRedriveError(Exception):
    """Undo this dead letter's redrive (savepoint) and leave it for a later pass."""


def _redrive_one(alias: str, letter: DeadLetter, worker_id: str) -> Job | None:
    from .models import DeadLetter, Job, ReplayEvent

    task = registry.find(letter.task_name)
    args = letter.replay_args if letter.replay_args is not None else letter.args
    kwargs = letter.replay_kwargs if letter.replay_kwargs is not None else letter.kwargs
    try:
        # A savepoint per dead letter: one that fails does not undo the others of the pass.
        with transaction.atomic(using=alias):
            key_row, key_state = None, "none"
            if letter.idempotency_key:
                digest = _fingerprint(task, letter, args, kwargs)
                key_row, key_state = idempotency.claim_for_replay(
                    alias, _scope(task, letter.task_name), letter.idempotency_key, digest, letter.job_id
                )
                if key_state == idempotency.REPLAY_BUSY:
                    raise _SkipRedriveError
            job = Job(**_job_fields(task, letter, args, kwargs))
            job.save(force_insert=True, using=alias)
            if key_row is not None:
                idempotency.hand_to_replay(alias, key_row, job.pk, digest)
            moved = (
                DeadLetter.objects.using(alias)
                .filter(pk=letter.pk, replay_state="approved", replay_job__isnull=True)
                .update(replay_state="replayed", replay_job=job, replayed_at=Now())
            )
            if moved != 1:
                raise _SkipRedriveError  # rejected or redriven elsewhere since we read it
            ReplayEvent.objects.using(alias).create(
                dead_letter_id=letter.pk,
                action="replayed",
                reason=f"redriven by worker {worker_id}" if worker_id else "redriven",
                data={"job_id": job.pk, "worker_id": worker_id, "idempotency_key": key_state},
            )
    except _SkipRedriveError:
        return None
    except DatabaseError:
        # Leave it approved; the next pass tries again and the others are not held up.
        logger.exception("replay_redrive_failed dead_letter_id=%s", letter.pk)
        return None
    return job


def _job_fields(task: Task[Any, Any] | None, letter: DeadLetter, args: Any, kwargs: Any) -> dict[str, Any]:
    """The new job's row: today's task options, the dead letter's queue, the replay payload."""
    fields: dict[str, Any] | None = None
    if task is not None:
        try:
            fields = prepare_job_fields(task.using(queue_name=letter.queue_name), args, kwargs)
        except InvalidArgumentsError:
            fields = None  # the handler changed since approval: the worker dead-letters it, saying so
    if fields is None:
        queue = get_settings().queue(letter.queue_name)
        fields = {
            "task_name": letter.task_name,
            "queue_name": letter.queue_name,
            "args": args,
            "kwargs": kwargs,
            "priority": task.priority if task else 0,
            "max_attempts": (task.max_attempts if task else None) or queue.max_attempts,
            "visibility_timeout": (task.visibility_timeout if task else None) or queue.visibility_timeout,
            "lock_key": letter.lock_key,
            "handler_version": letter.handler_version,
        }
    fields["idempotency_key"] = letter.idempotency_key
    return fields


def _scope(task: Task[Any, Any] | None, task_name: str) -> str:
    return idempotency.scope_of(task) if task is not None else task_name


def _fingerprint(task: Task[Any, Any] | None, letter: DeadLetter, args: Any, kwargs: Any) -> str:
    """The fingerprint of the call the replay runs (the corrected one, if corrected)."""
    if task is not None:
        try:
            return idempotency.fingerprint(task, args, kwargs)
        except InvalidArgumentsError:
            pass  # the handler changed since approval: the worker dead-letters the replay, saying so
    canonical = json.dumps(
        {"task": letter.task_name, "args": args, "kwargs": kwargs}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _announce_redrive(alias: str, letter_pk: int, job: Job, worker_id: str) -> None:
    logger.info(
        "replay_redriven dead_letter_id=%s job_id=%s task=%s worker_id=%s",
        letter_pk,
        job.pk,
        job.task_name,
        worker_id,
        extra={
            "dead_letter_id": letter_pk,
            "job_id": job.pk,
            "job_type": job.task_name,
            "queue": job.queue_name,
        },
    )
    metrics.job_enqueued(job.queue_name, job.task_name)
    _announce(alias, letter_pk, "replayed", None, job)
