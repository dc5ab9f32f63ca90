"""Helpers shared by the dead-letter tests: a worker burst, dead letters made by a worker.

Users with replay permissions come from tests/support/factories.py (``make_user``).
"""

from __future__ import annotations

from django_jobguard.models import DeadLetter, Job
from django_jobguard.worker import Worker
from tests.testapp import tasks_dlq


def run_burst(**options) -> int:
    """Drain what is due with a worker in this process (it redrives approved replays first)."""
    options.setdefault("concurrency", 2)
    return Worker(burst=True, install_signal_handlers=False, poll_interval=0.05, **options).run()


def dead_charge(order_id: int, amount: int = 0, key: str | None = None) -> DeadLetter:
    """A charge with a bad amount, run by a worker until it is dead-lettered (a permanent error)."""
    task = tasks_dlq.charge.using(idempotency_key=key) if key else tasks_dlq.charge
    job = task.enqueue(order_id=order_id, amount=amount)
    assert run_burst() == 0
    return DeadLetter.objects.get(job=job)


def replay_jobs() -> list[Job]:
    """Every job created by a replay."""
    return list(Job.objects.filter(replayed_from__isnull=False).order_by("id"))
