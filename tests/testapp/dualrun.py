"""The task of the Celery dual-run test (tests/processes/test_celery_dual_run.py), shared by both releases.

The old release declares it with Celery's ``shared_task`` (:mod:`.dualrun_celery`), the new one
with jobguard's (:mod:`.dualrun_jobguard`); both call :func:`charge_order`. Orders are
``LedgerEntry`` rows ``order:<id>`` made by the test, ``amount`` 0 until charged.
"""

from __future__ import annotations

import os

from django.db import transaction

from .models import Execution, LedgerEntry


def order_key(order_id: int) -> str:
    return f"order:{order_id}"


def charge_order(order_id: int, side: str) -> str:
    """Charge an order once, whichever side runs it (``side``: "celery" or "jobguard").

    Every run is recorded (``dual-run:ran:<id>``); the charge itself (``dual-run:charged:<id>``)
    happens only after the business record says the order is not charged yet, read under a
    row lock so that a run on the other side waits and then finds it charged.
    """
    Execution.objects.create(marker=f"dual-run:ran:{order_id}", worker=side, pid=os.getpid())
    with transaction.atomic():
        order = LedgerEntry.objects.select_for_update().get(effect_key=order_key(order_id))
        if order.amount:
            return "already charged"
        Execution.objects.create(marker=f"dual-run:charged:{order_id}", worker=side, pid=os.getpid())
        order.amount = 1
        order.save(update_fields=["amount"])
    return "charged"
