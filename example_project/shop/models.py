"""The shop's data, and the rows its fake outside services write (to prove effects from the database)."""

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


class MailCall(models.Model):
    """Every call made to the (flaky) mail provider, kept whatever its outcome: the retry timeline."""

    idempotency_key = models.CharField(max_length=255)
    attempt = models.PositiveIntegerField()
    called_at = models.DateTimeField()
    outcome = models.CharField(max_length=16)  # "timeout" or "sent"

    def __str__(self) -> str:
        return f"{self.idempotency_key} attempt {self.attempt}: {self.outcome}"


class SentReceipt(models.Model):
    """A receipt the mail provider delivered: one per idempotency key, however often it was asked."""

    idempotency_key = models.CharField(max_length=255, unique=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return f"receipt {self.idempotency_key}"


class OrderSync(models.Model):
    """One push of an order to the ERP, with the time span it held the order's lock."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"sync of order {self.order_id}"


class PackingStart(models.Model):
    """Written when a packing handler starts (autocommit): which worker began which job."""

    job_id = models.BigIntegerField()
    worker_id = models.CharField(max_length=128)
    started_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"job {self.job_id} started by {self.worker_id}"


class Shipment(models.Model):
    """The carrier's label: one per order, enforced by the database."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    worker_id = models.CharField(max_length=128)

    def __str__(self) -> str:
        return f"shipment of order {self.order_id}"


class ClockTick(models.Model):
    """One row per tick of the recurring clock job: which tick, which job, which worker ran it."""

    tick_key = models.CharField(max_length=200, unique=True)
    job_id = models.BigIntegerField()
    worker_id = models.CharField(max_length=128, blank=True, default="")
    ticked_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.tick_key


class Export(models.Model):
    """The slow report, with how long it ran."""

    rows = models.PositiveIntegerField(default=0)
    seconds = models.FloatField(default=0)
    worker_id = models.CharField(max_length=128, blank=True, default="")

    def __str__(self) -> str:
        return f"export {self.pk} ({self.rows} rows)"


class Account(models.Model):
    """A customer account whose summary pages cache."""

    customer = models.CharField(max_length=100, unique=True)
    balance = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    updates = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"account {self.customer} ({self.balance})"


class PartnerOrder(models.Model):
    """An order a partner's webhook delivered."""

    reference = models.CharField(max_length=64, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)

    def __str__(self) -> str:
        return self.reference


# A recorded payment changes its order's cached summary, a saved account its own: delete
# the key once the write commits (for atomic tasks: once their ack commits), never if it
# rolls back. JOBGUARD["CACHE"]["ALIAS"] is the cache every process shares.
invalidates(Payment, "shop:order:{order_id}:summary")
invalidates(Account, "shop:account:{pk}:summary")
