"""Tasks for the retry and dead-letter tests (tests/*/test_dlq*.py, test_retries.py)."""

from __future__ import annotations

import os
import time

from django_jobguard import PermanentError, TransientError, task
from django_jobguard.models import Job

from .models import Execution, Interval, LedgerEntry


class CardDeclined(ValueError):
    """A user-defined error that subclasses ValueError; fatal_on beats retry_on=(ValueError,)."""


@task(takes_context=True, max_attempts=4, retry={"base": 1.0, "max": 10, "jitter": 0.1})
def spaced(context, marker: str, failures: int) -> int:
    """Fails ``failures`` times, recording each attempt's start and the run_after it was claimed under.

    Interval rows: ``started`` = when the attempt began (time.time()), ``ended`` = the job's
    ``run_after`` as a timestamp, ``fencing_token`` = the attempt number.
    """
    run_after = Job.objects.values_list("run_after", flat=True).get(pk=context.job_id)
    Interval.objects.create(
        resource=marker,
        started=time.time(),
        ended=run_after.timestamp(),
        pid=os.getpid(),
        fencing_token=context.attempt,
    )
    if context.attempt <= failures:
        raise TransientError(f"{marker}: planned failure {context.attempt}/{failures}")
    return context.attempt


@task(takes_context=True, max_attempts=3)
def always_transient(context, marker: str) -> None:
    """Never succeeds: every attempt raises a transient error."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    raise TransientError(f"{marker}: still failing on attempt {context.attempt}")


@task(takes_context=True, max_attempts=3)
def rate_limited(context, marker: str, retry_after: float) -> int:
    """Asks for ``retry_after`` seconds on its first attempt, like a 429 with Retry-After."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if context.attempt == 1:
        raise TransientError(f"{marker}: rate limited", retry_after=retry_after)
    return context.attempt


@task(retry={"base": 60, "max": 300, "jitter": 3}, max_attempts=2)
def fails_once_slowly(marker: str) -> None:
    """Fails with a transient error; its production-like schedule brings it back 60-63 s later
    (long enough that a burst of a thousand ends first even on a loaded machine)."""
    raise TransientError(f"{marker}: failing together")


@task(atomic=True, takes_context=True, retry_on=(ValueError,), fatal_on=(CardDeclined,), max_attempts=3)
def charge(context, order_id: int, amount: int) -> int:
    """Charges an order once (the ledger's unique key); a non-positive amount is a permanent error."""
    Execution.objects.create(
        marker=f"charge:{order_id}", job_id=context.job_id, attempt=context.attempt, pid=os.getpid()
    )
    if amount <= 0:
        raise PermanentError(f"order {order_id}: amount {amount} is not a positive number of cents")
    if amount == 402:
        raise CardDeclined(f"order {order_id}: card declined")
    LedgerEntry.objects.create(effect_key=f"charge:{order_id}", amount=amount, job_id=context.job_id)
    return amount


@task(idempotency_scope="payments", max_attempts=1)
def scoped_refund(order_id: int) -> None:
    """Keys of this task live in the "payments" scope, not under the task name."""
    raise TransientError(f"refund {order_id} failed")


@task(lock="order:{order_id}", max_attempts=1)
def ship(order_id: int, carrier: str = "post") -> None:
    """Locks its order and always fails for good: a dead letter whose correction may move the lock."""
    raise PermanentError(f"order {order_id}: no delivery address")


@task
def fulfil(order_id: int, order: dict) -> None:
    """Takes a nested order: the console's diff of a nested correction reads its dead letters."""
