"""What every backend sends: the payload as JSON bytes and the message's jobguard headers.

The headers are the same on every destination, so one consumer's deduplication and order
checks read alike whatever carried the message: the message id (each backend's own field:
``webhook-id``, AMQP ``message_id``, ``Nats-Msg-Id``) and ``jobguard-key``, ``jobguard-seq``,
``jobguard-attempt``, ``jobguard-destination`` beside the publisher's own headers.
"""

from __future__ import annotations

import json
import re
import urllib.parse

from django_jobguard.outbox.destinations.base import Envelope, PermanentDeliveryError

__all__ = [
    "ATTEMPT_HEADER",
    "DESTINATION_HEADER",
    "KEY_HEADER",
    "SEQ_HEADER",
    "body",
    "header_problem",
    "metadata",
    "text_headers",
]

KEY_HEADER = "jobguard-key"
SEQ_HEADER = "jobguard-seq"
ATTEMPT_HEADER = "jobguard-attempt"
DESTINATION_HEADER = "jobguard-destination"

# RFC 9110's token: what an HTTP (and NATS) header name may be made of.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# Printable ASCII and tab: a header value every HTTP and NATS stack passes on unaltered.
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")
# Left as they are by the percent-encoding of keys: what keys are usually made of.
_KEY_SAFE = "!#$&'()*+,/:;=?@[]~"


def body(envelope: Envelope) -> bytes:
    """The payload as compact UTF-8 JSON (``publish()`` refused anything that is not JSON)."""
    try:
        return json.dumps(envelope.payload, separators=(",", ":"), ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        raise PermanentDeliveryError(f"the payload of message {envelope.id} is not JSON: {exc}") from None


def metadata(envelope: Envelope) -> dict[str, str]:
    """The publisher's headers, then ``jobguard-key``, ``-seq``, ``-attempt`` and ``-destination``.

    The jobguard headers come last, so a publisher's header of the same name cannot hide them.
    """
    return {
        **envelope.headers,
        KEY_HEADER: envelope.key,
        SEQ_HEADER: str(envelope.seq),
        ATTEMPT_HEADER: str(envelope.attempt),
        DESTINATION_HEADER: envelope.destination,
    }


def header_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` cannot be sent as an HTTP or NATS header, or None."""
    if not _HEADER_NAME.match(name):
        return f"header name {name!r} is not an HTTP token"
    if not _HEADER_VALUE.match(value):
        return f"header {name!r} has a value that is not printable ASCII"
    return None


def text_headers(envelope: Envelope) -> dict[str, str]:
    """:func:`metadata` for text protocols (HTTP, NATS): the key and destination percent-encoded.

    Keys are free text and these headers ASCII; ``urllib.parse.unquote`` gives the key back,
    and the usual keys ("order:42", "tenant/7") are sent as they are. A publisher's header that
    cannot be sent is a :class:`PermanentDeliveryError` naming it.
    """
    headers = metadata(envelope)
    headers[KEY_HEADER] = urllib.parse.quote(envelope.key, safe=_KEY_SAFE)
    headers[DESTINATION_HEADER] = urllib.parse.quote(envelope.destination, safe=_KEY_SAFE)
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem:
            raise PermanentDeliveryError(f"message {envelope.id}: {problem}")
    return headers
