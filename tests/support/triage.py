"""The shape of the round-3 console incident, in real rows, for the triage page's tests.

Three queues in trouble among healthy ones: ``flow-dep`` waits behind an open breaker (its
jobs due for 16 minutes), ``accounts`` has a job put back 1,074 times on lock ``account:999``
whose holder is gone (the lock row names that job's earlier claim, on a killed worker), and
``emails`` dead-letters. The healthy queues have a live worker and a few succeeded jobs.
"""

from __future__ import annotations

import datetime

from django.utils import timezone

from django_jobguard import store
from django_jobguard.conf import get_settings
from django_jobguard.locks import holders
from django_jobguard.models import Breaker, Job, Lock, WorkerBeat
from tests.support.factories import make_dead_letter
from tests.testapp import tasks, tasks_flow

#: The breaker of tests/settings.py's ``flow-dep`` limit, and its queue.
BREAKER = "flow-dep"
#: The queues in trouble, and the healthy ones around them (13 in all, as in the incident).
TROUBLED = ("flow-dep", "accounts", "emails")
HEALTHY = tuple(f"q{n:02d}-healthy" for n in range(10))
LOCK_KEY = "account:999"
CONTENTIONS = 1074


def live_worker(worker_id: str = "web-1:4001:live", queues: str = "*") -> WorkerBeat:
    now = timezone.now()
    return WorkerBeat.objects.create(
        worker_id=worker_id,
        host="web-1",
        pid=4001,
        queues=queues,
        concurrency=8,
        started_at=now,
        last_beat_at=now,
    )


def open_breaker(probe_in: float = 65.0, waiting: int = 4, waited: float = 16 * 60) -> None:
    """The breaker opened by the fleet, half-opening in ``probe_in`` s, ``waiting`` jobs due."""
    for n in range(waiting):
        tasks_flow.call_dependency.enqueue(n)
    Job.objects.filter(queue_name=BREAKER).update(
        run_after=timezone.now() - datetime.timedelta(seconds=waited)
    )
    now = store.database_now(get_settings().database_alias).timestamp()
    Breaker.objects.update_or_create(
        name=BREAKER,
        defaults={
            "state": "open",
            "open_until": now + probe_in,
            "manual": False,
            "changed_by_name": "system",
            "reason": "12 of 20 calls failed within 10s",
        },
    )


#: The lease token of the claim a killed worker held (the job was put back since).
DEAD_CLAIM = "f" * 32


def lock_owner(job_id: int, lease_token: str) -> str:
    """The owner token a worker writes on the lock it takes for job ``job_id``'s claim."""
    return f"{holders.job_owner(job_id, lease_token)}.{'0' * 16}"


def contended_lock(queue: str = "accounts", held_for: float = 600.0) -> Job:
    """A job put back :data:`CONTENTIONS` times on a lock whose row a dead worker's token holds."""
    job = tasks.add.using(queue_name=queue).enqueue(1)
    Job.objects.filter(pk=job.pk).update(
        lock_key=LOCK_KEY,
        lock_contentions=CONTENTIONS,
        enqueued_at=timezone.now() - datetime.timedelta(minutes=9),
        run_after=timezone.now() - datetime.timedelta(seconds=2),
    )
    now = timezone.now()
    Lock.objects.update_or_create(
        key=get_settings().locks.prefix + LOCK_KEY,
        defaults={
            # Taken by this job's earlier claim, on the worker that was killed; the reaper put
            # the job back since, so that claim can neither finish nor release it.
            "token": lock_owner(job.pk, DEAD_CLAIM),
            "expires_at": now + datetime.timedelta(seconds=held_for),
            "acquired_at": now - datetime.timedelta(minutes=10),
            "fencing_token": 7,
        },
    )
    job.refresh_from_db()
    return job


def dead_letters(queue: str = "emails", count: int = 3) -> None:
    """``count`` jobs that ended dead in the last hour, each with its dead letter."""
    now = timezone.now()
    for n in range(count):
        job = tasks.add.using(queue_name=queue).enqueue(n)
        Job.objects.filter(pk=job.pk).update(status="dead", finished_at=now, attempts=5, last_error="boom")
        make_dead_letter(job, attempts=5, max_attempts=5, reason="retries_exhausted", category="transient")


def healthy(queues: tuple[str, ...] = HEALTHY) -> None:
    now = timezone.now()
    for name in queues:
        job = tasks.add.using(queue_name=name).enqueue(0)
        Job.objects.filter(pk=job.pk).update(status="succeeded", finished_at=now, attempts=1)


def incident() -> None:
    """The whole shape: a live worker, the three troubled queues and ten healthy ones."""
    live_worker()
    healthy()
    open_breaker()
    contended_lock()
    dead_letters()
