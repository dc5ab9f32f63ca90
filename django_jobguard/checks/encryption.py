"""Checks of payload encryption: tasks that ask for it have a key; stored values have theirs."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from ..conf import get_settings
from ..encryption.rotation import SURVEY_ROWS, survey
from ..registry import registry


@checks.register()
def check_encryption_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E080: a task asks for encryption and no key is configured; E082: ALL_TASKS does."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    if conf.encryption.enabled:
        return []
    env = "JOBGUARD['ENCRYPTION']['KEYS_ENV']"
    if conf.encryption.all_tasks:
        return [
            checks.Error(
                "JOBGUARD['ENCRYPTION']['ALL_TASKS'] is on, but no encryption key is configured: no "
                "job could be stored.",
                hint="Generate a key with manage.py jobguard_encryption_key and put it in "
                f"JOBGUARD['ENCRYPTION']['KEYS'] or the environment variable {env} names.",
                id="jobguard.E082",
            )
        ]
    return [
        checks.Error(
            "@task(encrypt=True), but no encryption key is configured: its jobs cannot be stored.",
            hint="Generate a key with manage.py jobguard_encryption_key and put it in "
            f"JOBGUARD['ENCRYPTION']['KEYS'] or the environment variable {env} names.",
            obj=task,
            id="jobguard.E080",
        )
        for name in registry.names()
        if (task := registry.find(name)) is not None and task.encrypt
    ]


@checks.register(checks.Tags.database)
def check_stored_keys(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """jobguard.E081: stored values name a key that is not configured; W080: values under a
    retired key remain.

    Reads the oldest and newest rows of each table only (bounded, see
    :func:`~django_jobguard.encryption.rotation.survey`). Tagged ``database``: Django runs it for
    ``check --database ALIAS`` and ``migrate``, so a deploy that lost a key still in use stops
    there. A worker does not refuse to start on it: it dead-letters each job it cannot decrypt,
    naming the key, payload intact, and runs the others.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    alias = conf.database_alias
    if not databases or alias not in databases:
        return []
    try:
        found = survey(alias)
    except DatabaseError:
        return []  # not migrated yet, or the server does not answer: other checks say so
    messages: list[checks.CheckMessage] = []
    configured = ", ".join(repr(key_id) for key_id, _ in conf.encryption.keys) or "none"
    for key_id, where in sorted(found.unknown.items()):
        messages.append(
            checks.Error(
                f"Stored values are encrypted under key {key_id!r}, which is not configured (keys: "
                f"{configured}): they cannot be read, and their jobs would be dead-lettered. "
                f"Found in {', '.join(where)}.",
                hint=f"Add key {key_id!r} back to JOBGUARD['ENCRYPTION']['KEYS'] (or its environment "
                "variable), after the current key; remove it only once manage.py jobguard_reencrypt "
                "has moved every value to the current key.",
                id="jobguard.E081",
            )
        )
    by_key: dict[str, list[str]] = {}
    for (field, key_id), count in sorted(found.retired.items()):
        by_key.setdefault(key_id, []).append(f"{field} {count}")
    for key_id, counts in by_key.items():
        messages.append(
            checks.Warning(
                f"Values are still encrypted under the retired key {key_id!r}: {', '.join(counts)} "
                f"(in the {SURVEY_ROWS} oldest and {SURVEY_ROWS} newest rows of each table; there may "
                "be more).",
                hint="Run manage.py jobguard_reencrypt (safe while workers run; --dry-run counts every "
                f"row) before removing the key {key_id!r}.",
                id="jobguard.W080",
            )
        )
    return messages
