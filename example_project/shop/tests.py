"""The shop's own tests, written with django-jobguard's test kit: plain TestCases, no worker process.

Run them with ``python manage.py test shop``. Each job runs in the test's transaction through
the worker's pipeline (``run_jobs()``); retries wait for a clock the test moves.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.test import TestCase

from django_jobguard.models import DeadLetter
from django_jobguard.testing import JobguardTestMixin, frozen_time

from .models import MailCall, Order, Payment, SentReceipt
from .tasks import SLOW_MAIL_DOMAIN, charge_order, send_receipt


class ChargeTests(JobguardTestMixin, TestCase):
    def test_a_charge_pays_the_order_and_sends_one_receipt(self) -> None:
        order = Order.objects.create(customer="ada@example.com", amount=Decimal("12.50"))
        charge_order.enqueue(order_id=order.pk)
        charge_order.enqueue(order_id=order.pk)  # a double submission: the same key, the same job

        self.jobguard.assert_enqueued(charge_order, kwargs={"order_id": order.pk}, count=1)
        self.jobguard.refute_enqueued(send_receipt)  # not before the charge commits

        summary = self.jobguard.run_jobs()

        self.assertEqual((summary.succeeded, summary.failed), (2, 0))  # the charge, then its receipt
        self.assertEqual(Payment.objects.get(order=order).amount, Decimal("12.50"))
        self.jobguard.assert_enqueued(send_receipt, kwargs={"order_id": order.pk}, queue="emails")
        self.assertEqual(SentReceipt.objects.filter(order=order).count(), 1)

    def test_a_declined_card_is_dead_lettered_at_once(self) -> None:
        order = Order.objects.create(customer="bob@example.com", amount=Decimal("3.00"), card="0000")
        job = charge_order.enqueue(order_id=order.pk)

        self.assertEqual(self.jobguard.run_jobs().dead, 1)

        letter = DeadLetter.objects.get(job=job)
        self.assertEqual((letter.reason, letter.attempts), ("permanent_error", 1))
        self.assertFalse(Payment.objects.exists())
        self.jobguard.refute_enqueued(send_receipt)


class ReceiptTests(JobguardTestMixin, TestCase):
    def test_a_slow_mail_provider_is_retried_until_it_answers(self) -> None:
        order = Order.objects.create(customer=f"carol@{SLOW_MAIL_DOMAIN}", amount=Decimal("8.00"))
        job = send_receipt.enqueue(order_id=order.pk)

        with frozen_time() as clock:
            self.assertEqual(self.jobguard.run_jobs().retried, 1)
            clock.advance(60)  # past the first backoff
            self.assertEqual(self.jobguard.run_jobs().retried, 1)
            clock.advance(60)
            self.assertEqual(self.jobguard.run_jobs().succeeded, 1)

        job.refresh_from_db()
        self.assertEqual((job.status, job.attempts), ("succeeded", 3))
        self.assertEqual(
            list(MailCall.objects.order_by("attempt").values_list("outcome", flat=True)),
            ["timeout", "timeout", "sent"],
        )


class InlineTests(JobguardTestMixin, TestCase):
    jobguard_mode = "inline"  # jobs run when the enqueuing transaction commits

    def test_a_charge_runs_when_the_order_commits(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(customer="dan@example.com", amount=Decimal("5.00"))
            charge_order.enqueue(order_id=order.pk)
            self.assertFalse(Payment.objects.exists())  # not before the commit
        self.assertTrue(Payment.objects.filter(order=order).exists())
        self.assertTrue(SentReceipt.objects.filter(order=order).exists())

    def test_a_rolled_back_order_is_never_charged(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(customer="eve@example.com", amount=Decimal("9.00"))
            charge_order.enqueue(order_id=order.pk)
            transaction.set_rollback(True)
        self.assertFalse(Payment.objects.exists())
        self.jobguard.refute_enqueued(charge_order)
