"""The outbox: events published in the caller's transaction, delivered in commit order per key.

``publish(destination, payload, key=..., headers=...)`` writes a message with the caller's
writes (:mod:`.publisher`); the relay inside ``jobguard_worker`` delivers it to the declared
destination, at least once, one at a time per key (:mod:`.relay`); an operator replays or
skips a dead message (:mod:`.operations`). Destinations are declared in
``JOBGUARD["OUTBOX"]["DESTINATIONS"]`` and built by :mod:`.loading` from :mod:`.destinations`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .operations import replay, skip
    from .publisher import publish

__all__ = ["publish", "replay", "skip"]


def __getattr__(name: str) -> Any:
    # Served at first use (PEP 562): the implementations read the models, which importing the
    # package (from a settings module, an AppConfig) must not load.
    if name == "publish":
        from .publisher import publish

        return publish
    if name in {"replay", "skip"}:
        from . import operations

        return getattr(operations, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
