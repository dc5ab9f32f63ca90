"""A tasks module written as for Celery; only the import line differs.

from celery import Celery, shared_task   # before
"""

from django_jobguard.contrib.celery import Celery, shared_task

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

#: What the tasks saw, for the tests to read (one process: the worker runs in the test's).
seen: list[dict] = []


class FlakyService(ConnectionError):
    pass


@app.task
def add(x, y):
    return x + y


@shared_task
def mul(x, y):
    return x * y


@shared_task
def tsum(numbers):
    return sum(numbers)


@shared_task(bind=True, max_retries=5, default_retry_delay=0)
def poll_until_ready(self, wanted_retries):
    seen.append({"id": self.request.id, "retries": self.request.retries, "name": self.name})
    if self.request.retries < wanted_retries:
        raise self.retry(countdown=0)
    return self.request.retries


@shared_task(bind=True, max_retries=1)
def gives_up(self):
    try:
        raise FlakyService("still down")
    except FlakyService as exc:
        raise self.retry(exc=exc, countdown=0) from exc


@shared_task(autoretry_for=(FlakyService,), max_retries=2, retry_backoff=False, retry_kwargs={"countdown": 0})
def always_down():
    seen.append({"task": "always_down"})
    raise FlakyService("the partner is down")


@shared_task(autoretry_for=(FlakyService,), max_retries=2)
def broken():
    seen.append({"task": "broken"})
    raise ValueError("a bug, not an outage")


@shared_task(ignore_result=True)
def fire_and_forget(n):
    seen.append({"task": "fire_and_forget", "n": n})
    return n


@shared_task(max_retries=None)
def forever():
    return None


@shared_task(bind=True)
def import_rows(self, rows):
    for done in range(1, rows + 1):
        self.update_state(state="PROGRESS", meta={"current": done, "total": rows})
    return rows


@shared_task(idempotency_key="charge:order:{order_id}")
def charge(order_id):
    seen.append({"task": "charge", "order_id": order_id})
    return order_id
