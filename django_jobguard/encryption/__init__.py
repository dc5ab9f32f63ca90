"""Payloads encrypted at rest: AES-256-GCM from ``cryptography``, with key rotation.

A value is stored as a token ``jg1:<key id>:<base64(nonce + ciphertext + tag)>``: the key id
says which key of ``JOBGUARD["ENCRYPTION"]["KEYS"]`` opens it, so that old rows stay readable
after a new key takes over, and a missing key is named, never guessed. The field a value is
stored in is the cipher's associated data: a ciphertext copied into another field (arguments
into a result, say) fails authentication instead of decrypting there.

JSON fields hold ``{"$jobguard_encrypted": token}``; text fields hold the token itself.
Nothing here is home-made cryptography: AES-GCM authenticates the ciphertext, the nonce is 12
random bytes per value (2**32 values per key stay far inside GCM's random-nonce bound), and
the blind index (:func:`blind_index`) is HMAC-SHA256 under a key derived by HKDF.
"""

from __future__ import annotations

import binascii
import functools
import hashlib
import hmac
import json
import os
from typing import Any

from django_jobguard.conf import EncryptionSettings, get_settings
from django_jobguard.exceptions import JobguardError

__all__ = [
    "JSON_MARKER",
    "TOKEN_PREFIX",
    "DecryptionError",
    "blind_index",
    "blind_indexes",
    "decrypt_json",
    "decrypt_text",
    "encrypt_json",
    "encrypt_json_text",
    "encrypt_text",
    "is_encrypted",
    "key_id_of",
    "keyring",
]

TOKEN_PREFIX = "jg1:"  # noqa: S105 - a format marker, not a secret
#: The one key of a JSON field's object when the field holds a ciphertext.
JSON_MARKER = "$jobguard_encrypted"
_NONCE_BYTES = 12
# Nonces are drawn from the OS in blocks, not one os.urandom() per value: os.urandom releases
# the GIL, and each release handed it to a waiting thread (a worker's claim loop went round
# once per sealed job, about 40 us of CPU, for a 0.3 us call). Every nonce is still 12 random
# bytes from the OS, used once: list.pop() is atomic under the GIL, and a forked child starts
# with none (a nonce the parent holds must never be drawn again by its copy).
_NONCE_BLOCK = 256
_nonces: list[bytes] = []
os.register_at_fork(after_in_child=_nonces.clear)


def _nonce() -> bytes:
    try:
        return _nonces.pop()
    except IndexError:
        block = os.urandom(_NONCE_BYTES * _NONCE_BLOCK)
        _nonces.extend([block[i : i + _NONCE_BYTES] for i in range(0, len(block), _NONCE_BYTES)])
        return _nonces.pop()


# One encoder: json.dumps() with any option builds a new JSONEncoder per call (2-3 us).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_DECODE = json.JSONDecoder().decode
# json.dumps({JSON_MARKER: token}) up to the token: a token is "jg1:", a key id of letters,
# digits, "_", "." or "-", ":" and standard base64, none of which JSON escapes.
_JSON_HEAD = '{"' + JSON_MARKER + '": "'


class DecryptionError(JobguardError):
    """A stored value could not be decrypted: its key is not configured, or it was altered.

    ``key_id`` names the key the value says it was encrypted with; ``reason`` is "missing key"
    or "tampered". Never raised for a value that decrypts: GCM's tag rules out garbage.
    """

    def __init__(self, key_id: str, reason: str, field: str) -> None:
        self.key_id = key_id
        self.reason = reason
        self.field = field
        detail = (
            f"key {key_id!r} is not in JOBGUARD['ENCRYPTION']['KEYS']"
            if reason == "missing key"
            else "its authentication tag does not match "
            "(the stored ciphertext was altered or copied from another field)"
        )
        super().__init__(f"cannot decrypt {field}: {detail}")


# The open ciphers of the current settings' keys, rebuilt when the settings change (a test's
# override, a reload): looked up by the settings object's identity, not by hashing the keys.
# With them, the current key's token head ("jg1:<key id>:") and cipher, so that a seal reads
# one cached tuple (building an AESGCM object costs more than sealing 1 KiB with it).
_ciphers_for: tuple[EncryptionSettings | None, dict[str, Any], str, Any] = (None, {}, "", None)


def _cached(ring: EncryptionSettings) -> tuple[EncryptionSettings | None, dict[str, Any], str, Any]:
    global _ciphers_for
    cached = _ciphers_for
    if cached[0] is not ring:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        ciphers = {key_id: AESGCM(raw) for key_id, raw in ring.keys}
        current = ring.keys[0][0] if ring.keys else ""
        cached = _ciphers_for = (ring, ciphers, f"{TOKEN_PREFIX}{current}:", ciphers.get(current))
    return cached


