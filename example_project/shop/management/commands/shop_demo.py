"""Enqueue a few orders' charges (one twice, one with a declined card), run them, report."""

from decimal import Decimal

from django.core.cache import cache
from django.core.management.base import BaseCommand
from django.db import transaction

from django_jobguard.audit import audit
from django_jobguard.models import DeadLetter, IdempotencyKey, Job
from django_jobguard.worker import Worker
from shop.models import Order, Payment, ProviderCharge
from shop.tasks import charge_order, send_receipt


class Command(BaseCommand):
    help = "Run the django-jobguard demo: charge orders exactly once, dead-letter a declined card."

    def handle(self, *args, **options):
        created = []
        customers = [("ada", "12.50", "4242"), ("grace", "99.00", "4242"), ("linus", "5.00", "0000")]
        for name, amount, card in customers:
            with transaction.atomic():
                order = Order.objects.create(customer=name, amount=Decimal(amount), card=card)
                created.append(order.pk)
                # Enqueued inside the order's transaction: no order, no job; no job, no order.
                charge_order.using(idempotency_key=f"charge:order:{order.pk}").enqueue(order_id=order.pk)
                send_receipt.enqueue(order.pk)
            # A producer resends the same business action: the key returns the first job.
            charge_order.using(idempotency_key=f"charge:order:{order.pk}").enqueue(order_id=order.pk)

        # What a page would cache; the shop declares that a recorded payment invalidates it.
        summaries = [f"shop:order:{pk}:summary" for pk in created]
        cache.set_many(dict.fromkeys(summaries, "unpaid"))

        Worker(burst=True, concurrency=2, install_signal_handlers=False).run()

        self.stdout.write("\njobs by queue and status")
        rows = Job.objects.values_list("queue_name", "status").order_by("queue_name", "status")
        counts: dict[tuple[str, str], int] = {}
        for row in rows:
            counts[row] = counts.get(row, 0) + 1
        for (queue, status), count in counts.items():
            self.stdout.write(f"  {queue:<10} {status:<10} {count}")
        duplicates = sum(IdempotencyKey.objects.values_list("duplicates", flat=True))
        self.stdout.write(f"\nduplicate enqueues stopped by idempotency keys: {duplicates}")
        payments, charges = Payment.objects.count(), ProviderCharge.objects.count()
        self.stdout.write(f"payments recorded: {payments}, provider charges: {charges}")
        invalidated = len(summaries) - len(cache.get_many(summaries))
        self.stdout.write(
            f"order summaries invalidated after their payment committed: {invalidated} of {len(summaries)}"
        )
        for letter in DeadLetter.objects.all():
            self.stdout.write(
                f"dead letter #{letter.pk}: {letter.task_name} {letter.kwargs} -> "
                f"{letter.reason} ({letter.error_class}: {letter.error_message})"
            )
        # What `manage.py jobguard_audit` checks: rows that disagree, leases nobody reaps.
        found = [f"{finding.check} ({finding.count})" for finding in audit() if not finding.ok]
        self.stdout.write(f"consistency audit: {', '.join(found) if found else 'nothing found'}")
        self.stdout.write(
            "\nNext: `python manage.py createsuperuser`, `python manage.py runserver`, and open "
            "http://127.0.0.1:8000/admin/ to read the dead letter and request its replay."
        )
