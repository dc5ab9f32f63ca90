"""The demo's acts: each puts one discipline under load, then proves it held from the database.

An act is a small state machine the runner ticks about ten times a second while the
workers run: ``start`` (before the workers), ``tick`` (enqueue in steps, react to progress),
``done`` (nothing more to enqueue), ``after_workers`` (once every worker has stopped) and
``proofs`` (rows of the summary table, each with the figures the JSON summary records).
A new discipline is one more class in :data:`ACTS`.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import os
import signal
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.db import transaction
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from django_jobguard import Batch, dlq, schedules
from django_jobguard.conf import get_settings
from django_jobguard.models import DeadLetter, IdempotencyKey, Job, JobStatus, Schedule, WorkflowCallback
from django_jobguard.workflows import progress
from shop.models import (
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
from shop.tasks import (
    EXPORT_SECONDS,
    SLOW_MAIL_DOMAIN,
    apply_account_update,
    build_report,
    charge_order,
    clock_tick,
    export_orders,
    import_partner_order,
    pack_shipment,
    sync_order,
    tally_orders,
)

from .display import enqueue_duplicates_counted

if TYPE_CHECKING:
    from .runner import Demo

SUMMARIES = "summaries"  # the cache alias every process shares (settings.CACHES)


@dataclasses.dataclass
class Proof:
    """One row of the summary table."""

    guarantee: str
    evidence: str
    ok: bool
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)


class Act:
    """One discipline of the demo. Subclasses override what they need."""

    #: Key of the act's figures in the JSON summary.
    name = ""
    done = True

    def start(self, demo: Demo) -> None:
        """Before the workers start."""

    def tick(self, demo: Demo) -> None:
        """About ten times a second while the workers run."""

    def after_workers(self, demo: Demo) -> None:
        """Once every worker process has stopped."""

    def proofs(self, demo: Demo) -> list[Proof]:
        return []


def _task_jobs(task: Any) -> Any:
    return Job.objects.filter(task_name=task.name)


class Orders(Act):
    """A few hundred checkouts: a quarter submitted twice, one declined card, some slow mail."""

    name = "orders"
    CHUNK = 25  # orders enqueued per tick, so the workers start on the first while we enqueue

    def __init__(self, count: int) -> None:
        self.count = count
        self.created: list[int] = []
        self.double_submissions = 0
        self.declined: list[int] = []
        self.done = False

    def plan(self, index: int) -> tuple[str, str, str]:
        domain = SLOW_MAIL_DOMAIN if index % 20 == 7 else "mail.example"
        card = "0000" if index == self.count // 2 else "4242"
        return f"customer{index:03d}@{domain}", f"{10 + (index * 37) % 190}.{index % 100:02d}", card

    def tick(self, demo: Demo) -> None:
        if self.done:
            return
        cache = caches[SUMMARIES]
        for index in range(len(self.created), min(self.count, len(self.created) + self.CHUNK)):
            customer, amount, card = self.plan(index)
            with transaction.atomic():
                order = Order.objects.create(customer=customer, amount=Decimal(amount), card=card)
                # What the order page caches; the payment's commit deletes it (shop/models.py).
                cache.set(f"shop:order:{order.pk}:summary", f"{customer}: {amount} unpaid")
                # Enqueued inside the order's transaction: no order, no job; no job, no order.
                charge_order.using(idempotency_key=f"charge:order:{order.pk}").enqueue(order_id=order.pk)
            self.created.append(order.pk)
            if card == "0000":
                self.declined.append(order.pk)
            if index % 4 == 1:
                # The customer pressed "Pay" twice: the second request carries the same key.
                charge_order.using(idempotency_key=f"charge:order:{order.pk}").enqueue(order_id=order.pk)
                self.double_submissions += 1
        self.done = len(self.created) >= self.count

    def proofs(self, demo: Demo) -> list[Proof]:
        orders = Order.objects.filter(pk__in=self.created)
        paid = orders.filter(paid=True).count()
        payments = Payment.objects.filter(order__in=orders).count()
        keys = [f"charge:order:{pk}" for pk in self.created]
        charges = ProviderCharge.objects.filter(idempotency_key__in=keys).count()
        # Every payment's provider reference is the one charge made under its order's key.
        matched = Payment.objects.filter(
            order__in=orders,
            provider_ref__in=ProviderCharge.objects.filter(idempotency_key__in=keys).values("reference"),
        ).count()
        jobs_per_key = (
            _task_jobs(charge_order).values("idempotency_key").annotate(n=Count("id")).aggregate(m=Max("n"))
        )["m"]
        receipts = SentReceipt.objects.filter(order__in=orders).count()
        expected_paid = self.count - len(self.declined)
        cache = caches[SUMMARIES]
        summaries = [f"shop:order:{pk}:summary" for pk in self.created]
        kept = set(cache.get_many(summaries))
        invalidated = len(summaries) - len(kept)
        declined_kept = all(f"shop:order:{pk}:summary" in kept for pk in self.declined)
        return [
            Proof(
                "every order charged exactly once",
                f"{len(self.created)} orders, {paid} paid, {payments} payments, {charges} provider charges "
                f"({matched} matching their payment), at most {jobs_per_key} charge job per key",
                paid == payments == charges == matched == expected_paid and jobs_per_key == 1,
                {
                    "orders": len(self.created),
                    "paid": paid,
                    "payments": payments,
                    "provider_charges": charges,
                    "declined": len(self.declined),
                    "double_submissions": self.double_submissions,
                    "max_charge_jobs_per_key": jobs_per_key,
                },
            ),
            Proof(
                "one receipt per paid order",
                f"{receipts} receipts delivered for {paid} paid orders",
                receipts == paid,
                {"receipts": receipts},
            ),
            Proof(
                "cached summaries deleted after the payment committed",
                f"{invalidated} of {len(summaries)} order summaries invalidated; "
                f"the declined order's summary {'kept' if declined_kept else 'LOST'} (no payment committed)",
                invalidated == paid and declined_kept,
                {"order_summaries_invalidated": invalidated, "order_summaries": len(summaries)},
            ),
        ]


class ProducerResend(Act):
    """Halfway through, the checkout service restarts and resends its last 30 charges."""

    name = "resend"
    COUNT = 30

    def __init__(self, orders: Orders) -> None:
        self.orders = orders
        self.resent: list[int] = []
        self.new_jobs = 0
        self.done = False

    def start(self, demo: Demo) -> None:
        self.counted_before = enqueue_duplicates_counted()

    def tick(self, demo: Demo) -> None:
        if self.done or not self.orders.done:
            return
        finished = _task_jobs(charge_order).filter(status__in=[JobStatus.SUCCEEDED, JobStatus.DEAD]).count()
        if finished < len(self.orders.created) // 2:
            return
        before = _task_jobs(charge_order).count()
        for pk in self.orders.created[: self.COUNT]:
            charge_order.using(idempotency_key=f"charge:order:{pk}").enqueue(order_id=pk)
            self.resent.append(pk)
        self.new_jobs = _task_jobs(charge_order).count() - before
        self.done = True

    def proofs(self, demo: Demo) -> list[Proof]:
        planned = self.orders.double_submissions + len(self.resent) + demo.extra_duplicates
        stopped = IdempotencyKey.objects.aggregate(s=Sum("duplicates"))["s"] or 0
        after = enqueue_duplicates_counted()
        counted = None if after is None or self.counted_before is None else int(after - self.counted_before)
        metric = "" if counted is None else f"; jobguard_idempotency_duplicates_total counted {counted}"
        return [
            Proof(
                "duplicate submissions and resends stopped by idempotency keys",
                f"{stopped} duplicates stopped ({self.orders.double_submissions} double submissions, "
                f"{len(self.resent)} resent charges, {demo.extra_duplicates} redelivered account updates); "
                f"the resend created {self.new_jobs} jobs{metric}",
                stopped == planned and self.new_jobs == 0 and counted in (None, stopped),
                {
                    "duplicates_stopped": stopped,
                    "duplicates_counted_by_metric": counted,
                    "resent": len(self.resent),
                    "resend_new_jobs": self.new_jobs,
                },
            )
        ]


class FlakyMail(Act):
    """The mail provider times out twice for one domain: retries with backoff and jitter."""

    name = "retries"

    def proofs(self, demo: Demo) -> list[Proof]:
        calls = list(
            MailCall.objects.filter(idempotency_key__in=self._flaky_keys()).order_by(
                "idempotency_key", "attempt"
            )
        )
        timelines: dict[str, list[MailCall]] = {}
        for call in calls:
            timelines.setdefault(call.idempotency_key, []).append(call)
        gaps = [
            [round((b.called_at - a.called_at).total_seconds(), 2) for a, b in itertools.pairwise(line)]
            for line in timelines.values()
        ]
        sent = SentReceipt.objects.filter(idempotency_key__in=list(timelines)).count()
        policy = get_settings().retry
        shapes_ok = all(
            [c.outcome for c in line] == ["timeout", "timeout", "sent"] for line in timelines.values()
        )
        sample = ", ".join(f"+{a}s then +{b}s" for a, b in gaps[:3])
        return [
            Proof(
                "flaky provider retried with backoff and jitter, delivered once",
                f"{len(timelines)} receipts took 3 calls each ({sample}, ...: backoff "
                f"{policy.base:g}s * 2^n + up to {policy.jitter:g}s jitter, plus the queue's backlog); "
                f"{sent} delivered",
                bool(timelines) and shapes_ok and sent == len(timelines),
                {"flaky_receipts": len(timelines), "mail_calls": len(calls), "gaps_seconds": gaps},
            )
        ]

    def _flaky_keys(self) -> list[str]:
        return [
            f"receipt:order:{pk}"
            for pk in Order.objects.filter(customer__endswith="@" + SLOW_MAIL_DOMAIN, paid=True).values_list(
                "pk", flat=True
            )
        ]


class LockContention(Act):
    """Six popular orders pushed to the ERP five times each: the order lock serialises them."""

    name = "locks"
    ORDERS, SYNCS = 6, 5

    def __init__(self, orders: Orders) -> None:
        self.orders = orders
        self.done = False

    def tick(self, demo: Demo) -> None:
        if self.done or len(self.orders.created) < 20 + self.ORDERS:
            return
        self.hot = self.orders.created[20 : 20 + self.ORDERS]
        with transaction.atomic():
            for pk in self.hot:  # one order's syncs side by side: the same batch claims them
                for _ in range(self.SYNCS):
                    sync_order.enqueue(order_id=pk)
        self.done = True

    def proofs(self, demo: Demo) -> list[Proof]:
        jobs = _task_jobs(sync_order)
        figures = jobs.aggregate(
            contentions=Sum("lock_contentions"),
            most_attempts=Max("attempts"),
            succeeded=Count("id", filter=Q(status=JobStatus.SUCCEEDED)),
        )
        overlaps = 0
        for pk in self.hot:
            spans = sorted(OrderSync.objects.filter(order_id=pk).values_list("started_at", "finished_at"))
            overlaps += sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
        total = self.ORDERS * self.SYNCS
        return [
            Proof(
                "lock contention requeues without using attempts",
                f"{figures['succeeded']} of {total} syncs succeeded after {figures['contentions'] or 0} "
                f"lock contentions, none needed a second attempt; overlapping syncs of one order: {overlaps}",
                figures["succeeded"] == total
                and figures["most_attempts"] == 1
                and overlaps == 0
                and bool(figures["contentions"]),
                {
                    "syncs": total,
                    "lock_contentions": figures["contentions"] or 0,
                    "max_attempts": figures["most_attempts"],
                    "overlaps": overlaps,
                },
            )
        ]


class AccountUpdates(Act):
    """Balance updates, some delivered twice, each invalidating the account's cached summary."""

    name = "cache"
    ACCOUNTS, UPDATED, UPDATES_EACH, REDELIVERED = 24, 20, 3, 6

    def __init__(self) -> None:
        self.done = False

    def start(self, demo: Demo) -> None:
        cache = caches[SUMMARIES]
        self.accounts = [Account.objects.create(customer=f"account{n:02d}") for n in range(self.ACCOUNTS)]
        cache.set_many({f"shop:account:{a.pk}:summary": "balance 0.00" for a in self.accounts})
        self.expected: dict[int, Decimal] = {}

    def tick(self, demo: Demo) -> None:
        if self.done:
            return
        number = 0
        for account in self.accounts[: self.UPDATED]:
            for step in range(self.UPDATES_EACH):
                number += 1
                amount = f"{(number * 7) % 50 + 1}.25"
                self.expected[account.pk] = self.expected.get(account.pk, Decimal(0)) + Decimal(amount)
                key = f"account-update:{account.pk}:{step}"
                apply_account_update.using(idempotency_key=key).enqueue(account_id=account.pk, amount=amount)
                if number <= self.REDELIVERED:  # the message bus delivered it twice
                    apply_account_update.using(idempotency_key=key).enqueue(
                        account_id=account.pk, amount=amount
                    )
        demo.extra_duplicates += self.REDELIVERED
        self.done = True

    def proofs(self, demo: Demo) -> list[Proof]:
        cache = caches[SUMMARIES]
        balances = dict(Account.objects.filter(pk__in=self.expected).values_list("pk", "balance"))
        right = sum(1 for pk, value in self.expected.items() if balances.get(pk) == value)
        keys = {a.pk: f"shop:account:{a.pk}:summary" for a in self.accounts}
        held = cache.get_many(list(keys.values()))
        invalidated = sum(1 for pk in self.expected if keys[pk] not in held)
        untouched = [pk for pk in keys if pk not in self.expected]
        kept = sum(1 for pk in untouched if keys[pk] in held)
        return [
            Proof(
                "account updates applied once, cached summaries invalidated after commit",
                f"{right} of {len(self.expected)} balances right; {invalidated} of {len(self.expected)} "
                f"updated accounts' summaries deleted, {kept} of {len(untouched)} untouched ones kept",
                right == invalidated == len(self.expected) and kept == len(untouched),
                {
                    "accounts_updated": len(self.expected),
                    "balances_right": right,
                    "summaries_invalidated": invalidated,
                },
            )
        ]


