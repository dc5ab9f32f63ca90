"""Webhook signatures following the Standard Webhooks specification (https://www.standardwebhooks.com/).

A signed request carries three headers: ``webhook-id`` (the message id, stable across
redeliveries), ``webhook-timestamp`` (Unix seconds when this attempt was signed) and
``webhook-signature``, a space-separated list of ``v1,<base64 HMAC-SHA256>`` over
``"{id}.{timestamp}.{body}"``, one per secret. Secrets are ``whsec_<base64>`` strings; while a
secret is rotated the sender signs with the old and the new one, so a receiver that knows
either accepts the request.

The sender (:class:`~django_jobguard.outbox.destinations.webhook.WebhookDestination`) calls
:func:`signature_headers`; a receiver written in Django calls :func:`verify` on
``request.headers`` and ``request.body``. HMAC-SHA256 from :mod:`hmac`, compared in constant
time: nothing here is home-made cryptography.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets as _random
import time
from collections.abc import Iterable, Mapping

from django_jobguard.exceptions import JobguardError

__all__ = [
    "DEFAULT_TOLERANCE_SECONDS",
    "SignatureError",
    "decode_secret",
    "generate_secret",
    "sign",
    "signature_headers",
    "verify",
]

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's marker, not a secret
#: The specification asks for secrets of 24 to 64 random bytes; shorter ones are refused.
MIN_SECRET_BYTES = 24
#: How far a request's timestamp may be from the receiver's clock, either way (the
#: specification's five minutes): an older request is a replay, or was held up too long.
DEFAULT_TOLERANCE_SECONDS = 300
_VERSION = "v1"


class SignatureError(JobguardError):
    """A webhook request's signature headers do not verify; the message says which check failed."""


def decode_secret(secret: str) -> bytes:
    """The key bytes of a ``whsec_<base64>`` secret; ``ValueError`` saying what is wrong with it."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret must be a string 'whsec_<base64>'")
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret must be 'whsec_' followed by standard base64") from None
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(
            f"a webhook secret must hold at least {MIN_SECRET_BYTES} bytes, this one holds {len(key)} "
            "(make one with django_jobguard.outbox.signing.generate_secret())"
        )
    return key


def generate_secret(size: int = 32) -> str:
    """A new random secret, ``whsec_`` and ``size`` bytes in base64."""
    if not MIN_SECRET_BYTES <= size <= 64:
        raise ValueError(f"size must be {MIN_SECRET_BYTES} to 64 bytes, not {size!r}")
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(size)).decode("ascii")


def _keys(secrets: str | Iterable[str]) -> list[bytes]:
    keys = [decode_secret(secrets)] if isinstance(secrets, str) else [decode_secret(s) for s in secrets]
    if not keys:
        raise ValueError("at least one webhook secret is needed")
    return keys


def _mac(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(secrets: str | Iterable[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: ``v1,<signature>`` for each secret, space-separated."""
    return " ".join(f"{_VERSION},{_mac(key, msg_id, timestamp, body)}" for key in _keys(secrets))


def signature_headers(
    secrets: str | Iterable[str], msg_id: str, body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """The three headers of a signed request (``timestamp``: Unix seconds, now by default)."""
    when = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(when),
        "webhook-signature": sign(secrets, msg_id, when, body),
    }


def verify(
    secrets: str | Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> str:
    """Check a signed request; return its ``webhook-id`` (deduplicate on it) or raise :class:`SignatureError`.

    ``headers`` is any mapping (Django's ``request.headers``, a dict in any case); ``body`` the
    raw bytes as received (``request.body``), never the parsed and re-serialised JSON. The
    request passes when its timestamp is within ``tolerance`` seconds of ``now`` and one of its
    ``v1`` signatures matches one of ``secrets`` (any secret still accepted during a rotation).
    """
    keys = _keys(secrets)
    lowered = {str(name).lower(): value for name, value in headers.items()}
    msg_id = lowered.get("webhook-id", "")
    raw_timestamp = lowered.get("webhook-timestamp", "")
    raw_signature = lowered.get("webhook-signature", "")
    missing = [
        name
        for name, value in (
            ("webhook-id", msg_id),
            ("webhook-timestamp", raw_timestamp),
            ("webhook-signature", raw_signature),
        )
        if not value
    ]
    if missing:
        raise SignatureError(f"missing header {', '.join(missing)}")
    if not raw_timestamp.isascii() or not raw_timestamp.isdigit():
        raise SignatureError(f"webhook-timestamp is not Unix seconds: {raw_timestamp[:40]!r}")
    timestamp = int(raw_timestamp)
    current = time.time() if now is None else now
    if timestamp < current - tolerance:
        raise SignatureError(
            f"webhook-timestamp is {current - timestamp:.0f} s old (tolerance {tolerance:g} s)"
        )
    if timestamp > current + tolerance:
        raise SignatureError(
            f"webhook-timestamp is {timestamp - current:.0f} s in the future (tolerance {tolerance:g} s)"
        )
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError("body must be the request's raw bytes (request.body)")
    expected = [_mac(key, msg_id, timestamp, bytes(body)).encode() for key in keys]
    offered = [
        part[len(_VERSION) + 1 :].encode()
        for part in raw_signature.split(" ")
        if part.startswith(f"{_VERSION},")
    ]
    # Every pair is compared, in constant time each, so the time taken says nothing about
    # which secret or which signature came close.
    matched = False
    for candidate in offered:
        for mac in expected:
            matched |= hmac.compare_digest(candidate, mac)
    if not matched:
        raise SignatureError("no v1 signature matches the secrets (wrong secret, or body or headers altered)")
    return msg_id
