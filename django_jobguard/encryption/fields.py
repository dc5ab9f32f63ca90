"""Every stored field that may hold a ciphertext, listed once.

Each entry names the model, its field, how the ciphertext sits in it and the label the cipher
authenticates as associated data (see :mod:`django_jobguard.encryption`). Write paths encrypt
with these labels, reads decrypt with them, and ``jobguard_reencrypt`` and the system checks
walk this list: a field added here is re-encrypted and checked without further code.

Kinds:

* ``JSON``: the whole JSON field is ``{"$jobguard_encrypted": token}``.
* ``TEXT``: the whole text column is the token.
* ``ENTRIES``: a JSON list of objects (or one object) in which the values under ``parts``
  may each be a ciphertext, a text token or a ``{"$jobguard_encrypted": token}`` object,
  sealed under ``"<label>.<part>"``. The attempt history keeps each attempt's error and
  traceback so; a replay event's ``data`` keeps a correction's args and kwargs so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Literal

from . import JSON_MARKER, TOKEN_PREFIX, decrypt_json, decrypt_text, encrypt_json, encrypt_text, key_id_of

if TYPE_CHECKING:
    from django.db import models

__all__ = [
    "DEAD_LETTER_ARGS",
    "DEAD_LETTER_ERROR_MESSAGE",
    "DEAD_LETTER_KWARGS",
    "DEAD_LETTER_REPLAY_ARGS",
    "DEAD_LETTER_REPLAY_KWARGS",
    "DEAD_LETTER_TRACEBACK",
    "ENCRYPTED_FIELDS",
    "IDEMPOTENCY_KEY_RESULT",
    "JOB_ARGS",
    "JOB_ATTEMPT_HISTORY",
    "JOB_ATTEMPT_HISTORY_ERROR",
    "JOB_ATTEMPT_HISTORY_TRACEBACK",
    "JOB_CHECKPOINTS",
    "JOB_KWARGS",
    "JOB_LAST_ERROR",
    "JOB_PROGRESS",
    "JOB_RESULT",
    "REPLAY_EVENT_DATA",
    "REPLAY_EVENT_DATA_ARGS",
    "REPLAY_EVENT_DATA_KWARGS",
    "SCHEDULE_ARGS",
    "SCHEDULE_KWARGS",
    "EncryptedField",
    "fields_of",
]

Kind = Literal["json", "text", "entries"]
JSON: Final = "json"
TEXT: Final = "text"
ENTRIES: Final = "entries"

# The labels: the associated data each value is sealed under. Changing one makes every value
# already stored under it undecryptable, so they are fixed once released.
JOB_ARGS: Final = "job.args"
JOB_KWARGS: Final = "job.kwargs"
JOB_RESULT: Final = "job.result"
JOB_LAST_ERROR: Final = "job.last_error"
JOB_PROGRESS: Final = "job.progress"
JOB_CHECKPOINTS: Final = "job.checkpoints"
JOB_ATTEMPT_HISTORY: Final = "job.attempt_history"
JOB_ATTEMPT_HISTORY_ERROR: Final = "job.attempt_history.error"
JOB_ATTEMPT_HISTORY_TRACEBACK: Final = "job.attempt_history.traceback"
DEAD_LETTER_ARGS: Final = "dead_letter.args"
DEAD_LETTER_KWARGS: Final = "dead_letter.kwargs"
DEAD_LETTER_ERROR_MESSAGE: Final = "dead_letter.error_message"
DEAD_LETTER_TRACEBACK: Final = "dead_letter.traceback"
DEAD_LETTER_REPLAY_ARGS: Final = "dead_letter.replay_args"
DEAD_LETTER_REPLAY_KWARGS: Final = "dead_letter.replay_kwargs"
REPLAY_EVENT_DATA: Final = "replay_event.data"
REPLAY_EVENT_DATA_ARGS: Final = "replay_event.data.args"
REPLAY_EVENT_DATA_KWARGS: Final = "replay_event.data.kwargs"
IDEMPOTENCY_KEY_RESULT: Final = "idempotency_key.result"
SCHEDULE_ARGS: Final = "schedule.args"
SCHEDULE_KWARGS: Final = "schedule.kwargs"


@dataclasses.dataclass(frozen=True, slots=True)
class EncryptedField:
    """One stored field that may hold ciphertexts (see the module docstring for ``kind``)."""

    model_name: str
    field: str
    kind: Kind
    label: str
    parts: tuple[str, ...] = ()

    @property
    def model(self) -> type[models.Model]:
        from django.apps import apps

        return apps.get_model("jobguard", self.model_name)

    @property
    def name(self) -> str:
        """``table.field`` as an operator reads it in a report."""
        return f"{self.model._meta.db_table}.{self.field}"

    def part_label(self, part: str) -> str:
        return f"{self.label}.{part}"

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
            changed = dict(entry)
            for part in self.parts:
                if part not in entry:
                    continue
                value, label = entry[part], self.part_label(part)
                if isinstance(value, str) and (sealing or value.startswith(TOKEN_PREFIX)):
                    changed[part] = on_text(value, field=label)
                elif sealing or (isinstance(value, dict) and JSON_MARKER in value):
                    changed[part] = on_json(value, field=label)
            return changed

        if isinstance(stored, list):
            return [one(entry) for entry in stored]
        return one(stored)

    def _tokens(self, stored: Any) -> Iterator[tuple[str, str]]:
        """(label, key id) of each ciphertext in ``stored``."""
        if self.kind != ENTRIES:
            key_id = key_id_of(stored)
            if key_id is not None:
                yield self.label, key_id
            return
        for entry in stored if isinstance(stored, list) else [stored]:
            if not isinstance(entry, dict):
                continue
            for part in self.parts:
                key_id = key_id_of(entry.get(part))
                if key_id is not None:
                    yield self.part_label(part), key_id


#: Every field that may hold a ciphertext, by table.
ENCRYPTED_FIELDS: tuple[EncryptedField, ...] = (
    EncryptedField("Job", "args", JSON, JOB_ARGS),
    EncryptedField("Job", "kwargs", JSON, JOB_KWARGS),
    EncryptedField("Job", "result", JSON, JOB_RESULT),
    EncryptedField("Job", "last_error", TEXT, JOB_LAST_ERROR),
    EncryptedField("Job", "progress", JSON, JOB_PROGRESS),
    EncryptedField("Job", "checkpoints", JSON, JOB_CHECKPOINTS),
    EncryptedField("Job", "attempt_history", ENTRIES, JOB_ATTEMPT_HISTORY, ("error", "traceback")),
    EncryptedField("DeadLetter", "args", JSON, DEAD_LETTER_ARGS),
    EncryptedField("DeadLetter", "kwargs", JSON, DEAD_LETTER_KWARGS),
    EncryptedField("DeadLetter", "error_message", TEXT, DEAD_LETTER_ERROR_MESSAGE),
    EncryptedField("DeadLetter", "traceback", TEXT, DEAD_LETTER_TRACEBACK),
    EncryptedField("DeadLetter", "replay_args", JSON, DEAD_LETTER_REPLAY_ARGS),
    EncryptedField("DeadLetter", "replay_kwargs", JSON, DEAD_LETTER_REPLAY_KWARGS),
    EncryptedField("ReplayEvent", "data", ENTRIES, REPLAY_EVENT_DATA, ("args", "kwargs")),
    EncryptedField("IdempotencyKey", "result", JSON, IDEMPOTENCY_KEY_RESULT),
    EncryptedField("Schedule", "args", JSON, SCHEDULE_ARGS),
    EncryptedField("Schedule", "kwargs", JSON, SCHEDULE_KWARGS),
)


def fields_of(model_name: str) -> tuple[EncryptedField, ...]:
    """The encrypted fields of one model ("Job", "DeadLetter", ...), in listing order."""
    return tuple(field for field in ENCRYPTED_FIELDS if field.model_name == model_name)
