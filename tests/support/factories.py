"""Rows the tests share: users with permissions, dead letters, jobs in a given state, a clock.

Each factory writes real rows with the fewest fields the model needs; a test names what it is
about and leaves the rest to the defaults here. Dead letters made by a real failing run (a worker
dead-letters a charge) come from ``tests.support.dlq.dead_charge`` instead.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from django_jobguard.models import DeadLetter, Job
from tests.testapp import tasks

#: The task of the factories' dead letters: a charge, as in tests/testapp/tasks_dlq.py.
CHARGE = "tests.testapp.tasks_dlq.charge"
#: The worker id a running job made here carries (host:pid:suffix, as a worker's own).
WORKER_ID = "host-a:4242:abcdef"


# -- users -------------------------------------------------------------------------------------


def make_user(name: str, *codenames: str, staff: bool = True, password: str | None = None) -> User:
    """A user with these ``jobguard`` permissions (e.g. "view_job", "approve_replay").

    Staff unless ``staff=False`` (the admin lets only staff in). Without ``password`` the user
    has none: tests log in with ``client.force_login``. A misspelt codename fails here, not as a
    puzzling 403 later. The user is read back: ``has_perm`` caches what it saw first.
    """
    user = User.objects.create_user(name, password=password, is_staff=staff)
    if codenames:
        permissions = Permission.objects.filter(content_type__app_label="jobguard", codename__in=codenames)
        assert permissions.count() == len(set(codenames)), codenames
        user.user_permissions.add(*permissions)
    return User.objects.get(pk=user.pk)


def force_login(client: Client, name: str, *codenames: str) -> User:
    """Log a new staff user with these ``jobguard`` permissions in on ``client``; the user."""
    user = make_user(name, *codenames)
    client.force_login(user)
    return user


def make_superuser(name: str = "root", *, password: str | None = None) -> User:
    """A superuser: every permission, every page."""
    return User.objects.create_superuser(name, password=password)


# -- dead letters ------------------------------------------------------------------------------


def _letter_fields(job: Job | None, fields: dict[str, Any], failed_at: datetime.datetime) -> dict[str, Any]:
    """A permanent failure after one attempt, now; ``job`` names the task and the queue."""
    values: dict[str, Any] = {
        "job": job,
        "task_name": job.task_name if job else CHARGE,
        "queue_name": job.queue_name if job else "default",
        "attempts": 1,
        "max_attempts": 1,
        "reason": "permanent_error",
        "category": "permanent",
        "first_failed_at": failed_at,
        "last_failed_at": failed_at,
    }
    values.update(fields)
    return values


def make_dead_letter(job: Job | None = None, **fields: Any) -> DeadLetter:
    """One dead letter (of ``job`` if given, else of a charge), written as it is: no worker ran."""
    return DeadLetter.objects.create(**_letter_fields(job, fields, timezone.now()))


def make_dead_letters(
    count: int,
    *,
    kwargs: Callable[[int], dict[str, Any]] = lambda n: {"order_id": n, "amount": 0},
    failed_at: datetime.datetime | None = None,
    spread_seconds: float = 0.0,
    **fields: Any,
) -> list[DeadLetter]:
    """``count`` dead letters in one insert, read back in id order.

    The n-th carries ``kwargs(n)`` (by default order n with the amount 0, a charge the task
    refuses) and failed last ``n * spread_seconds`` after ``failed_at`` (default: now).
    """
    failed_at = failed_at or timezone.now()
    made = DeadLetter.objects.bulk_create(
        DeadLetter(
            **_letter_fields(
                None,
                {
                    "kwargs": kwargs(n),
                    "last_failed_at": failed_at + datetime.timedelta(seconds=n * spread_seconds),
                    **fields,
                },
                failed_at,
            )
        )
        for n in range(count)
    )
    if not made:
        return []
    if made[0].pk is None:  # databases that return no ids from a bulk insert (MySQL)
        return list(DeadLetter.objects.order_by("-id")[:count])[::-1]
    return list(DeadLetter.objects.filter(pk__range=(made[0].pk, made[-1].pk)).order_by("id"))


# -- jobs --------------------------------------------------------------------------------------

#: The states an operator tells apart (the job list's filter) that make_job() puts a job in;
#: not "waiting": only a workflow makes one (a step waiting on another).
JOB_STATES = ("due", "scheduled", "retrying", "running", "stuck", "succeeded", "dead", "cancelled")


def make_job(
    state: str = "due",
    *args: Any,
    task: Any = None,
    kwargs: dict[str, Any] | None = None,
    queue_name: str | None = None,
    **fields: Any,
) -> Job:
    """A job enqueued through ``task`` (default ``tests.testapp.tasks.add``), then put in ``state``.

    ``args`` and ``kwargs`` are the task's (default: ``add(1)``); ``fields`` override the row's
    columns last (e.g. ``last_error``). A running job holds a lease for another hour, a stuck
    one a lease that expired an hour ago; a scheduled or retrying one is due in an hour.
    """
    task = task or tasks.add
    kwargs = kwargs or {}
    if queue_name is not None:
        task = task.using(queue_name=queue_name)
    job = task.enqueue(*args, **kwargs) if args or kwargs else task.enqueue(1)
    now = timezone.now()
    hour = datetime.timedelta(hours=1)
    running = {
        "status": "running",
        "attempts": 1,
        "started_at": now,
        "lease_token": "t" * 32,
        "worker_id": WORKER_ID,
    }
    changes: dict[str, Any] = {
        "due": {},
        "scheduled": {"run_after": now + hour},
        "retrying": {"run_after": now + hour, "first_failed_at": now, "attempts": 1},
        "running": {**running, "lease_expires_at": now + hour},
        "stuck": {**running, "lease_expires_at": now - hour},
        "succeeded": {"status": "succeeded", "finished_at": now},
        "dead": {"status": "dead", "finished_at": now},
        "cancelled": {"status": "cancelled", "finished_at": now},
    }[state]
    changes.update(fields)
    if changes:
        Job.objects.filter(pk=job.pk).update(**changes)
    return Job.objects.get(pk=job.pk)


# -- time --------------------------------------------------------------------------------------


class Clock:
    """A clock that stands still until a test moves it: pass it as ``MemoryStore(now=clock)``."""

    def __init__(self, start: datetime.datetime | None = None) -> None:
        self.value = start or timezone.now()

    def __call__(self) -> datetime.datetime:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += datetime.timedelta(seconds=seconds)
