"""The new release of the Celery dual-run test: the same task through jobguard's ``shared_task``.

The idempotency key over the business identity collapses the repeats on jobguard's side; the
handler's check of the order covers the run Celery makes of the same order
(docs/how-to/move-from-celery.md, "Dual run").
"""

from django_jobguard.contrib.celery import shared_task

from . import dualrun


@shared_task(idempotency_key="charge:order:{order_id}")
def charge_order(order_id: int) -> str:
    return dualrun.charge_order(order_id, side="jobguard")
