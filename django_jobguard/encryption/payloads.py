"""Which stored values of a job are encrypted, and how each is sealed and opened.

A task declared with ``@task(encrypt=True)`` (or every task, with ``ALL_TASKS``) has its jobs'
data stored encrypted; whether a stored value *is* encrypted is read from the value itself
(its marker, see :func:`~django_jobguard.encryption.is_encrypted`), never from the task, so a
task whose ``encrypt`` was switched off still reads its old rows.

The associated data of each value is what it is (:data:`ARGS`, :data:`RESULT`, ...), not the
table it sits in: a job's arguments are copied verbatim into its dead letter, and a dead
letter's into its replay's job, so they stay openable there even when their key is missing
(a dead letter for a missing key keeps its payload intact, ready for the key's return). A
value copied into another kind of field (arguments into a result) still fails authentication.
:data:`~django_jobguard.encryption.fields.ENCRYPTED_FIELDS` lists every field that may hold one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from django.core.exceptions import ImproperlyConfigured

from . import (
    DecryptionError,
    decrypt_json,
    decrypt_text,
    encrypt_json,
    encrypt_json_text,
    encrypt_text,
    is_encrypted,
)
from .fields import ARGS, CHECKPOINTS, ERROR, KWARGS, PROGRESS, RESULT, TRACEBACK

if TYPE_CHECKING:
    from django_jobguard.conf import Settings

__all__ = [
    "ARGS",
    "CHECKPOINTS",
    "ERROR",
    "KWARGS",
    "PROGRESS",
    "RESULT",
    "TRACEBACK",
    "open_history",
    "open_json",
    "open_progress",
    "open_text",
    "readable_history",
    "readable_json",
    "readable_progress",
    "readable_text",
    "seal_history_entry",
    "seal_json",
    "seal_json_text",
    "seal_text",
    "seals",
    "unreadable",
]


class _Declared(Protocol):
    """What :func:`seals` reads of a task (a Task; named so, this module stays below the tasks)."""

    @property
    def name(self) -> str: ...
    @property
    def encrypt(self) -> bool: ...


def seals(task: _Declared | None, conf: Settings) -> bool:
    """Whether ``task``'s jobs are stored encrypted; refuses loudly when they should be but
    no key is configured (storing them in clear would break the task's promise)."""
    if task is None or not (task.encrypt or conf.encryption.all_tasks):
        return False
    if not conf.encryption.enabled:
        asked = "@task(encrypt=True)" if task.encrypt else "JOBGUARD['ENCRYPTION']['ALL_TASKS']"
        raise ImproperlyConfigured(
            f"{task.name} stores its data encrypted ({asked}), but no key is configured: "
            "JOBGUARD['ENCRYPTION']['KEYS'] is empty and so is the environment variable "
            "JOBGUARD['ENCRYPTION']['KEYS_ENV'] names; add a key (`manage.py jobguard_encryption_key`)."
        )
    return True


def seal_json(value: Any, field: str) -> Any:
    """``value`` sealed for a JSON column holding ``field`` (a value sealed already stays so)."""
    return value if is_encrypted(value) else encrypt_json(value, field=field)


def seal_json_text(value: Any, field: str, encoded: str | None = None) -> str:
    """The JSON text a JSON column stores for ``value`` sealed: ``json.dumps(seal_json(value))``
    without encoding the ciphertext again. ``encoded``: the value's JSON text, if made already."""
    if is_encrypted(value):
        return json.dumps(value)
    return encrypt_json_text(value, field=field, encoded=encoded)


def seal_text(value: str, field: str) -> str:
    """``value`` sealed for a text column holding ``field``; "" stays "" (nothing to hide)."""
    return value if is_encrypted(value) else encrypt_text(value, field=field)


def open_json(stored: Any, field: str, where: str) -> Any:
    """The clear value of a JSON column; :class:`DecryptionError` names ``where`` ("job.args")."""
    try:
        return decrypt_json(stored, field=field)
    except DecryptionError as exc:
        raise DecryptionError(exc.key_id, exc.reason, where) from None


def open_text(stored: str, field: str, where: str) -> str:
    """The clear text of a text column; :class:`DecryptionError` names ``where``."""
    try:
        return decrypt_text(stored, field=field)
    except DecryptionError as exc:
        raise DecryptionError(exc.key_id, exc.reason, where) from None


def seal_history_entry(error: str, traceback: str) -> tuple[str, str]:
    """An attempt's error text and traceback as its history entry stores them, sealed."""
    return seal_text(error, ERROR), seal_text(traceback, TRACEBACK)


def open_progress(stored: Any, where: str = "job.progress") -> Any:
    """A job's progress with its message opened (only the message is sealed: the numbers and
    the time say how far a job got, not what it carries)."""
    if isinstance(stored, dict) and is_encrypted(stored.get("message")):
        return {**stored, "message": open_text(stored["message"], PROGRESS, f"{where}.message")}
    return stored


def open_history(entries: Any, where: str = "job.attempt_history") -> Any:
    """The attempt history with each entry's error and traceback opened (a copy; others as stored)."""
    if not isinstance(entries, list) or not any(
        isinstance(entry, dict) and (is_encrypted(entry.get("error")) or is_encrypted(entry.get("traceback")))
        for entry in entries
    ):
        return entries
    opened = []
    for entry in entries:
        if isinstance(entry, dict):
            entry = dict(entry)
            for key, field in (("error", ERROR), ("traceback", TRACEBACK)):
                if isinstance(entry.get(key), str):
                    entry[key] = open_text(entry[key], field, f"{where}.{key}")
        opened.append(entry)
    return opened


# -- for display (the console and the API, to users allowed to see payloads) ---------------


def unreadable(exc: DecryptionError) -> str:
    """What a surface shows in place of a value it cannot open: why, never the ciphertext."""
    if exc.reason == "missing key":
        return f"(encrypted under key {exc.key_id!r}, which is not configured here)"
    return f"(encrypted under key {exc.key_id!r}, and altered: it does not authenticate)"


def readable_json(stored: Any, field: str, where: str) -> Any:
    """A JSON column's value to show: opened, or a note saying why it cannot be."""
    try:
        return open_json(stored, field, where)
    except DecryptionError as exc:
        return unreadable(exc)


def readable_text(stored: str, field: str, where: str) -> str:
    """A text column's value to show: opened, or a note saying why it cannot be."""
    try:
        return open_text(stored, field, where)
    except DecryptionError as exc:
        return unreadable(exc)


def readable_history(entries: Any) -> Any:
    """The attempt history to show, its errors and tracebacks opened where they can be."""
    if not isinstance(entries, list):
        return entries
    shown = []
    for entry in entries:
        if isinstance(entry, dict) and (
            is_encrypted(entry.get("error")) or is_encrypted(entry.get("traceback"))
        ):
            entry = dict(entry)
            for key, field in (("error", ERROR), ("traceback", TRACEBACK)):
                if isinstance(entry.get(key), str):
                    entry[key] = readable_text(entry[key], field, f"job.attempt_history.{key}")
        shown.append(entry)
    return shown


def readable_progress(stored: Any) -> Any:
    """A job's progress to show, its message opened where it can be."""
    try:
        return open_progress(stored)
    except DecryptionError as exc:
        return {**stored, "message": unreadable(exc)}