class SlowExport(Act):
    """A four-second export on its own queue, whose visibility timeout outlives it."""

    name = "export"

    def start(self, demo: Demo) -> None:
        self.export = Export.objects.create()
        self.job = export_orders.enqueue(export_id=self.export.pk)

    def proofs(self, demo: Demo) -> list[Proof]:
        job = Job.objects.get(pk=self.job.pk)
        export = Export.objects.get(pk=self.export.pk)
        queues = get_settings().queues
        timeout = queues["exports"].visibility_timeout
        fast = queues["fulfilment"].visibility_timeout
        return [
            Proof(
                "slow export on its own queue, no second run",
                f"ran {export.seconds}s on '{job.queue_name}' (visibility timeout {timeout:g}s, the "
                f"fulfilment queue's is {fast:g}s): {job.status} after {job.attempts} attempt, "
                f"{job.reappearances} reappearances",
                job.status == JobStatus.SUCCEEDED
                and job.attempts == 1
                and job.reappearances == 0
                and export.seconds >= EXPORT_SECONDS,
                {"seconds": export.seconds, "attempts": job.attempts, "reappearances": job.reappearances},
            )
        ]


class NightlyReport(Act):
    """The nightly report as a batch: a tally per slice of the orders, then one report."""

    name = "report"
    PARTS = 4

    def start(self, demo: Demo) -> None:
        day = timezone.localdate().isoformat()
        self.batch = Batch(
            on_complete=build_report.s(day=day).receives("progress"), name=f"nightly report {day}"
        ).enqueue([tally_orders.s(part=i, parts=self.PARTS) for i in range(self.PARTS)])

    def proofs(self, demo: Demo) -> list[Proof]:
        p = progress(self.batch.id or 0)
        callbacks = list(
            WorkflowCallback.objects.filter(workflow_id=self.batch.id).values_list("when", "job_id")
        )
        reports = list(Job.objects.filter(pk__in=[job_id for _, job_id in callbacks]))
        ran_once = len(reports) == 1 and reports[0].status == JobStatus.SUCCEEDED and reports[0].attempts == 1
        tallies = (
            reports[0].result.get("tallies") if ran_once and isinstance(reports[0].result, dict) else None
        )
        return [
            Proof(
                "nightly report as a batch: its callback ran once, after every tally",
                f"batch #{self.batch.id} {p.state}: {p.succeeded}/{p.total} tallies succeeded; "
                f"on_complete enqueued {len(callbacks)} time(s), its report counted {tallies} tallies",
                p.state == "finished"
                and p.succeeded == p.total == self.PARTS
                and len(callbacks) == 1
                and tallies == self.PARTS,
                {
                    "workflow_id": self.batch.id,
                    "members": p.total,
                    "succeeded": p.succeeded,
                    "callbacks": len(callbacks),
                    "report_job_id": reports[0].pk if reports else None,
                },
            )
        ]


