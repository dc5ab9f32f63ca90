"""What the outbox's backlog looks like now, per destination and per held key, for the operators' pages.

The metrics (``jobguard_outbox_*`` gauges), the admin's health page and ``jobguard_status``
read these, so they cannot disagree. A fixed number of queries whatever the number of
messages, keys or destinations (:data:`QUERIES` for :func:`destination_stats`,
:data:`HELD_QUERIES` for :func:`held_keys`), each served by an index:

- pending messages per destination, their count and the first written (``MIN(id)``): the
  partial index of pending messages ``jobguard_outbox_pending`` (destination, key, id), which
  holds the backlog only, however many delivered messages are kept;
- the first pending messages' ages: by primary key, one row per destination;
- dead messages per destination, and which of them hold their key: the dead messages (a
  filter on ``state``; a partial index on dead messages keeps it to them), each matched to
  its key's relay row through the unique (destination, key) index ``jobguard_outbox_cursor_uniq``;
- for :func:`held_keys`: at most ``limit`` holding messages, then the pending messages behind
  them through ``jobguard_outbox_pending``.

"Oldest undelivered" is the larger of the first pending message's age and the oldest
holding message's: a key held since this morning shows its age even with nothing behind it.
Ages are measured on the database clock from ``published_at`` (the publishing transaction's time).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from django.db.models import Count, DurationField, Exists, ExpressionWrapper, F, Min, OuterRef, Q
from django.db.models.functions import Now

from ..conf import get_settings

__all__ = [
    "DEFAULT_WARN_AFTER_SECONDS",
    "HELD_KEYS_LISTED",
    "HELD_QUERIES",
    "QUERIES",
    "DestinationStats",
    "HeldKey",
    "destination_stats",
    "held_keys",
    "holds_its_key",
    "warn_after",
]

#: Queries :func:`destination_stats` runs (the pending counts, their first messages' ages, the dead).
QUERIES = 3
#: Queries :func:`held_keys` runs (the holding messages, the pending messages behind them).
HELD_QUERIES = 2
#: Held keys listed at most by default (the oldest hold first): enough to act on, bounded to read.
HELD_KEYS_LISTED = 20
#: Seconds the oldest undelivered message of a destination may wait before the health page and
#: ``jobguard_status`` flag it (the ``JobguardOutboxLagging`` alert uses the same 300 s).
DEFAULT_WARN_AFTER_SECONDS = 300.0


def warn_after() -> float:
    """Seconds past which a destination's oldest undelivered message is flagged.

    :data:`DEFAULT_WARN_AFTER_SECONDS`, or the outbox settings' ``warn_after`` once they declare one.
    """
    return float(getattr(get_settings().outbox, "warn_after", DEFAULT_WARN_AFTER_SECONDS))


@dataclasses.dataclass(slots=True)
class DestinationStats:
    """One destination's backlog at one moment."""

    destination: str
    #: Messages waiting for delivery (due now, waiting out a retry, or behind a held message).
    pending: int = 0
    #: Seconds the oldest undelivered message has waited since it was published: the first
    #: pending one, or one that holds its key, whichever is older (0 with none).
    oldest_age_seconds: float = 0.0
    #: Keys a dead message holds ("hold" destinations): nothing behind it is sent.
    held_keys: int = 0
    #: Dead messages no operator replayed or skipped yet (holding or passed over).
    dead: int = 0
    #: Whether ``OUTBOX["DESTINATIONS"]`` declares it (messages of a removed one wait for nobody).
    declared: bool = True
    #: Its ``ON_FAILURE`` ("hold" or "skip"; "" when not declared).
    on_failure: str = ""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``--json`` output of ``jobguard_status``)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class HeldKey:
    """A key that a dead message holds, with that message and what waits behind it."""

    destination: str
    key: str
    #: The holding message: its primary key (the admin's page), id (the consumer's) and place.
    message_pk: int
    message_id: str
    seq: int
    attempts: int
    #: Its last delivery error (the destination's answer).
    last_error: str
    published_at: datetime.datetime
    #: Seconds since it was published (database clock).
    age_seconds: float
    #: Pending messages of the key behind it.
    waiting: int

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "published_at": self.published_at.isoformat()}


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, datetime.timedelta):
        return max(0.0, value.total_seconds())
    # SQLite returns the difference as microseconds when the converter is bypassed.
    return max(0.0, float(value) / 1_000_000)


