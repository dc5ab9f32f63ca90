"""Forced release of a stuck lock, on either back end: the one home of the rule, for the admin (and an API).

A lock whose holder is gone (its job finished, died or was reaped, yet the lock's TTL has
not run out) blocks every other job of its key until the TTL passes. An operator with
``jobguard.force_release_lock`` may free it early, giving a reason. The release bumps the
key's fencing counter in the same step (one statement on the database, one script on
Redis), so the old holder, should it still be alive, can neither extend nor release the lock
(its owner token no longer matches) and any write it fences with its old token is refused.
Given the owner token the operator saw, the release refuses a lock that changed hands since.
Each release is kept as a :class:`~django_jobguard.models.LockRelease` naming the holding job
read from that token (see :mod:`.holders`).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from ..conf import get_settings
from ..exceptions import LockReleaseError, LockReleasePermissionDenied, LockUnavailable
from ..models import Lock, LockRelease
from . import redis as redis_locks
from .holders import parse_owner

logger = logging.getLogger("django_jobguard.locks")

__all__ = ["PERMISSION", "can_force_release", "force_release"]

#: The permission a forced release needs.
PERMISSION = "jobguard.force_release_lock"


def can_force_release(user: Any) -> bool:
    """Whether ``user`` may force-release locks."""
    return bool(user is not None and user.is_authenticated and user.has_perm(PERMISSION))


def force_release(key: str, *, user: Any, reason: str, token: str = "", using: str | None = None) -> int:
    """Free the held lock ``key`` (the full key, prefix included); the new fencing token.

    Runs on the configured back end (``JOBGUARD["LOCKS"]["BACKEND"]``). Refuses (writing
    nothing) a user without the permission, an empty reason, a lock that is not held any
    more, and, given ``token``, a lock another owner token holds now.
    """

    if not can_force_release(user):
        raise LockReleasePermissionDenied(f"Forcing a lock's release needs the {PERMISSION!r} permission.")
    reason = (reason or "").strip()
    if not reason:
        raise LockReleaseError(
            "A reason is required to force a lock's release: it goes into the audit trail."
        )
    alias = using or get_settings().database_alias
    if get_settings().locks.backend == "redis":
        fencing, held_by = _release_redis(key, token)
        with transaction.atomic(using=alias):
            _audit(alias, key, user, reason, fencing, held_by)
    else:
        with transaction.atomic(using=alias):
            fencing, held_by = _release_row(alias, key, token)
            _audit(alias, key, user, reason, fencing, held_by)
    holder = parse_owner(held_by)
    logger.warning(
        "lock_force_released key=%r by=%r fencing_token=%d holder_job=%s reason=%r",
        key,
        user.get_username(),
        fencing,
        holder[0] if holder else "-",
        reason,
    )
    return fencing


def _changed_hands(key: str) -> LockReleaseError:
    return LockReleaseError(
        f"Lock {key!r} changed hands since you looked: another owner holds it now. "
        "Look at its new holder before releasing it."
    )


def _release_row(alias: str, key: str, token: str) -> tuple[int, str]:
    row = Lock.objects.using(alias).select_for_update().filter(key=key).first()
    if row is None or row.token is None:
        raise LockReleaseError(f"Lock {key!r} is not held: there is nothing to release.")
    if token and row.token != token:
        raise _changed_hands(key)
    # The same statement clears the owner token and bumps the counter: the old holder
    # matches neither afterwards.
    Lock.objects.using(alias).filter(key=key).update(
        token=None, expires_at=None, fencing_token=F("fencing_token") + 1
    )
    fencing = Lock.objects.using(alias).values_list("fencing_token", flat=True).get(key=key)
    return int(fencing), row.token


def _release_redis(key: str, token: str) -> tuple[int, str]:
    conf = get_settings().locks
    if not key.startswith(conf.prefix) or len(key) == len(conf.prefix):
        raise LockReleaseError(f"Lock {key!r} is not held: there is nothing to release.")
    try:
        status, fencing, held_by = redis_locks.force_release(
            conf.cache_alias, conf.prefix, key[len(conf.prefix) :], token
        )
    except LockUnavailable as exc:
        raise LockReleaseError(f"Lock {key!r} was not released: {exc}") from exc
    if status == 0:
        raise LockReleaseError(f"Lock {key!r} is not held: there is nothing to release.")
    if status == 2:
        raise _changed_hands(key)
    return int(fencing), held_by


def _audit(alias: str, key: str, user: Any, reason: str, fencing: int, held_by: str) -> None:
    holder = parse_owner(held_by)
    LockRelease.objects.using(alias).create(
        key=key,
        actor_id=user.pk,
        actor_name=user.get_username()[:150],
        reason=reason,
        fencing_token=fencing,
        holder_job_id=holder[0] if holder else None,
        created_at=Now(),
    )