class DeadLetters(Act):
    """A malformed partner webhook (and the declined card): dead-lettered with their reasons."""

    name = "dead_letters"

    def start(self, demo: Demo) -> None:
        import_partner_order.enqueue(payload={"reference": "partner-7001", "amount": "42.00"})
        self.malformed = import_partner_order.enqueue(
            payload={"reference": "partner-7002", "currency": "EUR"}
        )

    def after_workers(self, demo: Demo) -> None:
        # The support team asks for the webhook to be replayed with the amount the partner
        # confirmed by phone; another person must approve it (`make console`).
        letter = DeadLetter.objects.get(job_id=self.malformed.pk)
        dlq.request_replay(
            letter,
            demo.requester,
            "partner confirmed the amount by phone (ticket 4711)",
            kwargs={"payload": {"reference": "partner-7002", "currency": "EUR", "amount": "19.90"}},
        )
        self.letter_pk = letter.pk

    def proofs(self, demo: Demo) -> list[Proof]:
        letters = list(DeadLetter.objects.order_by("pk"))
        described = "; ".join(
            f"#{d.pk} {d.task_name.rsplit('.', 1)[-1]} -> {d.reason} ({d.error_message})" for d in letters
        )
        waiting = DeadLetter.objects.pending_approval().count()
        classes = sorted(d.error_class.rsplit(".", 1)[-1] for d in letters)
        return [
            Proof(
                "bad work dead-lettered with its reason, a corrected replay waits for approval",
                f"{described}; replays waiting for approval: {waiting}",
                classes == ["CardDeclinedError", "MalformedPayloadError"]
                and all(d.reason == "permanent_error" for d in letters)
                and waiting == 1
                and PartnerOrder.objects.filter(reference="partner-7001").exists(),
                {
                    "dead_letters": [
                        {"id": d.pk, "task": d.task_name, "reason": d.reason, "error_class": d.error_class}
                        for d in letters
                    ],
                    "replays_waiting": waiting,
                },
            )
        ]