# The associated data of each label, encoded once.
_LABELS: dict[str, bytes] = {}


def _label(field: str) -> bytes:
    encoded = _LABELS.get(field)
    if encoded is None:
        encoded = _LABELS[field] = field.encode()
    return encoded


def keyring() -> EncryptionSettings:
    """The configured keys (``.enabled`` is False when there are none)."""
    return get_settings().encryption


def _encrypt(plain: bytes, field: str) -> str:
    _, _, head, cipher = _cached(keyring())
    if cipher is None:
        raise DecryptionError("", "missing key", field)  # pragma: no cover - callers check enabled
    nonce = _nonce()
    sealed = cipher.encrypt(nonce, plain, _label(field))
    # Standard base64: a JSON string holds it as is, and binascii's codec is the fastest.
    return head + binascii.b2a_base64(nonce + sealed, newline=False).decode("ascii")


def _decrypt(token: str, field: str) -> bytes:
    key_id, _, body = token[len(TOKEN_PREFIX) :].partition(":")
    cipher = _cached(keyring())[1].get(key_id)
    if cipher is None:
        raise DecryptionError(key_id, "missing key", field)
    try:
        raw = binascii.a2b_base64(body, strict_mode=True)
        return bytes(cipher.decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], _label(field)))
    except (_invalid_tag(), binascii.Error, ValueError):
        raise DecryptionError(key_id, "tampered", field) from None


@functools.cache
def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


def is_encrypted(stored: Any) -> bool:
    """Whether ``stored`` (a JSON field's or a text field's value) is a ciphertext."""
    if isinstance(stored, str):
        return stored.startswith(TOKEN_PREFIX)
    return isinstance(stored, dict) and len(stored) == 1 and isinstance(stored.get(JSON_MARKER), str)


def key_id_of(stored: Any) -> str | None:
    """The key id a stored ciphertext names, or None for a value stored in clear."""
    if not is_encrypted(stored):
        return None
    token = stored if isinstance(stored, str) else stored[JSON_MARKER]
    return str(token[len(TOKEN_PREFIX) :].partition(":")[0])


def encrypt_json(value: Any, *, field: str) -> dict[str, str]:
    """``value`` (JSON-serialisable) sealed for JSON field ``field`` (e.g. "job.args")."""
    plain = _ENCODE(value).encode()
    return {JSON_MARKER: _encrypt(plain, field)}


def encrypt_json_text(value: Any, *, field: str, encoded: str | None = None) -> str:
    """The JSON text of ``encrypt_json(value)``, as ``json.dumps`` writes it, built without
    encoding the token a second time (it holds no character JSON escapes). ``encoded``: the
    value's JSON text when the caller has it already (a result measured against its limit)."""
    plain = (_ENCODE(value) if encoded is None else encoded).encode()
    return _JSON_HEAD + _encrypt(plain, field) + '"}'


def decrypt_json(stored: Any, *, field: str) -> Any:
    """The value of JSON field ``field``: decrypted when it is a ciphertext, else as stored."""
    if isinstance(stored, dict) and len(stored) == 1:
        token = stored.get(JSON_MARKER)
        if isinstance(token, str):  # is_encrypted(), inlined: the worker opens every sealed job's
            return _DECODE(_decrypt(token, field).decode())
    return stored


def encrypt_text(value: str, *, field: str) -> str:
    """``value`` sealed for text field ``field`` (e.g. "dead_letter.traceback"); "" stays ""."""
    return _encrypt(value.encode(), field) if value else value


def decrypt_text(stored: str, *, field: str) -> str:
    """The text of field ``field``: decrypted when it is a ciphertext, else as stored."""
    if not stored or not stored.startswith(TOKEN_PREFIX):
        return stored
    return _decrypt(stored, field).decode()


@functools.lru_cache(maxsize=8)
def _index_keys(keys: tuple[tuple[str, bytes], ...]) -> tuple[bytes, ...]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return tuple(
        HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"jobguard blind index").derive(raw)
        for _, raw in keys
    )


def blind_index(value: str) -> str:
    """A keyed HMAC of ``value`` under the current key: equal values give equal indexes, and
    the clear value cannot be read back (for idempotency and lock keys that must stay comparable)."""
    return blind_indexes(value)[0]


def blind_indexes(value: str) -> list[str]:
    """:func:`blind_index` of ``value`` under every configured key, the current one first
    (a lookup during a rotation matches rows indexed under an older key)."""
    return [
        "h:" + hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:62]
        for key in _index_keys(keyring().keys)
    ]
