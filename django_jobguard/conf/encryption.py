"""``ENCRYPTION``: the keys that encrypt payloads at rest, and which tasks use them.

Keys are "key_id:base64" strings of 32 random bytes, newest first: the first encrypts, all
decrypt. They come from ``KEYS``, else from the environment variable ``KEYS_ENV`` names (the
same strings, comma-separated), so that a settings file need not hold them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

from ._values import boolean, fail, string

__all__ = ["KEY_BYTES", "EncryptionSettings", "parse_encryption_settings", "parse_key"]

#: AES-256: every key is 32 bytes.
KEY_BYTES = 32
# Stored inside every ciphertext's prefix and in dead letters: short, printable, no ':' or ','.
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")


@dataclasses.dataclass(frozen=True, slots=True)
class EncryptionSettings:
    """``JOBGUARD["ENCRYPTION"]``, parsed: ``keys`` newest first as (key id, 32 bytes)."""

    keys: tuple[tuple[str, bytes], ...] = ()
    all_tasks: bool = False
    #: Where the keys were read: "JOBGUARD['ENCRYPTION']['KEYS']" or the environment variable.
    source: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    @property
    def current_key_id(self) -> str | None:
        return self.keys[0][0] if self.keys else None


def parse_key(text: str, where: str) -> tuple[str, bytes]:
    """One "key_id:base64" string; the error names ``where`` it came from, never the key itself."""
    key_id, sep, encoded = text.strip().partition(":")
    if not sep or not _KEY_ID.fullmatch(key_id):
        raise ValueError(
            f"{where} holds an entry that is not 'key_id:base64' with a key id of 1-32 letters, digits, "
            "'_', '.' or '-' (generate one with `manage.py jobguard_encryption_key`)."
        )
    try:
        raw = base64.urlsafe_b64decode(
            encoded.replace("+", "-").replace("/", "_") + "=" * (-len(encoded) % 4)
        )
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: key {key_id!r} is not valid base64.") from None
    if len(raw) != KEY_BYTES:
        raise ValueError(f"{where}: key {key_id!r} is {len(raw)} bytes once decoded; it must be {KEY_BYTES}.")
    return key_id, raw


def parse_encryption_settings(group: Mapping[str, Any]) -> EncryptionSettings:
    path = ("ENCRYPTION",)
    env_name = string(group["KEYS_ENV"], (*path, "KEYS_ENV"))
    given = group["KEYS"]
    if isinstance(given, str) or not isinstance(given, list | tuple):
        raise fail((*path, "KEYS"), "must be a list of 'key_id:base64' strings, newest first.")
    if given:
        entries, source = list(given), "JOBGUARD['ENCRYPTION']['KEYS']"
    else:
        raw_env = os.environ.get(env_name, "")
        entries = [part for part in raw_env.split(",") if part.strip()]
        source = f"the environment variable {env_name}" if entries else ""
    keys: list[tuple[str, bytes]] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise fail((*path, "KEYS"), "must be a list of 'key_id:base64' strings, newest first.")
        try:
            keys.append(parse_key(entry, source))
        except ValueError as exc:
            raise fail((*path, "KEYS"), f"is wrong: {exc}") from None
    ids = [key_id for key_id, _ in keys]
    duplicated = sorted({key_id for key_id in ids if ids.count(key_id) > 1})
    if duplicated:
        raise fail(
            (*path, "KEYS"), f"names key id {duplicated[0]!r} twice ({source}); each key needs its own id."
        )
    return EncryptionSettings(
        keys=tuple(keys),
        all_tasks=boolean(group["ALL_TASKS"], (*path, "ALL_TASKS")),
        source=source,
    )
