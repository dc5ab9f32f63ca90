"""The shop's background work. Discovered by django-jobguard like admin.py modules.

The outside services (payment provider, mail provider, ERP, carrier) are fakes that write
rows, so the demo can prove from the database what happened to each of them.
"""

import time
import uuid
from decimal import Decimal
from typing import Any

from django.db.models import F
from django.utils import timezone

from django_jobguard import task

from .models import (
    Account,
    ClockTick,
    Export,
    MailCall,
    Order,
    OrderSync,
    PackingStart,
    PartnerOrder,
    Payment,
    ProviderCharge,
    SentReceipt,
    Shipment,
)

#: Customers of this mail domain make the fake mail provider time out twice before it answers.
SLOW_MAIL_DOMAIN = "slowmail.example"
#: Seconds an ERP sync holds its order's lock; long enough that syncs of one order overlap.
SYNC_SECONDS = 0.4
#: Seconds the carrier takes to print a label.
PACKING_SECONDS = 1.5
#: Seconds the export takes: longer than the fulfilment queue's 3-second visibility timeout.
EXPORT_SECONDS = 4.0


class CardDeclinedError(Exception):
    """The provider refused the card: retrying cannot help."""


class MailTimeoutError(Exception):
    """The mail provider did not answer in time: worth another try."""


class MalformedPayloadError(Exception):
    """A partner's webhook payload lacks what an order needs: retrying cannot help."""


def provider_charge(idempotency_key: str, amount: Decimal, card: str) -> str:
    """A fake provider call. The same key returns the first charge instead of charging again."""
    if card == "0000":
        raise CardDeclinedError(f"card ending {card} declined")
    charge, _ = ProviderCharge.objects.get_or_create(
        idempotency_key=idempotency_key,
        defaults={"amount": amount, "reference": f"ch_{uuid.uuid4().hex[:12]}"},
    )
    return charge.reference


@task(
    queue_name="payments",
    lock="order:{order_id}",  # never two charges (or a charge and a sync) of one order at once
    atomic=True,  # the payment row, the order update, the receipt's job and the ack commit together
    takes_context=True,
    retry_on=(TimeoutError,),
    fatal_on=(CardDeclinedError,),
    handler_version="2026.11",
    idempotency_key="charge:order:{order_id}",  # the key of every enqueue (using() may override)
    parallel=False,  # two charges of one order must never overlap: the lock above keeps them apart
    expected_duration=5,
)
def charge_order(context: Any, order_id: int) -> dict[str, Any]:
    order = Order.objects.get(pk=order_id)
    if order.paid:  # the precondition may have changed since the job was enqueued
        return {"order_id": order_id, "already_paid": True}
    reference = provider_charge(context.idempotency_key or f"order:{order_id}", order.amount, order.card)
    Payment.objects.create(order=order, amount=order.amount, provider_ref=reference)
    order.paid = True
    order.save(update_fields=["paid"])
    # Inside the charge's transaction: the receipt exists only if the charge commits.
    send_receipt.using(idempotency_key=f"receipt:order:{order_id}").enqueue(order_id=order_id)
    return {"order_id": order_id, "provider_ref": reference}


