"""What the relay and the operator's verbs report about outbox messages, as typed values.

They are emitted with :func:`django_jobguard.events.emit`, like the jobs' events, and the
Prometheus sink (:mod:`django_jobguard.monitoring.metrics`) counts them per destination.
A destination is a name declared in ``JOBGUARD["OUTBOX"]["DESTINATIONS"]``, so the label
stays bounded; a message's key or id never travels in an event.
"""

from __future__ import annotations

import dataclasses

__all__ = ["OutboxDead", "OutboxDelivered", "OutboxFailed", "OutboxResolved", "OutboxThrottled"]


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxDelivered:
    """A message reached its destination, ``lag`` seconds after it was published (commit to delivery)."""

    destination: str
    lag: float


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxFailed:
    """A send failed (``category``: transient or permanent); ``retried`` if the message waits for another."""

    destination: str
    category: str
    retried: bool


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxThrottled:
    """A send the destination's limit did not admit now (``reason``: breaker, budget or rate):
    its key was given back unsent, with no attempt counted."""

    destination: str
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxDead:
    """A message ran out of attempts or was refused for good; ``held`` if it holds its key ("hold")."""

    destination: str
    held: bool


@dataclasses.dataclass(frozen=True, slots=True)
class OutboxResolved:
    """An operator settled a dead message (``action``: replayed or skipped)."""

    destination: str
    action: str