class KilledWorker(Act):
    """A worker is killed (SIGKILL) in the middle of packing; another finishes its jobs."""

    name = "crash"
    SHIPMENTS = 4

    def __init__(self, orders: Orders) -> None:
        self.orders = orders
        self.done = False
        self.state = "waiting for orders"
        self.held: list[int] = []

    def start(self, demo: Demo) -> None:
        self.victim = demo.start_worker("worker-killed", queues=["fulfilment"])

    def tick(self, demo: Demo) -> None:
        if self.done:
            return
        if self.victim.poll() is not None:
            raise RuntimeError(
                f"worker-killed exited by itself (code {self.victim.returncode}) before the kill; "
                f"see {demo.log_dir / 'worker-killed.log'}"
            )
        if self.state == "waiting for orders" and len(self.orders.created) >= self.SHIPMENTS:
            self.jobs = [pack_shipment.enqueue(order_id=pk) for pk in self.orders.created[: self.SHIPMENTS]]
            self.state = "waiting for the victim to start packing"
        elif self.state == "waiting for the victim to start packing":
            if PackingStart.objects.filter(worker_id="worker-killed").exists():
                os.kill(self.victim.pid, signal.SIGKILL)  # no shutdown, no hand-back: a crash
                self.victim.wait(timeout=30)
                self.held = list(
                    Job.objects.filter(pk__in=[j.pk for j in self.jobs], worker_id="worker-killed")
                    .filter(status=JobStatus.RUNNING)
                    .values_list("pk", flat=True)
                )
                demo.note(f"killed worker-killed (SIGKILL) holding jobs {self.held}")
                # The rescuer serves every queue; its reaper sees the leases expire.
                demo.start_worker("worker-b")
                self.state = "killed"
                self.done = True

    def proofs(self, demo: Demo) -> list[Proof]:
        jobs = Job.objects.filter(pk__in=[j.pk for j in self.jobs])
        recovered = jobs.filter(pk__in=self.held, status=JobStatus.SUCCEEDED, reappearances__gte=1).exclude(
            worker_id="worker-killed"
        )
        started_by_victim = set(
            PackingStart.objects.filter(worker_id="worker-killed").values_list("job_id", flat=True)
        )
        order_ids = [j.kwargs["order_id"] for j in self.jobs]
        labels = Shipment.objects.filter(order_id__in=order_ids).count()
        finishers = sorted(set(recovered.values_list("worker_id", flat=True)))
        succeeded = jobs.filter(status=JobStatus.SUCCEEDED).count()
        return [
            Proof(
                "killed worker's jobs finished by another, nothing lost or doubled",
                f"worker-killed held {len(self.held)} jobs (started {len(started_by_victim)}); "
                f"{recovered.count()} reappeared after their lease expired and were finished by "
                f"{', '.join(finishers) or 'nobody'}; {succeeded} of {len(self.jobs)} packed, "
                f"{labels} labels for {len(order_ids)} orders",
                bool(self.held)
                and recovered.count() == len(self.held)
                and succeeded == labels == len(self.jobs),
                {
                    "held_by_killed_worker": self.held,
                    "started_by_killed_worker": sorted(started_by_victim),
                    "recovered": recovered.count(),
                    "labels": labels,
                    "shipments": len(self.jobs),
                },
            )
        ]


