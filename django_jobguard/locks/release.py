"""Forced release of a stuck database lock: the one home of the rule, for the admin (and an API).

A lock whose holder is gone (its job finished, died or was reaped, yet the lock's TTL has
not run out) blocks every other job of its key until the TTL passes. An operator with
``jobguard.force_release_lock`` may free it early, giving a reason. The release bumps the
key's fencing counter in the same statement, so the old holder, should it still be alive,
can neither extend nor release the lock (its owner token no longer matches) and any write it
fences with its old token is refused. Each release is kept as a
:class:`~django_jobguard.models.LockRelease`.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from ..conf import get_settings
from ..exceptions import LockReleaseError, LockReleasePermissionDenied
from ..models import Job, JobStatus, Lock, LockRelease

logger = logging.getLogger("django_jobguard.locks")

__all__ = ["PERMISSION", "can_force_release", "force_release"]

#: The permission a forced release needs.
PERMISSION = "jobguard.force_release_lock"


def can_force_release(user: Any) -> bool:
    """Whether ``user`` may force-release locks."""
    return bool(user is not None and user.is_authenticated and user.has_perm(PERMISSION))


def force_release(key: str, *, user: Any, reason: str, using: str | None = None) -> int:
    """Free the held lock ``key`` (the full key, prefix included); the new fencing token.

    Refuses (writing nothing) a user without the permission, an empty reason, and a lock
    that is not held any more.
    """

    if not can_force_release(user):
        raise LockReleasePermissionDenied(f"Forcing a lock's release needs the {PERMISSION!r} permission.")
    reason = (reason or "").strip()
    if not reason:
        raise LockReleaseError(
            "A reason is required to force a lock's release: it goes into the audit trail."
        )
    alias = using or get_settings().database_alias
    prefix = get_settings().locks.prefix
    with transaction.atomic(using=alias):
        row = Lock.objects.using(alias).select_for_update().filter(key=key).first()
        if row is None or row.token is None:
            raise LockReleaseError(f"Lock {key!r} is not held: there is nothing to release.")
        holder = (
            Job.objects.using(alias)
            .filter(status=JobStatus.RUNNING, lock_key=key.removeprefix(prefix))
            .values_list("pk", flat=True)
            .first()
        )
        # The same statement clears the owner token and bumps the counter: the old holder
        # matches neither afterwards.
        Lock.objects.using(alias).filter(key=key).update(
            token=None, expires_at=None, fencing_token=F("fencing_token") + 1
        )
        token = Lock.objects.using(alias).values_list("fencing_token", flat=True).get(key=key)
        LockRelease.objects.using(alias).create(
            key=key,
            actor_id=user.pk,
            actor_name=user.get_username()[:150],
            reason=reason,
            fencing_token=token,
            holder_job_id=holder,
            created_at=Now(),
        )
    logger.warning(
        "lock_force_released key=%r by=%r fencing_token=%d holder_job=%s reason=%r",
        key,
        user.get_username(),
        token,
        holder or "-",
        reason,
    )
    return int(token)
