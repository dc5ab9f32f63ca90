"""Every write to an idempotency key's row after its insert, in one place.

The insert itself and the ack's "succeeded" are per database (:func:`~django_jobguard.store.insert_key`,
:func:`~django_jobguard.store.insert_keyed_job`, :func:`~django_jobguard.store.record_key_success`):
they are on the hot path. The rest are rare (a duplicate, a take-over, a cancel, a replay) and
the same statement on every database, so they are ORM updates (an alias the in-memory store
serves has them applied there). The decisions stay with their
callers (:mod:`django_jobguard.idempotency`, :mod:`django_jobguard.operations.jobs`,
:mod:`django_jobguard.workflows`); this module only says how a decision is written.

Pruning (deleting expired rows) lives with the other retention rules, in
:mod:`django_jobguard.maintenance.retention`.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection
from typing import Any

from django.db.models import F
from django.db.models.functions import Now

from ..models import IdempotencyKey, IdempotencyStatus
from . import memory_store

__all__ = [
    "adopt",
    "count_duplicate",
    "hand_to_replay",
    "mark_failed",
    "release_for_jobs",
    "renew_for_jobs",
    "restart",
    "take_over",
]


def _rows(alias: str) -> Any:
    return IdempotencyKey.objects.using(alias)


def adopt(alias: str, key_id: int, job_id: int, *, touched: bool = False) -> None:
    """Make ``job_id`` the key's job: a new key's first job, or a live key whose job was deleted."""
    changes: dict[str, Any] = {"job_id": job_id}
    if touched:
        changes["updated_at"] = Now()
    memory = memory_store(alias)
    if memory is not None:
        memory.update_key(key_id, job_id=job_id, **({"updated_at": "now"} if touched else {}))
        return
    _rows(alias).filter(pk=key_id).update(**changes)


def count_duplicate(alias: str, *, key_id: int | None = None, scope: str = "", key: str = "") -> None:
    """Count one duplicate of the key (by row id, or by scope and key)."""
    memory = memory_store(alias)
    if memory is not None:
        if key_id is not None:
            memory.update_key(key_id, duplicates="+1")
        else:
            memory.update_keys(scope=scope, key=key, duplicates="+1")
        return
    rows = _rows(alias).filter(pk=key_id) if key_id is not None else _rows(alias).filter(scope=scope, key=key)
    rows.update(duplicates=F("duplicates") + 1)


def restart(alias: str, key_id: int, *, job_id: int, fingerprint: str, expires_at: datetime.datetime) -> None:
    """An expired key whose job finished starts afresh for a new job: forgotten, then in progress."""
    memory = memory_store(alias)
    if memory is not None:
        memory.update_key(
            key_id,
            fingerprint=fingerprint,
            status=IdempotencyStatus.IN_PROGRESS,
            result=None,
            job_id=job_id,
            duplicates=0,
            created_at="now",
            updated_at="now",
            expires_at=expires_at,
        )
        return
    _rows(alias).filter(pk=key_id).update(
        fingerprint=fingerprint,
        status=IdempotencyStatus.IN_PROGRESS,
        result=None,
        job_id=job_id,
        duplicates=0,
        created_at=Now(),
        updated_at=Now(),
        expires_at=expires_at,
    )


def take_over(
    alias: str, key_id: int, *, job_id: int, fingerprint: str, expires_at: datetime.datetime | None
) -> None:
    """``job_id`` takes over a key whose action failed or whose job is gone; ``expires_at`` None
    keeps a live key's age and count, a date restarts an expired one."""
    changes: dict[str, Any] = {
        "job_id": job_id,
        "fingerprint": fingerprint,
        "status": IdempotencyStatus.IN_PROGRESS,
        "result": None,
        "updated_at": Now(),
    }
    if expires_at is not None:
        changes.update(duplicates=0, created_at=Now(), expires_at=expires_at)
    memory = memory_store(alias)
    if memory is not None:
        memory.update_key(
            key_id, **{name: "now" if isinstance(value, Now) else value for name, value in changes.items()}
        )
        return
    _rows(alias).filter(pk=key_id).update(**changes)


def hand_to_replay(
    alias: str, key_id: int, *, job_id: int, fingerprint: str, expires_at: datetime.datetime
) -> None:
    """A replay's job owns the key, in progress, under the fingerprint of the call it runs."""
    _rows(alias).filter(pk=key_id).update(
        job_id=job_id,
        fingerprint=fingerprint,
        status=IdempotencyStatus.IN_PROGRESS,
        result=None,
        updated_at=Now(),
        expires_at=expires_at,
    )


def mark_failed(alias: str, key: str, job_id: int) -> None:
    """The key's action failed: its job was dead-lettered (the owner identifies the row)."""
    memory = memory_store(alias)
    if memory is not None:
        memory.update_keys(key=key, job_ids=[job_id], status=IdempotencyStatus.FAILED, updated_at="now")
        return
    _rows(alias).filter(key=key, job_id=job_id).update(status=IdempotencyStatus.FAILED, updated_at=Now())


def release_for_jobs(alias: str, job_ids: Collection[int]) -> None:
    """Cancelled jobs give their keys up at once: failed and expired, free for a new enqueue."""
    memory = memory_store(alias)
    if memory is not None:
        if job_ids:
            memory.update_keys(
                job_ids=job_ids, status=IdempotencyStatus.FAILED, expires_at="now", updated_at="now"
            )
        return
    _rows(alias).filter(job_id__in=job_ids).update(
        status=IdempotencyStatus.FAILED, expires_at=Now(), updated_at=Now()
    )


def renew_for_jobs(alias: str, job_ids: Collection[int], *, expires_at: datetime.datetime) -> None:
    """Re-queued jobs hold their keys again: in progress, live until ``expires_at``."""
    memory = memory_store(alias)
    if memory is not None:
        if job_ids:
            memory.update_keys(
                job_ids=job_ids, status=IdempotencyStatus.IN_PROGRESS, expires_at=expires_at, updated_at="now"
            )
        return
    _rows(alias).filter(job_id__in=job_ids).update(
        status=IdempotencyStatus.IN_PROGRESS, expires_at=expires_at, updated_at=Now()
    )