# api=True: other services may enqueue it over the REST API (POST /jobguard/api/jobs/).
@task(
    queue_name="emails",
    takes_context=True,
    retry_on=(MailTimeoutError,),
    idempotent=True,  # the key passed on makes the provider deliver once; get_or_create records it once
    expected_duration=1,
    api=True,
)
def send_receipt(context: Any, order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    key = context.idempotency_key or f"receipt:order:{order_id}"
    # Not atomic: a provider call is not rolled back with our transaction, so each call is
    # recorded at once, and the key passed on makes the provider deliver once.
    flaky = order.customer.endswith("@" + SLOW_MAIL_DOMAIN) and context.attempt <= 2
    MailCall.objects.create(
        idempotency_key=key,
        attempt=context.attempt,
        called_at=timezone.now(),
        outcome="timeout" if flaky else "sent",
    )
    if flaky:
        raise MailTimeoutError(f"{SLOW_MAIL_DOMAIN} did not answer within 10s")
    SentReceipt.objects.get_or_create(idempotency_key=key, defaults={"order": order})
    return f"receipt for order {order_id} sent"


@task(queue_name="syncs", lock="order:{order_id}", idempotent=True, retry_on=(TimeoutError,))
def sync_order(order_id: int) -> None:
    started = timezone.now()
    time.sleep(SYNC_SECONDS)  # the ERP call, made while the order's lock is held
    OrderSync.objects.create(order_id=order_id, started_at=started, finished_at=timezone.now())


@task(queue_name="fulfilment", takes_context=True, idempotent=True, retry_on=(TimeoutError,))
def pack_shipment(context: Any, order_id: int) -> str:
    PackingStart.objects.create(job_id=context.job_id, worker_id=context.worker_id)
    time.sleep(PACKING_SECONDS)  # the carrier prints the label
    # One label per order whatever happens to the worker: a rerun finds the first one.
    shipment, _ = Shipment.objects.get_or_create(order_id=order_id, defaults={"worker_id": context.worker_id})
    return f"label for order {order_id} by {shipment.worker_id}"


@task(
    queue_name="exports", takes_context=True, idempotent=True, retry_on=(TimeoutError,), expected_duration=5
)
def export_orders(context: Any, export_id: int) -> int:
    started = time.monotonic()
    deadline = started + EXPORT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.25)  # the heartbeat extends the lease meanwhile
    rows = Order.objects.count()
    Export.objects.filter(pk=export_id).update(
        rows=rows, seconds=round(time.monotonic() - started, 2), worker_id=context.worker_id
    )
    return rows


# The nightly report, as a batch (shop/demo/acts.py): one tally per slice of the orders,
# side by side, then build_report once, after the last tally settled.
@task(queue_name="exports", idempotent=True, retry_on=(TimeoutError,))
def tally_orders(part: int, parts: int) -> dict[str, Any]:
    amounts = [
        amount
        for pk, amount in Order.objects.filter(paid=True).values_list("pk", "amount")
        if pk % parts == part
    ]
    return {"part": part, "orders": len(amounts), "amount": str(sum(amounts, Decimal(0)))}


@task(queue_name="exports", idempotent=True, retry_on=(TimeoutError,))
def build_report(day: str, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """The batch's ``on_complete`` callback: ``progress`` says how many tallies succeeded."""
    progress = progress or {}
    return {"day": day, "tallies": progress.get("succeeded", 0), "failed": progress.get("failed", 0)}


# Not idempotent by itself (it adds an amount): every caller passes the update's event id as
# the idempotency key, which is what stops a redelivered update.
@task(queue_name="accounts", lock="account:{account_id}", atomic=True, idempotent=False, max_attempts=1)
def apply_account_update(account_id: int, amount: str) -> None:
    account = Account.objects.select_for_update().get(pk=account_id)
    account.balance = F("balance") + Decimal(amount)
    account.updates = F("updates") + 1
    account.save(update_fields=["balance", "updates"])  # post_save: the summary goes at commit


@task(queue_name="webhooks", fatal_on=(MalformedPayloadError,), idempotent=True)
def import_partner_order(payload: dict[str, Any]) -> str:
    missing = sorted({"reference", "amount"} - set(payload))
    if missing:
        raise MalformedPayloadError(f"partner payload has no {', '.join(missing)}")
    PartnerOrder.objects.get_or_create(
        reference=payload["reference"], defaults={"amount": Decimal(str(payload["amount"]))}
    )
    return payload["reference"]


# Every worker runs the scheduler; each tick is enqueued once, with the key
# schedule:shop.tasks.clock_tick:<tick in UTC>, whichever scheduler gets there first.
@task(
    queue_name="clock",
    schedule="*/2 * * * * *",  # six fields, seconds first: every two seconds
    takes_context=True,
    idempotent=True,  # one row per tick key: a rerun of a tick finds its row
    retry_on=(TimeoutError,),
    expected_duration=0.5,
)
def clock_tick(context: Any) -> str:
    key = context.idempotency_key or f"manual:{context.job_id}"
    ClockTick.objects.get_or_create(
        tick_key=key,
        defaults={"job_id": context.job_id, "worker_id": context.worker_id, "ticked_at": timezone.now()},
    )
    return key
