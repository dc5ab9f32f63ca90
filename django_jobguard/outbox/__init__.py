"""The outbox: events published in the caller's transaction, delivered in commit order per key.

``publish(destination, payload, key=..., headers=...)`` writes a message with the caller's
writes (:mod:`.publisher`), or a model declares the events its saves and deletes publish
(``publishes()``, :mod:`.declarations`); the relay inside ``jobguard_worker`` delivers it to
the declared destination, at least once, one at a time per key (:mod:`.relay`); an operator
replays or skips a dead message (:mod:`.operations`). Destinations are declared in
``JOBGUARD["OUTBOX"]["DESTINATIONS"]`` and built by :mod:`.loading` from :mod:`.destinations`.
``enqueue_via_outbox(task, ...)`` enqueues through the outbox, for jobs kept in a database of
their own (:mod:`.bridge`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bridge import enqueue_via_outbox
    from .declarations import publishes
    from .operations import replay, skip
    from .publisher import publish

__all__ = ["enqueue_via_outbox", "publish", "publishes", "replay", "skip"]


def __getattr__(name: str) -> Any:
    # Served at first use (PEP 562): the implementations read the models, which importing the
    # package (from a settings module, an AppConfig) must not load.
    if name == "publish":
        from .publisher import publish

        return publish
    if name == "publishes":
        # Connects model signals only: callable from a models.py while the registry loads.
        from .declarations import publishes

        return publishes
    if name == "enqueue_via_outbox":
        from .bridge import enqueue_via_outbox

        return enqueue_via_outbox
    if name in {"replay", "skip"}:
        from . import operations

        return getattr(operations, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
