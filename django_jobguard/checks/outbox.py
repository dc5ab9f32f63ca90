"""Checks of the outbox: every declared destination is built at startup, not at its first message."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings
from ..outbox.loading import build


@checks.register()
def check_outbox_destinations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E060: a destination of ``OUTBOX["DESTINATIONS"]`` cannot be built from its options."""
    try:
        destinations = get_settings().outbox.destinations
    except ImproperlyConfigured:
        return []  # reported by the settings check
    errors: list[checks.CheckMessage] = []
    for name, config in sorted(destinations.items()):
        try:
            destination = build(config)
        except (ValueError, TypeError, ImportError) as exc:
            errors.append(
                checks.Error(
                    f"Outbox destination {name!r} cannot be built: {exc}",
                    hint="Fix the option the message names in JOBGUARD['OUTBOX']['DESTINATIONS'] "
                    "(see docs/how-to/publish-events.md and the backend's options).",
                    obj=f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}]",
                    id="jobguard.E060",
                )
            )
            continue
        destination.close()
    return errors
