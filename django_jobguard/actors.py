"""Who acts: the :class:`User` protocol the services take for the person making a change.

A leaf (it imports nothing of the package), so every service that checks a permission or
records who acted — dead letters and replays, breakers, pausing queues, a workflow's retry —
names the same type without importing another service. Django's ``User`` and
``AnonymousUser`` fit it.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["User"]


class User(Protocol):
    """What the services need of a user: Django's ``User`` and ``AnonymousUser`` fit."""

    @property
    def pk(self) -> Any: ...

    @property
    def is_authenticated(self) -> bool: ...

    def has_perm(self, perm: str, obj: Any = None) -> bool: ...

    def get_username(self) -> str: ...
