"""Idempotency keys: argument fingerprints, dedupe at enqueue and at execution, pruning.

A key names a business action (``charge:order:123``), not a message. The unique
constraint on ``(scope, key)`` is the final guard: whoever inserts the row first owns the
action; everyone else gets the existing job back, or :class:`IdempotencyConflict` when
the arguments differ.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from .conf import get_settings
from .exceptions import IdempotencyConflict

if TYPE_CHECKING:
    from .models import Job
    from .task import Task

__all__ = [
    "enqueue_once",
    "fingerprint",
    "prune_expired",
    "record_failure",
    "record_success",
    "stored_result",
]


class _Missing:
    pass


MISSING: Any = _Missing()


def scope_of(task: Task[Any, Any]) -> str:
    """Where the task's keys are unique: ``idempotency_scope`` or the task name."""
    return task.idempotency_scope or task.name


def fingerprint(task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]) -> str:
    """SHA-256 of the call's arguments by parameter name, so ``f(1)`` and ``f(x=1)`` agree."""
    arguments = task.bind(args, kwargs).arguments
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=list)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _insert_key(alias: str, scope: str, key: str, digest: str) -> int | None:
    """Insert the key unless it exists; the new row's id, or None on conflict."""
    from .models import IdempotencyKey

    connection = connections[alias]
    expires_at = timezone.now() + datetime.timedelta(seconds=get_settings().idempotency.ttl)
    table = connection.ops.quote_name(IdempotencyKey._meta.db_table)
    with connection.cursor() as cursor:
        # ON CONFLICT DO NOTHING waits for a concurrent inserter to finish, then yields
        # to it: no error aborts the caller's transaction.
        cursor.execute(
            f"INSERT INTO {table} (key, scope, fingerprint, status, duplicates, expires_at) "
            "VALUES (%s, %s, %s, 'in_progress', 0, %s) ON CONFLICT (scope, key) DO NOTHING RETURNING id",
            [key, scope, digest, connection.ops.adapt_datetimefield_value(expires_at)],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def enqueue_once(task: Task[Any, Any], fields: dict[str, Any], alias: str) -> tuple[Job, bool]:
    """Create the job for a keyed call, or return the job that already owns the key."""
    from .models import IdempotencyKey, Job, JobStatus

    key = fields["idempotency_key"]
    scope = scope_of(task)
    digest = fingerprint(task, fields["args"], fields["kwargs"])
    keys = IdempotencyKey.objects.using(alias)

    key_id = _insert_key(alias, scope, key, digest)
    if key_id is None:
        existing = keys.select_related("job").get(scope=scope, key=key)
        job = existing.job
        expired = existing.expires_at <= timezone.now()
        active = job is not None and job.status in (JobStatus.QUEUED, JobStatus.RUNNING)
        if job is not None and (active or not expired):
            if existing.fingerprint != digest:
                raise IdempotencyConflict(key, scope)
            keys.filter(pk=existing.pk).update(duplicates=existing.duplicates + 1)
            return job, False
        # Expired (or its job is gone): the key may be taken over, by one caller only.
        expires_at = timezone.now() + datetime.timedelta(seconds=get_settings().idempotency.ttl)
        taken = keys.filter(pk=existing.pk, job=existing.job_id, fingerprint=existing.fingerprint).update(
            fingerprint=digest,
            status="in_progress",
            result=None,
            job=None,
            duplicates=0,
            created_at=Now(),
            updated_at=Now(),
            expires_at=expires_at,
        )
        if not taken:
            return enqueue_once(task, fields, alias)
        key_id = existing.pk

    job = Job(**fields)
    job.save(force_insert=True, using=alias)
    keys.filter(pk=key_id).update(job=job)
    return job, True


def stored_result(alias: str, scope: str, key: str) -> Any:
    """The stored result if the key's action already succeeded, else :data:`MISSING`."""
    from .models import IdempotencyKey, IdempotencyStatus

    row = (
        IdempotencyKey.objects.using(alias)
        .filter(scope=scope, key=key)
        .values_list("status", "result")
        .first()
    )
    if row is None or row[0] != IdempotencyStatus.SUCCEEDED:
        return MISSING
    return row[1]


def record_success(alias: str, scope: str, key: str, job_id: int, result: Any) -> None:
    """Mark the key succeeded with ``result``; call inside the ack's transaction."""
    from .models import IdempotencyKey

    IdempotencyKey.objects.using(alias).filter(scope=scope, key=key).filter(
        Q(job_id=job_id) | Q(job__isnull=True)
    ).update(status="succeeded", result=result, job_id=job_id, updated_at=Now())


def record_failure(alias: str, scope: str, key: str, job_id: int) -> None:
    """Mark the key failed (its job was dead-lettered); a replay may use it again."""
    from .models import IdempotencyKey

    IdempotencyKey.objects.using(alias).filter(scope=scope, key=key, job_id=job_id).update(
        status="failed", updated_at=Now()
    )


def prune_expired(alias: str | None = None, *, limit: int | None = None) -> int:
    """Delete expired keys whose job is not queued or running; the number deleted."""
    from .models import IdempotencyKey, JobStatus

    alias = alias or get_settings().database_alias
    expired = (
        IdempotencyKey.objects.using(alias)
        .expired()
        .exclude(job__status__in=(JobStatus.QUEUED, JobStatus.RUNNING))
    )
    ids = list(
        expired.values_list("pk", flat=True)[:limit] if limit else expired.values_list("pk", flat=True)
    )
    if not ids:
        return 0
    deleted, _ = IdempotencyKey.objects.using(alias).filter(pk__in=ids).delete()
    return deleted
