"""What the relay hands a destination, and what a destination answers.

A destination backend is a class with ``from_options(name, options)`` (which raises
``ValueError`` naming the bad option: the system check reports it at startup),
``send(envelope)`` (returns once the destination has the message; raises
:class:`TransientDeliveryError` or :class:`PermanentDeliveryError` otherwise) and ``close()``;
optionally ``message_problem(key, headers)``, which ``publish()`` calls so that a message the
destination would refuse whatever its payload (a key that cannot make its subject, a header
it writes itself) is refused before it is written, not dead at delivery.
Backends are named in ``JOBGUARD["OUTBOX"]["DESTINATIONS"][name]["BACKEND"]``: one of
:data:`BACKENDS`' keys, or a dotted path to a class.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

__all__ = [
    "BACKENDS",
    "Destination",
    "Envelope",
    "PermanentDeliveryError",
    "TransientDeliveryError",
]

#: The built-in backends, by the name settings use, and the module that holds each.
BACKENDS: dict[str, str] = {
    "webhook": "django_jobguard.outbox.destinations.webhook.WebhookDestination",
    "rabbitmq": "django_jobguard.outbox.destinations.rabbitmq.RabbitMQDestination",
    "nats": "django_jobguard.outbox.destinations.nats.NatsDestination",
    "redis": "django_jobguard.outbox.destinations.redis_streams.RedisStreamDestination",
    # Jobs in JOBGUARD["DATABASE_ALIAS"], for a jobs database of their own (enqueue_via_outbox()).
    "jobs": "django_jobguard.outbox.destinations.jobs.JobsDestination",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Envelope:
    """One outbox message as a destination sends it.

    ``id`` is stable across redeliveries (a consumer deduplicates on it); ``seq`` is the
    message's place in its key's commit order (1, 2, 3, ... per destination and key).
    """

    id: str
    destination: str
    key: str
    seq: int
    payload: Any
    headers: Mapping[str, str]
    published_at: datetime.datetime
    attempt: int


class TransientDeliveryError(Exception):
    """The destination may take the message later (timeout, 5xx, broker down): retry with backoff."""


class PermanentDeliveryError(Exception):
    """The destination refused the message and will refuse it again (4xx, invalid): no retry."""


class Destination(Protocol):
    #: The backend's name in settings ("webhook", ...).
    backend: ClassVar[str]
    name: str

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> Destination: ...

    def send(self, envelope: Envelope) -> None: ...

    def close(self) -> None: ...

    # Optional: def message_problem(self, key: str, headers: Mapping[str, str]) -> str | None
    # (why a message of this key and these headers would be refused; None: it would not).