def _age() -> ExpressionWrapper:
    return ExpressionWrapper(Now() - F("published_at"), output_field=DurationField())


def holds_its_key() -> Exists:
    """True for a message that holds its key: its key's relay row is held at its place (a filter)."""
    from ..models import OutboxCursor

    return Exists(
        OutboxCursor.objects.filter(
            destination=OuterRef("destination"), key=OuterRef("key"), held_seq=OuterRef("seq")
        )
    )


def destination_stats(alias: str | None = None) -> list[DestinationStats]:
    """Every declared destination's backlog (zeros included), and any other with messages, by name."""
    from ..models import OutboxMessage, OutboxState

    conf = get_settings()
    alias = alias or conf.outbox_alias
    declared = conf.outbox.destinations
    rows: dict[str, DestinationStats] = {
        name: DestinationStats(name, on_failure=config.on_failure) for name, config in declared.items()
    }

    def row(name: str) -> DestinationStats:
        if name not in rows:
            rows[name] = DestinationStats(name, declared=False)
        return rows[name]

    messages = OutboxMessage.objects.using(alias).order_by()
    firsts: list[int] = []
    pending = (
        messages.filter(state=OutboxState.PENDING)
        .values("destination")
        .annotate(n=Count("pk"), first=Min("pk"))
    )
    for item in pending:
        row(item["destination"]).pending = item["n"]
        firsts.append(item["first"])
    if firsts:
        for name, age in (
            messages.filter(pk__in=firsts).annotate(age=_age()).values_list("destination", "age")
        ):
            row(name).oldest_age_seconds = _seconds(age)
    dead = (
        messages.filter(state=OutboxState.DEAD, resolution="")
        .annotate(holds=holds_its_key())
        .values("destination")
        .annotate(
            n=Count("pk"),
            held=Count("pk", filter=Q(holds=True)),
            oldest_held=ExpressionWrapper(
                Now() - Min("published_at", filter=Q(holds=True)), output_field=DurationField()
            ),
        )
    )
    for group in dead:
        stats = row(group["destination"])
        stats.dead, stats.held_keys = group["n"], group["held"]
        if group["held"]:
            stats.oldest_age_seconds = max(stats.oldest_age_seconds, _seconds(group["oldest_held"]))
    return [rows[name] for name in sorted(rows)]


def held_keys(
    alias: str | None = None, *, destination: str | None = None, limit: int = HELD_KEYS_LISTED
) -> list[HeldKey]:
    """Keys a dead message holds, the oldest hold first: at most ``limit``, of ``destination`` or all."""
    from ..models import OutboxMessage, OutboxState

    alias = alias or get_settings().outbox_alias
    holding = (
        OutboxMessage.objects.using(alias)
        .filter(state=OutboxState.DEAD, resolution="")
        .filter(holds_its_key())
        .annotate(age=_age())
        .order_by("pk")
    )
    if destination is not None:
        holding = holding.filter(destination=destination)
    found = list(
        holding.values_list(
            "destination", "key", "pk", "message_id", "seq", "attempts", "last_error", "published_at", "age"
        )[:limit]
    )
    if not found:
        return []
    behind = Q()
    for name, key, _pk, _id, seq, *_rest in found:
        behind |= Q(destination=name, key=key, seq__gt=seq)
    waiting = {
        (item["destination"], item["key"]): item["n"]
        for item in OutboxMessage.objects.using(alias)
        .order_by()
        .filter(state=OutboxState.PENDING)
        .filter(behind)
        .values("destination", "key")
        .annotate(n=Count("pk"))
    }
    return [
        HeldKey(
            destination=name,
            key=key,
            message_pk=pk,
            message_id=str(message_id),
            seq=seq,
            attempts=attempts,
            last_error=error,
            published_at=published_at,
            age_seconds=_seconds(age),
            waiting=waiting.get((name, key), 0),
        )
        for name, key, pk, message_id, seq, attempts, error, published_at, age in found
    ]
