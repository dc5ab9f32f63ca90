"""Building a declared destination: its backend class (by name or dotted path), then ``from_options``.

The system check (:mod:`django_jobguard.checks.outbox`) builds each one at startup, so a
misdeclared destination is reported then; the relay builds its own instances (one per
delivery thread, so a backend's client need not be thread-safe).
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from ..conf import DestinationConfig
from .destinations.base import BACKENDS, Destination

__all__ = ["backend_class", "build"]


def backend_class(config: DestinationConfig) -> Any:
    """The class ``config.backend`` names; ``ValueError`` naming the destination if it cannot be imported."""
    path = BACKENDS.get(config.backend, config.backend)
    where = f"JOBGUARD['OUTBOX']['DESTINATIONS'][{config.name!r}]['BACKEND']"
    if "." not in path:
        raise ValueError(
            f"{where} is {config.backend!r}: not one of {', '.join(sorted(BACKENDS))} "
            "nor a dotted path to a class"
        )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ValueError(f"{where}: {path!r} cannot be imported ({exc})") from None
    if not callable(getattr(cls, "from_options", None)):
        raise ValueError(f"{where}: {path!r} has no from_options(name, options) class method")
    return cls


def build(config: DestinationConfig) -> Destination:
    """A destination of ``config``: ``ValueError`` naming the option when it is misdeclared."""
    destination: Destination = backend_class(config).from_options(config.name, config.options)
    return destination
