"""Blind indexes of the keys a task stores: idempotency keys and lock keys.

A task that encrypts its payloads (``@task(encrypt=True)``, or every task with
``JOBGUARD["ENCRYPTION"]["ALL_TASKS"]``) would still show its business values in clear in the
keys it stores (``charge:order:123``, ``customer:42``): in the jobs, the key rows, the dead
letters, the lock rows and Redis. Such a task stores the
:func:`~django_jobguard.encryption.blind_index` of each key instead: equal values still give
equal keys, so a duplicate is still refused and a lock still excludes, but the value cannot be
read back without the encryption keys.

The index depends on the key that makes it. While a new key is being promoted, a value may
already be stored under an older key's index (a key row, a queued or running job's lock): a
new job then takes that older index (:func:`pick`), so a duplicate is still refused and a lock
still excludes across the rotation. The idempotency service and ``Task.lock_key_for`` look
the older indexes up; this module only computes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.db.models import Q

from django_jobguard.conf import get_settings

from . import blind_indexes

__all__ = ["INDEX_PREFIX", "blinds_keys", "pick", "search_filter", "search_values"]

#: What every blind index starts with (followed by 62 hex digits).
INDEX_PREFIX = "h:"


def blinds_keys(encrypt: bool) -> bool:
    """Whether a task declared with ``encrypt`` stores its idempotency and lock keys as blind
    indexes: it encrypts (``encrypt=True`` or ``ALL_TASKS``) and a key is configured."""
    ring = get_settings().encryption
    return ring.enabled and (encrypt or ring.all_tasks)


def pick(value: str, in_use: Callable[[Sequence[str]], str | None]) -> str:
    """The stored form of key ``value``: its index under the current key, unless ``in_use``
    (given the indexes under the older keys) returns one of them that is stored already."""
    current, *older = blind_indexes(value)
    if older:
        found = in_use(older)
        if found is not None:
            return found
    return current


def search_values(value: str) -> list[str]:
    """What a stored key equal to ``value`` may hold: the value itself (a task that stores its
    keys in clear) and its index under each configured key. For searches by business value."""
    if not get_settings().encryption.enabled or value.startswith(INDEX_PREFIX):
        return [value]
    return [value, *blind_indexes(value)]


def search_filter(field: str, value: str) -> Q:
    """A filter matching ``field`` equal to ``value`` in clear or as a blind index of it."""
    values = search_values(value)
    return Q(**{field: values[0]}) if len(values) == 1 else Q(**{f"{field}__in": values})