class RecurringJob(Act):
    """A clock job every two seconds, scheduled by every worker: each tick enqueued once.

    The clock runs while the other acts work; once they have nothing left, the approver
    pauses the schedule (``jobguard.pause_schedule``), so no tick is left queued when the
    workers stop. The console can resume it.
    """

    name = "schedule"
    EVERY = 2  # seconds between ticks: shop.tasks.clock_tick's "*/2 * * * * *"
    MIN_TICKS = 3  # a run too short to show ticks waits for them (the clock ticks every 2s)

    def __init__(self, others: list[Act]) -> None:
        self.others = others
        self.done = False

    def tick(self, demo: Demo) -> None:
        if self.done or not all(act.done for act in self.others):
            return
        jobs = _task_jobs(clock_tick)
        if Job.objects.exclude(task_name=clock_tick.name).filter(
            status__in=[JobStatus.QUEUED, JobStatus.RUNNING]
        ).exists() or (jobs.filter(status=JobStatus.SUCCEEDED).count() < self.MIN_TICKS):
            return
        approver = get_user_model().objects.get(username="approver")
        schedules.pause(Schedule.objects.get(name=clock_tick.name), user=approver)
        demo.note(f"paused the schedule {clock_tick.name} after {jobs.count()} ticks")
        self.done = True

    def proofs(self, demo: Demo) -> list[Proof]:
        prefix = f"schedule:{clock_tick.name}:"
        jobs = Job.objects.filter(idempotency_key__startswith=prefix)
        ticks = jobs.values("idempotency_key").annotate(n=Count("id"))
        most = ticks.aggregate(m=Max("n"))["m"] or 0
        succeeded = jobs.filter(status=JobStatus.SUCCEEDED).count()
        rows = ClockTick.objects.filter(tick_key__startswith=prefix).count()
        by_worker = dict(
            jobs.values("worker_id")
            .annotate(n=Count("id"))
            .order_by("worker_id")
            .values_list("worker_id", "n")
        )
        times = sorted(
            datetime.datetime.fromisoformat(key.removeprefix(prefix))
            for key in jobs.values_list("idempotency_key", flat=True)
        )
        # Two seconds apart, none skipped: the schedule ticked the whole time it ran.
        gaps = sum(1 for a, b in itertools.pairwise(times) if (b - a).total_seconds() != self.EVERY)
        first, last = (times[0].strftime("%H:%M:%S"), times[-1].strftime("%H:%M:%S")) if times else ("-", "-")
        spread = ", ".join(f"{worker} {n}" for worker, n in by_worker.items())
        return [
            Proof(
                "recurring job ticked on time, each tick enqueued once",
                f"{ticks.count()} ticks every {self.EVERY}s ({first} .. {last} UTC, {gaps} gaps), "
                f"{jobs.count()} jobs, at most {most} per tick key; {succeeded} succeeded, {rows} "
                f"tick rows; ran by {spread or 'nobody'}",
                ticks.count() >= self.MIN_TICKS
                and most == 1
                and gaps == 0
                and succeeded == jobs.count() == rows == ticks.count(),
                {
                    "ticks": ticks.count(),
                    "jobs": jobs.count(),
                    "max_jobs_per_tick": most,
                    "gaps": gaps,
                    "succeeded": succeeded,
                    "tick_rows": rows,
                    "ran_by": by_worker,
                },
            )
        ]


