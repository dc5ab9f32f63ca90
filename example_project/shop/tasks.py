"""The shop's background work. Discovered by django-jobguard like admin.py modules."""

import uuid
from decimal import Decimal

from django_jobguard import task

from .models import Order, Payment, ProviderCharge


class CardDeclinedError(Exception):
    """The provider refused the card: retrying cannot help."""


class ProviderTimeoutError(Exception):
    """The provider did not answer in time: worth another try."""


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
    lock="order:{order_id}",  # never two charges of one order at once
    atomic=True,  # the payment row, the order update and the ack commit together
    takes_context=True,
    retry_on=(ProviderTimeoutError,),
    fatal_on=(CardDeclinedError,),
    handler_version="2026.11",
    idempotency_key="charge:order:{order_id}",  # the key of every enqueue (using() may override)
    parallel=False,  # two charges of one order must never overlap: the lock above keeps them apart
    expected_duration=5,
)
def charge_order(context, order_id: int) -> dict:
    order = Order.objects.get(pk=order_id)
    if order.paid:  # the precondition may have changed since the job was enqueued
        return {"order_id": order_id, "already_paid": True}
    reference = provider_charge(context.idempotency_key or f"order:{order_id}", order.amount, order.card)
    Payment.objects.create(order=order, amount=order.amount, provider_ref=reference)
    order.paid = True
    order.save(update_fields=["paid"])
    return {"order_id": order_id, "provider_ref": reference}


# api=True: other services may enqueue it over the REST API (POST /jobguard/api/jobs/).
@task(queue_name="emails", idempotent=True, max_attempts=1, expected_duration=1, api=True)
def send_receipt(order_id: int) -> str:
    return f"receipt for order {order_id} sent"
