"""``publish()``: an outbox message written in the caller's transaction, refused before any write if bad.

The message is a row on the outbox's alias (``JOBGUARD["OUTBOX"]["DATABASE_ALIAS"]``, else
``JOBGUARD["DATABASE_ALIAS"]``): written inside the caller's
``transaction.atomic()`` it exists only if that transaction commits, exactly as an enqueued
job does. Its key's next sequence number is taken in the same transaction
(:func:`django_jobguard.store.outbox.next_seq`), under the key's row lock: publishers of one
key commit one after the other, and the relay delivers the key's messages in that order.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import store
from .._json import normalize_json
from ..conf import OutboxSettings, get_settings
from ..exceptions import InvalidArgumentsError, InvalidPublishError, UnknownDestinationError
from ..store import outbox as outbox_rows

if TYPE_CHECKING:
    from ..models import OutboxMessage
    from .destinations.base import Destination

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_NAME_LENGTH",
    "MAX_HEADER_VALUE_LENGTH",
    "MAX_KEY_LENGTH",
    "RESERVED_HEADERS",
    "outbox_alias",
    "publish",
    "validate",
]

#: Characters a key may have (the width of the outbox tables' key columns).
MAX_KEY_LENGTH = 200
#: Headers one message may carry.
MAX_HEADERS = 32
#: Characters of a header's name (an HTTP token: letters, digits and ``!#$%&'*+-.^_`|~``).
MAX_HEADER_NAME_LENGTH = 128
#: Characters of a header's value (printable ASCII).
MAX_HEADER_VALUE_LENGTH = 1024

# RFC 9110's token, so that every backend (HTTP headers included) can carry the name as given.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")
#: Header names every destination writes itself, after the publisher's (any case of their letters).
RESERVED_HEADERS = frozenset({"jobguard-key", "jobguard-seq", "jobguard-attempt", "jobguard-destination"})


def outbox_alias() -> str:
    """The database alias outbox messages are written on (where a declared model must be written)."""
    return get_settings().outbox_alias


def _check_destination(destination: Any) -> str:
    if not isinstance(destination, str):
        raise UnknownDestinationError(f"destination must be a string, not {type(destination).__name__}.")
    declared = get_settings().outbox.destinations
    if destination not in declared:
        known = ", ".join(sorted(declared)) or "none"
        raise UnknownDestinationError(
            f"destination {destination!r} is not declared in JOBGUARD['OUTBOX']['DESTINATIONS']; "
            f"declared: {known}."
        )
    return destination


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidPublishError(f"key must be a non-empty string (or None: no order), not {key!r}.")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidPublishError(
            f"key is {len(key)} characters long; it may have at most {MAX_KEY_LENGTH}: {key[:40]!r}..."
        )
    if "\x00" in key or not key.isprintable():
        raise InvalidPublishError(f"key {key!r} holds a control character; use printable text.")
    return key


def _check_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidPublishError(f"headers must be a dict of strings, not {type(headers).__name__}.")
    if len(headers) > MAX_HEADERS:
        raise InvalidPublishError(f"{len(headers)} headers given; a message may carry at most {MAX_HEADERS}.")
    clean: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, value in headers.items():
        if (
            not isinstance(name, str)
            or not _HEADER_NAME.fullmatch(name)
            or len(name) > MAX_HEADER_NAME_LENGTH
        ):
            raise InvalidPublishError(
                f"header name {name!r} is not an HTTP token of 1 to {MAX_HEADER_NAME_LENGTH} characters "
                "(letters, digits and !#$%&'*+-.^_`|~)."
            )
        if not isinstance(value, str):
            raise InvalidPublishError(f"header {name!r} must be a string, not {type(value).__name__}.")
        if len(value) > MAX_HEADER_VALUE_LENGTH or not _HEADER_VALUE.fullmatch(value):
            raise InvalidPublishError(
                f"header {name!r} must be printable ASCII of at most {MAX_HEADER_VALUE_LENGTH} characters "
                f"({len(value)} given)."
            )
        folded = name.lower()
        if folded in RESERVED_HEADERS:
            raise InvalidPublishError(
                f"header {name!r} is written by jobguard on every message; name yours otherwise."
            )
        if folded in seen:
            raise InvalidPublishError(
                f"headers {seen[folded]!r} and {name!r} differ only in case: HTTP and NATS treat them as one."
            )
        seen[folded] = name
        clean[name] = value
    return clean


# The declared destinations, built once per settings (no connection is made), that tell what
# they would refuse of a message's key and headers whatever its payload (a NATS subject the
# key makes invalid, an AMQP routing key over 255 bytes, a header the destination writes).
_built: tuple[OutboxSettings | None, dict[str, Destination | None]] = (None, {})


def _built_destination(name: str) -> Destination | None:
    global _built  # one cache, replaced whole when the settings change
    from .loading import build

    conf = get_settings().outbox
    settings, cache = _built
    if settings is not conf:
        cache = {}
        _built = (conf, cache)
    if name not in cache:
        try:
            cache[name] = build(conf.destinations[name])
        except (ValueError, TypeError, ImportError):
            # Misdeclared (jobguard.E060 reports it at startup) or its client library is not
            # installed here: nothing more to check in this process.
            cache[name] = None
    return cache[name]


def _check_for_destination(destination: str, key: str, headers: dict[str, str]) -> None:
    built = _built_destination(destination)
    check = getattr(built, "message_problem", None)
    if check is None:
        return
    problem = check(key, headers)
    if problem:
        raise InvalidPublishError(f"destination {destination!r} would refuse this message: {problem}.")


def _check_payload(payload: Any) -> Any:
    try:
        clean = normalize_json(payload, "payload")
    except InvalidArgumentsError as exc:
        raise InvalidPublishError(str(exc)) from None
    limit = get_settings().max_payload_bytes
    size = len(json.dumps(clean, ensure_ascii=False, separators=(",", ":")).encode())
    if size > limit:
        raise InvalidPublishError(
            f"payload takes {size:,} bytes as JSON, more than the limit of {limit:,} bytes "
            "(JOBGUARD['MAX_PAYLOAD_BYTES']). Publish a reference (an id, a URL) to large data instead."
        )
    return clean


def validate(
    destination: Any, payload: Any, key: Any = None, headers: Any = None
) -> tuple[str, Any, str | None, dict[str, str]]:
    """The arguments of :func:`publish`, checked: raises :class:`InvalidPublishError` naming the part."""
    return (
        _check_destination(destination),
        _check_payload(payload),
        None if key is None else _check_key(key),
        _check_headers(headers),
    )


def publish(
    destination: str,
    payload: Any,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> OutboxMessage:
    """Write a message for ``destination`` in the current transaction; the relay delivers it after the commit.

    Messages of one ``key`` are delivered in commit order, one at a time; ``key=None`` gives
    the message a key of its own (no order with any other). ``payload`` must be plain JSON
    of at most ``JOBGUARD["MAX_PAYLOAD_BYTES"]``; ``headers`` at most :data:`MAX_HEADERS`
    ASCII strings, none named as jobguard's own (:data:`RESERVED_HEADERS`). Anything else, and
    what the destination would refuse whatever the payload (its backend's
    ``message_problem(key, headers)``: a key that makes an invalid NATS subject, ...), raises
    :class:`~django_jobguard.exceptions.InvalidPublishError`
    (:class:`~django_jobguard.exceptions.UnknownDestinationError` for an undeclared
    destination) before anything is written.

    A publisher holds its key's row lock until its transaction ends, so a second publisher of
    the same key waits for the first to commit: keep transactions that publish short.
    """
    from ..models import OutboxMessage  # app registry: importable before it is ready

    destination, payload, key, headers = validate(destination, payload, key, headers)
    alias = get_settings().outbox_alias
    store.needs_database(alias, "Outbox messages")
    message_id = uuid.uuid4()
    key = key if key is not None else str(message_id)
    _check_for_destination(destination, key, headers)
    with store.atomic(alias, savepoint=False):
        seq = outbox_rows.next_seq(alias, destination, key)
        return OutboxMessage.objects.using(alias).create(
            message_id=message_id,
            destination=destination,
            key=key,
            seq=seq,
            payload=payload,
            headers=headers,
        )
