"""Tasks for the lock tests: locked handlers that record when they ran and with which token."""

from __future__ import annotations

import datetime
import os
import time

from django.db.models import F
from django.utils import timezone

from django_jobguard import task
from django_jobguard.conf import get_settings
from django_jobguard.models import Lock

from .models import Execution, FencedCounter, Interval, LedgerEntry


def fenced_write(resource: str, fencing_token: int) -> bool:
    """The downstream write of the docs: refused if a newer lock holder already wrote."""
    FencedCounter.objects.get_or_create(resource=resource)
    updated = FencedCounter.objects.filter(resource=resource, last_fencing_token__lte=fencing_token).update(
        value=F("value") + 1, last_fencing_token=fencing_token
    )
    if not updated:
        FencedCounter.objects.filter(resource=resource).update(rejected_writes=F("rejected_writes") + 1)
    return bool(updated)


def record_interval(context, resource: str, started: float) -> None:
    Interval.objects.create(
        resource=resource,
        started=started,
        ended=time.time(),
        pid=os.getpid(),
        fencing_token=context.fencing_token,
    )


@task(lock="res:{resource}", takes_context=True)
def interval(context, resource: str, hold: float = 0.005) -> int:
    """The overlap detector's job: hold the resource a moment, record (resource, start, end)."""
    started = time.time()
    time.sleep(hold)
    record_interval(context, resource, started)
    fenced_write(resource, context.fencing_token)
    return context.fencing_token


@task(lock="res:{resource}", lock_ttl=3, visibility_timeout=2, takes_context=True)
def hold_then_record(context, resource: str, marker: str, seconds: float) -> int:
    """Holds its lock ``seconds`` on the first attempt (long enough to be killed), then records."""
    started = time.time()
    Execution.objects.create(
        marker=marker,
        job_id=context.job_id,
        attempt=context.attempt,
        pid=os.getpid(),
        worker=str(context.fencing_token),
    )
    if context.attempt == 1:
        time.sleep(seconds)
    record_interval(context, resource, started)
    return context.fencing_token


@task(lock="res:{resource}", lock_ttl=2, takes_context=True)
def wait_for_lock_loss(context, resource: str, marker: str, seconds: float = 120) -> int:
    """First attempt: waits (up to ``seconds``) until the worker reports the lock lost."""
    Execution.objects.create(
        marker=marker,
        job_id=context.job_id,
        attempt=context.attempt,
        pid=os.getpid(),
        worker=str(context.fencing_token),
    )
    if context.attempt == 1:
        deadline = time.monotonic() + seconds
        while not context.lock_lost and time.monotonic() < deadline:
            time.sleep(0.05)
        LedgerEntry.objects.create(
            effect_key=f"{marker}:lock_lost={context.lock_lost}", job_id=context.job_id
        )
    return context.attempt


def _steal(resource: str) -> None:
    """Make the running job's lock expire and another owner take it, as a frozen worker would see."""
    conf = get_settings().locks
    name = f"{conf.prefix}res:{resource}"
    if conf.backend == "redis":
        from django_redis import get_redis_connection

        from django_jobguard.locks.redis import redis_key

        get_redis_connection(conf.cache_alias).set(
            redis_key(conf.prefix, f"res:{resource}"), "thief", px=60_000
        )
    else:
        Lock.objects.filter(key=name).update(
            token="thief",  # noqa: S106 - an owner token, not a password
            expires_at=timezone.now() + datetime.timedelta(seconds=60),
        )


@task(lock="res:{resource}", takes_context=True)
def loses_lock(context, resource: str, marker: str) -> int:
    """Not atomic: records a run; on the first attempt its lock is taken over before the ack."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if context.attempt == 1:
        _steal(resource)
    return context.attempt


@task(lock="res:{resource}", atomic=True, takes_context=True)
def loses_lock_atomic(context, resource: str, marker: str) -> int:
    """Atomic: like loses_lock, so the refused ack must roll its writes back."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    LedgerEntry.objects.create(effect_key=f"{marker}:{context.attempt}", job_id=context.job_id)
    if context.attempt == 1:
        _steal(resource)
    return context.attempt


@task(lock="res:{resource}", lock_ttl=300, visibility_timeout=300, takes_context=True)
def hold_long(context, resource: str, marker: str, seconds: float) -> None:
    """Holds its lock ``seconds`` (an incident's holder: killed while it holds a long-TTL lock)."""
    Execution.objects.create(
        marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid(), worker=""
    )
    time.sleep(seconds)