def build_acts(orders: int) -> list[Act]:
    """The acts in the order they start. Future acts (queue pause/resume from
    the console, the checklist checks, the REST API) are one more entry here."""
    order_act = Orders(orders)
    acts = [
        KilledWorker(order_act),
        order_act,
        ProducerResend(order_act),
        FlakyMail(),
        LockContention(order_act),
        AccountUpdates(),
        SlowExport(),
        NightlyReport(),
        DeadLetters(),
    ]
    return [*acts, RecurringJob(acts)]


def create_demo_users() -> dict[str, tuple[Any, str]]:
    """A requester and an approver for the console, with the passwords the demo prints."""
    from django.contrib.auth.models import Permission

    users = {}
    perms = {
        "requester": ["request_replay", "view_payload", "view_deadletter", "view_job"],
        "approver": [
            "approve_replay",
            "view_payload",
            "view_deadletter",
            "view_job",
            "view_lock",
            "pause_schedule",
            "view_schedule",
        ],
    }
    model = get_user_model()
    for name, codenames in perms.items():
        password = f"{name}-demo"
        user, _ = model.objects.get_or_create(username=name, defaults={"is_staff": True})
        user.is_staff = True
        user.set_password(password)
        user.save()
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="jobguard", codename__in=codenames)
        )
        users[name] = (model.objects.get(pk=user.pk), password)  # fresh: no cached permissions
    return users


def reset() -> None:
    """Start from an empty shop and an empty queue, so every figure is this run's."""
    from django_jobguard.models import Lock, ReplayEvent

    cache = caches[SUMMARIES]
    stale = [f"shop:order:{pk}:summary" for pk in Order.objects.values_list("pk", flat=True)]
    stale += [f"shop:account:{pk}:summary" for pk in Account.objects.values_list("pk", flat=True)]
    cache.delete_many(stale)
    # Schedule too: a row left by the last run would bring its old next tick (a missed tick);
    # the first worker to start writes it afresh.
    for model in (ReplayEvent, DeadLetter, Schedule, IdempotencyKey, Job, Lock):
        model.objects.all().delete()
    for model in (
        MailCall,
        SentReceipt,
        OrderSync,
        PackingStart,
        Shipment,
        Payment,
        ProviderCharge,
        ClockTick,
    ):
        model.objects.all().delete()
    for model in (Order, Account, Export, PartnerOrder):
        model.objects.all().delete()
