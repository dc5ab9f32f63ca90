"""Every stored field that may hold a ciphertext, listed once.

Each entry names the model, its field, how the ciphertext sits in it and the label the cipher
authenticates as associated data (see :mod:`django_jobguard.encryption`). The label is the kind
of value (arguments, result, error text, ...), not the table: a job's arguments are copied
verbatim into its dead letter and on into a replay's job, and stay openable there, while a
value moved into another kind of field (arguments into a result) fails authentication. The
write paths seal with the same labels (:mod:`django_jobguard.encryption.payloads`);
``jobguard_reencrypt`` and the system checks walk this list, so a field added here is
re-encrypted and checked without further code.

Kinds:

* ``JSON``: the whole JSON field is ``{"$jobguard_encrypted": token}``.
* ``TEXT``: the whole text column is the token.
* ``ENTRIES``: a JSON list of objects (or one object) in which the values under ``parts``
  may each be a ciphertext, a text token or a ``{"$jobguard_encrypted": token}`` object,
  each sealed under its part's label (a part may be a dotted path into a nested object).
  The attempt history keeps each attempt's error and traceback so, a job's progress its
  message, a replay event's ``data`` a correction's args and kwargs.
* ``ENTRIES_BY_KEY``: a JSON object whose values are such entries: a workflow's callbacks,
  by when they run, each with its prepared job's args and kwargs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Literal

from . import JSON_MARKER, TOKEN_PREFIX, decrypt_json, decrypt_text, encrypt_json, encrypt_text, key_id_of

if TYPE_CHECKING:
    from django.db import models

__all__ = [
    "ARGS",
    "CHECKPOINTS",
    "ENCRYPTED_FIELDS",
    "ERROR",
    "KWARGS",
    "PROGRESS",
    "RESULT",
    "TRACEBACK",
    "EncryptedField",
    "fields_of",
]

Kind = Literal["json", "text", "entries", "entries_by_key"]
JSON: Final = "json"
TEXT: Final = "text"
ENTRIES: Final = "entries"
ENTRIES_BY_KEY: Final = "entries_by_key"

# The labels: the associated data each kind of value is sealed under. Changing one makes every
# value already stored under it undecryptable, so they are fixed once released.
ARGS: Final = "args"
KWARGS: Final = "kwargs"
RESULT: Final = "result"
ERROR: Final = "error"
TRACEBACK: Final = "traceback"
PROGRESS: Final = "progress"
CHECKPOINTS: Final = "checkpoints"


@dataclasses.dataclass(frozen=True, slots=True)
class EncryptedField:
    """One stored field that may hold ciphertexts (see the module docstring for ``kind``)."""

    model_name: str
    field: str
    kind: Kind
    label: str = ""
    #: ENTRIES, ENTRIES_BY_KEY: (key in each entry, a dotted path for a nested one, its label).
    parts: tuple[tuple[str, str], ...] = ()

    @property
    def model(self) -> type[models.Model]:
        from django.apps import apps

        return apps.get_model("jobguard", self.model_name)

    @property
    def name(self) -> str:
        """``table.field`` as an operator reads it in a report."""
        return f"{self.model._meta.db_table}.{self.field}"

    def key_ids(self, stored: Any) -> list[str]:
        """The key ids of every ciphertext in ``stored`` (a value of this field), in order."""
        return [key_id for _, key_id in self._tokens(stored)]

    def decrypt(self, stored: Any) -> Any:
        """``stored`` with every ciphertext in it opened (raises DecryptionError)."""
        return self._map(stored, decrypt_json, decrypt_text)

    def encrypt(self, value: Any) -> Any:
        """``value`` sealed as this field stores it (an ENTRIES field: each part of each entry)."""
        if self.kind == JSON:
            return encrypt_json(value, field=self.label)
        if self.kind == TEXT:
            return encrypt_text(value, field=self.label)
        return self._map(value, lambda plain, field: encrypt_json(plain, field=field), encrypt_text, True)

    def reencrypt(self, stored: Any, keep: Callable[[str], bool]) -> Any:
        """``stored`` with each ciphertext whose key id ``keep`` rejects sealed again under the
        current key; the rest, clear values and ciphertexts ``keep`` accepts, left as they were."""

        def again_json(value: Any, field: str) -> Any:
            key_id = key_id_of(value)
            if key_id is None or keep(key_id):
                return value
            return encrypt_json(decrypt_json(value, field=field), field=field)

        def again_text(value: str, field: str) -> str:
            key_id = key_id_of(value)
            if key_id is None or keep(key_id):
                return value
            return encrypt_text(decrypt_text(value, field=field), field=field)

        return self._map(stored, again_json, again_text)

    def _map(
        self,
        stored: Any,
        on_json: Callable[..., Any],
        on_text: Callable[..., Any],
        sealing: bool = False,
    ) -> Any:
        if self.kind == JSON:
            return on_json(stored, field=self.label)
        if self.kind == TEXT:
            return on_text(stored, field=self.label) if isinstance(stored, str) else stored

        def one(entry: Any) -> Any:
            if not isinstance(entry, dict):
                return entry
            changed = entry
            for part, label in self.parts:
                value = _get(entry, part)
                if value is _ABSENT:
                    continue
                if isinstance(value, str) and (sealing or value.startswith(TOKEN_PREFIX)):
                    changed = _put(changed, part, on_text(value, field=label))
                elif sealing or (isinstance(value, dict) and JSON_MARKER in value):
                    changed = _put(changed, part, on_json(value, field=label))
            return changed

        return _each(self.kind, stored, one)

    def _tokens(self, stored: Any) -> Iterator[tuple[str, str]]:
        """(label, key id) of each ciphertext in ``stored``."""
        if self.kind in (JSON, TEXT):
            key_id = key_id_of(stored)
            if key_id is not None:
                yield self.label, key_id
            return
        found: list[tuple[str, str]] = []

        def one(entry: Any) -> Any:
            if isinstance(entry, dict):
                for part, label in self.parts:
                    key_id = key_id_of(_get(entry, part))
                    if key_id is not None:
                        found.append((label, key_id))
            return entry

        _each(self.kind, stored, one)
        yield from found


_ABSENT: Any = object()


def _get(entry: dict[str, Any], path: str) -> Any:
    """The value at dotted ``path`` in ``entry`` ("fields.args"), or _ABSENT."""
    value: Any = entry
    for step in path.split("."):
        if not isinstance(value, dict) or step not in value:
            return _ABSENT
        value = value[step]
    return value


def _put(entry: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``entry`` with ``value`` at dotted ``path`` (the dicts on the way copied)."""
    head, _, rest = path.partition(".")
    return {**entry, head: _put(entry[head], rest, value) if rest else value}


