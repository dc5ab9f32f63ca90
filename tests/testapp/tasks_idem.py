"""Tasks for the idempotency tests: a payment charge against a fake provider, phased work."""

from __future__ import annotations

import os

from django.db import transaction

from django_jobguard import PermanentError, TransientError, _faults, task

from .models import Execution, LedgerEntry, ProviderCall


class ProviderError(Exception):
    """The fake provider refused the request."""


def provider_charge(idempotency_key: str, amount: int) -> str:
    """A fake payment provider: records every call, and charges once per key, like Stripe.

    A call with a key seen before returns the first call's charge; the same key with
    another amount is refused.
    """
    with transaction.atomic():
        ProviderCall.objects.create(idempotency_key=idempotency_key, amount=amount, pid=os.getpid())
        first = ProviderCall.objects.filter(idempotency_key=idempotency_key).order_by("pk").first()
    assert first is not None
    if first.amount != amount:
        raise ProviderError(f"idempotency key {idempotency_key!r} was used for {first.amount}, not {amount}")
    return f"ch_{first.pk}"


@task(takes_context=True, visibility_timeout=2, idempotency_scope="payments", fatal_on=(ProviderError,))
def charge(context, order_id: int, amount: int) -> dict:
    """Charge an order: call the provider with the job's key, then write the ledger.

    Not atomic (the provider call is outside our database), so each phase records a
    checkpoint and a retry resumes after the last one that finished.
    """
    if context.idempotency_key is None:
        raise PermanentError("charge needs an idempotency key to pass to the provider")
    Execution.objects.create(
        marker=f"charge:{order_id}", job_id=context.job_id, attempt=context.attempt, pid=os.getpid()
    )
    reference = context.get_checkpoint("charged")
    if reference is None:
        reference = provider_charge(context.idempotency_key, amount)
        if _faults.ENABLED:
            _faults.maybe_crash("mid_task")  # the provider charged; the checkpoint is not written
        context.checkpoint("charged", reference)
    if context.get_checkpoint("recorded") is None:
        # The ledger row and its checkpoint commit together.
        with transaction.atomic():
            LedgerEntry.objects.create(
                effect_key=f"charge:order:{order_id}", amount=amount, job_id=context.job_id
            )
            context.checkpoint("recorded")
    return {"charge": reference}


@task(takes_context=True, max_attempts=3)
def phased(context, marker: str, fail_after: str = "") -> list[str]:
    """Three phases, each checkpointed; the first attempt fails after phase ``fail_after``."""
    done = []
    for phase in ("reserve", "charge", "notify"):
        if context.get_checkpoint(phase) is None:
            Execution.objects.create(
                marker=f"{marker}:{phase}", job_id=context.job_id, attempt=context.attempt
            )
            context.checkpoint(phase, context.attempt)
            done.append(phase)
        if phase == fail_after and context.attempt == 1:
            raise TransientError(f"{marker}: planned failure after {phase}")
    return done


@task(atomic=True, takes_context=True, max_attempts=1)
def atomic_checkpoint(context) -> None:
    context.checkpoint("never")


@task(idempotency_scope="shared")
def shared_a(x: int) -> int:
    return x


@task(idempotency_scope="shared")
def shared_b(x: int) -> int:
    return x


@task(atomic=True, takes_context=True)
def keyed_record(context, marker: str, amount: int = 1) -> str:
    """Atomic: the execution row, the ledger effect, the key's success and the ack commit together."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    LedgerEntry.objects.create(effect_key=marker, amount=amount, job_id=context.job_id)
    return f"{marker}:{context.job_id}"


@task(atomic=True, takes_context=True)
def failing_record(context, marker: str, fail: bool = True) -> str:
    """Atomic: writes its effect, then fails permanently if told to (its write rolls back)."""
    LedgerEntry.objects.create(effect_key=marker, job_id=context.job_id)
    if fail:
        raise PermanentError(f"{marker}: refused after writing")
    return marker
