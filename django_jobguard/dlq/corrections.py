"""A replay's payload: checked against the handler, its digest, and what a correction changes."""

from __future__ import annotations

import dataclasses
import hmac
import inspect
import json
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from .. import idempotency
from .._annotations import mismatches
from .._json import validate_payload
from ..conf import get_settings
from ..encryption import DecryptionError, is_encrypted
from ..encryption.payloads import ARGS, KWARGS, open_json, seals
from ..exceptions import InvalidArgumentsError, ReplayError
from ..flow import template_fields
from ..models import DeadLetter
from ..registry import registry
from ..task import Task

__all__ = [
    "ABSENT",
    "CORRECTION_DIGEST_LENGTH",
    "CORRECTION_DIGEST_SALT",
    "CorrectionReview",
    "FieldChange",
    "correction_digest",
    "digest_matches",
    "original_payload",
    "review_correction",
    "sealed_letter",
    "validated_payload",
]

#: Hex characters of a correction digest (128 bits of an HMAC-SHA256): enough to tell two
#: reviews apart, short to show. A digest of another length is a former, unkeyed one.
CORRECTION_DIGEST_LENGTH = 32

#: The salt of the keyed correction digest (with Django's SECRET_KEY), as the idempotency
#: fingerprint has its own: the digest is shown to approvers who may not see payloads, and a
#: plain hash of a low-entropy correction (an amount, a card code) is reversed by trying values.
CORRECTION_DIGEST_SALT = "django_jobguard.dlq.correction_digest"


def validated_payload(
    letter: DeadLetter, args: Any = None, kwargs: Any = None
) -> tuple[list[Any], dict[str, Any]]:
    """The payload a replay would run, checked against the task registered in this process."""
    task = registry.find(letter.task_name)
    if task is None:
        raise ReplayError(
            f"Task {letter.task_name!r} is not registered in this process, so the payload cannot be "
            "checked against its handler; deploy the task first."
        )
    try:
        # Stored values may be sealed (the letter's own, or a stored correction): opened here.
        args = open_json(letter.args if args is None else args, ARGS, "dead_letter.args")
        kwargs = open_json(letter.kwargs if kwargs is None else kwargs, KWARGS, "dead_letter.kwargs")
    except DecryptionError as exc:
        raise ReplayError(f"{exc}; configure that key again to replay it.") from None
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


def original_payload(letter: DeadLetter) -> tuple[Any, Any]:
    """The dead letter's own ``args`` and ``kwargs``, opened if they are stored encrypted
    (:class:`ReplayError` naming the key when it is not configured)."""
    try:
        return (
            open_json(letter.args, ARGS, "dead_letter.args"),
            open_json(letter.kwargs, KWARGS, "dead_letter.kwargs"),
        )
    except DecryptionError as exc:
        raise ReplayError(f"{exc}; configure that key again to replay it.") from None


def sealed_letter(letter: DeadLetter) -> bool:
    """Whether what is stored of ``letter``'s payload (its corrections, its replay's job) is
    sealed: its payload is encrypted already, or its task encrypts."""
    if is_encrypted(letter.args) or is_encrypted(letter.kwargs):
        return True
    return seals(registry.find(letter.task_name), get_settings())


def correction_digest(letter: DeadLetter) -> str:
    """A short keyed digest of the payload a replay of ``letter`` would run (its correction, if any).

    An approver's page or client reads it with the correction it shows, and hands it back
    with the approval, so an approval is bound to what was reviewed. It is an HMAC-SHA256
    keyed with ``SECRET_KEY`` (salt :data:`CORRECTION_DIGEST_SALT`) over the dead letter's id
    and that payload: it tells nothing about the payload to someone without the secret, and
    two dead letters with the same correction have different digests.
    """
    return _digest(_canonical(letter))


def digest_matches(letter: DeadLetter, reviewed: str) -> bool:
    """Whether ``reviewed`` is the :func:`correction_digest` of ``letter``'s replay payload now.

    A digest shown under a former ``SECRET_KEY`` matches while that key is in
    ``SECRET_KEY_FALLBACKS``.
    """
    canonical = _canonical(letter)
    secrets: list[str | bytes | None] = [None, *settings.SECRET_KEY_FALLBACKS]
    # As bytes: compare_digest refuses a str with non-ASCII characters, which a client may send.
    given = reviewed.encode()
    return any(hmac.compare_digest(given, _digest(canonical, secret).encode()) for secret in secrets)


def _canonical(letter: DeadLetter) -> str:
    payload = {"dead_letter": letter.pk, "args": letter.replay_args, "kwargs": letter.replay_kwargs}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def _digest(canonical: str, secret: str | bytes | None = None) -> str:
    keyed = salted_hmac(CORRECTION_DIGEST_SALT, canonical, secret=secret, algorithm="sha256")
    return keyed.hexdigest()[:CORRECTION_DIGEST_LENGTH]


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
    original_args, original_kwargs = original_payload(letter)
    if args is None and kwargs is None:
        args, kwargs = letter.replay_args, letter.replay_kwargs
    if args is None and kwargs is None:
        new_args, new_kwargs = original_args, original_kwargs
    else:
        new_args, new_kwargs = validated_payload(letter, args, kwargs)
    task = registry.find(letter.task_name)
    changes = _changes(task, original_args, original_kwargs, new_args, new_kwargs)
    key = letter.idempotency_key or ""
    key_affected = bool(key) and idempotency.replay_fingerprint(
        task, letter.task_name, original_args, original_kwargs
    ) != idempotency.replay_fingerprint(task, letter.task_name, new_args, new_kwargs)
    template = task.lock if task is not None else None
    lock_fields: tuple[str, ...] = ()
    corrected_lock = letter.lock_key
    if template and task is not None:
        names = set(template_fields(template))
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