def _each(kind: str, stored: Any, one: Callable[[Any], Any]) -> Any:
    """``one`` applied to each entry of an ENTRIES (a list, or one object) or ENTRIES_BY_KEY value."""
    if isinstance(stored, list):
        return [one(entry) for entry in stored]
    if kind == ENTRIES_BY_KEY and isinstance(stored, dict):
        return {key: one(entry) for key, entry in stored.items()}
    return one(stored)


_HISTORY = (("error", ERROR), ("traceback", TRACEBACK))
_CORRECTION = (("args", ARGS), ("kwargs", KWARGS))

#: Every field that may hold a ciphertext, by table.
ENCRYPTED_FIELDS: tuple[EncryptedField, ...] = (
    EncryptedField("Job", "args", JSON, ARGS),
    EncryptedField("Job", "kwargs", JSON, KWARGS),
    EncryptedField("Job", "result", JSON, RESULT),
    EncryptedField("Job", "last_error", TEXT, ERROR),
    EncryptedField("Job", "progress", ENTRIES, parts=(("message", PROGRESS),)),
    EncryptedField("Job", "checkpoints", JSON, CHECKPOINTS),
    EncryptedField("Job", "attempt_history", ENTRIES, parts=_HISTORY),
    EncryptedField("DeadLetter", "args", JSON, ARGS),
    EncryptedField("DeadLetter", "kwargs", JSON, KWARGS),
    EncryptedField("DeadLetter", "error_message", TEXT, ERROR),
    EncryptedField("DeadLetter", "traceback", TEXT, TRACEBACK),
    EncryptedField("DeadLetter", "replay_args", JSON, ARGS),
    EncryptedField("DeadLetter", "replay_kwargs", JSON, KWARGS),
    EncryptedField("ReplayEvent", "data", ENTRIES, parts=_CORRECTION),
    EncryptedField("IdempotencyKey", "result", JSON, RESULT),
    EncryptedField("Schedule", "args", JSON, ARGS),
    EncryptedField("Schedule", "kwargs", JSON, KWARGS),
    # A workflow keeps each callback's prepared job, by when it runs, until it is enqueued.
    EncryptedField(
        "Workflow", "callbacks", ENTRIES_BY_KEY, parts=(("fields.args", ARGS), ("fields.kwargs", KWARGS))
    ),
)


def fields_of(model_name: str) -> tuple[EncryptedField, ...]:
    """The encrypted fields of one model ("Job", "DeadLetter", ...), in listing order."""
    return tuple(field for field in ENCRYPTED_FIELDS if field.model_name == model_name)
