"""Tasks of the cache invalidation tests: atomic writes that invalidate a cached value."""

from __future__ import annotations

import os
import time
from pathlib import Path

from django_jobguard import task
from django_jobguard.cache import invalidate, set_versioned
from django_jobguard.models import Job

from .models import Account, Execution

GATE_TIMEOUT_SECONDS = 60


def wait_for_gate(gate: str) -> None:
    """Create ``<gate>.reached``, then block until the test creates ``gate`` (a minute at most)."""
    Path(f"{gate}.reached").touch()
    deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@task(atomic=True, takes_context=True, visibility_timeout=2)
def credit(
    context,
    account_id: int,
    amount: int,
    key: str,
    cache_alias: str,
    gate: str = "",
    refuse_first_ack: bool = False,
    sleep_first: float = 0.0,
) -> int:
    """Credit an account and invalidate its cached balance, all inside the ack's transaction.

    - ``gate``: after invalidating, still inside the transaction, say so with the file
      ``<gate>.reached`` and wait for the file ``gate``.
    - ``refuse_first_ack``: on the first attempt, move the job's lease token inside the same
      transaction, so the worker's fenced ack finds no row, raises LeaseLost and rolls back
      (as when another worker took the job over). Later attempts run normally.
    - ``sleep_first``: the first attempt sleeps this long before writing (a test freezes it).
    """
    Execution.objects.create(marker=key, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if context.attempt == 1 and sleep_first:
        time.sleep(sleep_first)
    account = Account.objects.select_for_update().get(pk=account_id)
    account.balance += amount
    account.revision += 1
    account.save(update_fields=["balance", "revision"])
    invalidate(key, cache_alias=cache_alias)  # one database: the default alias is the worker's
    if gate:
        wait_for_gate(gate)
    if refuse_first_ack and context.attempt == 1:
        Job.objects.filter(pk=context.job_id).update(lease_token="f" * 32)
    return account.balance


@task()
def cache_churn(key: str, versions: list[int]) -> list[bool]:
    """Versioned writes of ``versions`` in that order, then invalidate the key on two caches.

    Not atomic: each invalidation runs at once (autocommit), in the worker process.
    """
    written = [set_versioned(key, version, version) for version in versions]
    invalidate(key, f"{key}:summary")
    invalidate(key, cache_alias="files")
    return written
