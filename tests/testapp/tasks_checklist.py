"""Tasks for the checklist tests: a key template, and sleeps of known length for jobguard_tune.

Classified as the docs ask (so `manage.py check` says nothing about them).
"""

from __future__ import annotations

import time

from django_jobguard import task

from .models import LedgerEntry


@task(idempotency_key="checklist:charge:{order_id}", max_attempts=1)
def charge_by_key(order_id: int, amount: int = 1) -> int:
    """Every enqueue for one order gets the key ``checklist:charge:<order_id>``."""
    LedgerEntry.objects.create(effect_key=f"checklist:charge:{order_id}", amount=amount)
    return order_id


@task(queue_name="tune", idempotent=True, max_attempts=1, expected_duration=1)
def sleep_for(seconds: float) -> float:
    """Runs for ``seconds``: durations that jobguard_tune must find again."""
    time.sleep(seconds)
    return seconds
