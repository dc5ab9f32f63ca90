from django.db import models

from django_jobguard.cache import invalidates


class Order(models.Model):
    customer = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    card = models.CharField(max_length=20, default="4242")
    paid = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"order {self.pk} ({self.customer}, {self.amount})"


class Payment(models.Model):
    """The local effect of a charge: one per order, enforced by the database."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    provider_ref = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"payment {self.provider_ref} for order {self.order_id}"


class ProviderCharge(models.Model):
    """Stands in for a payment provider that honours idempotency keys, like Stripe does."""

    idempotency_key = models.CharField(max_length=255, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    reference = models.CharField(max_length=64)

    def __str__(self) -> str:
        return self.reference


# A recorded payment changes its order's cached summary: delete the key once the payment
# commits (for charge_order, an atomic task: once its ack commits), never if it rolls back.
invalidates(Payment, "shop:order:{order_id}:summary")
