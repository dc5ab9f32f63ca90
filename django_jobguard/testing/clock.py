"""``frozen_time()``: a clock a test moves by hand, so backoffs, delays and leases pass at once.

What "now" is depends on the path: due times and leases are compared with the **database's**
clock (``statement_timestamp()`` on PostgreSQL, ``strftime('now')`` on SQLite) inside the claim,
the reaper and the lock statements; schedules, idempotency keys and breakers are written with
Python's clock (``timezone.now()``). Neither can be set from a test, and they must agree. So the
clock moves the other way round: :meth:`FrozenClock.advance` moves every stored time of
django-jobguard's tables back by the step, which to both clocks is the same as that many
seconds passing. It works the same on SQLite, PostgreSQL and MariaDB/MySQL, and on the
in-memory store (whose clock it moves instead).

Moved: a job's ``run_after`` (delays, retries' backoff, a lock contention's wait), its lease
(the reaper takes back an expired one), its enqueue, start and finish times, idempotency keys'
expiry, database lock rows, schedules' next and last ticks, dead letters' and workflows' times,
flow-control rates and breakers. Not moved: anything outside the database (a Redis lock's TTL,
the cache, ``time.monotonic()`` in a running worker), and the real time a test takes.
"""

from __future__ import annotations

import datetime
import threading

from django.db.models import F, Q

from ..conf import get_settings
from .errors import ClockLeftRunningError, JobguardTestingError

__all__ = ["FrozenClock", "active_clocks", "frozen_time", "stop_all_clocks"]

#: The clocks started and not stopped yet, so a test's end can say that one was left running.
_active: list[FrozenClock] = []
_active_lock = threading.Lock()

#: model name -> the DateTimeFields moved back by an advance (the console's per-minute and
#: worker rows are left: their unique minutes would collide mid-update on PostgreSQL).
_DATETIME_FIELDS: dict[str, tuple[str, ...]] = {
    "Job": ("run_after", "lease_expires_at", "enqueued_at", "started_at", "finished_at", "first_failed_at"),
    "IdempotencyKey": ("created_at", "updated_at", "expires_at"),
    "DeadLetter": (
        "first_failed_at",
        "last_failed_at",
        "created_at",
        "replay_requested_at",
        "replay_decided_at",
        "replayed_at",
    ),
    "Lock": ("expires_at", "acquired_at"),
    "Schedule": ("paused_at", "next_tick_at", "last_tick_at", "removed_at", "created_at", "updated_at"),
    "Workflow": ("created_at", "closed_at", "finished_at"),
    "QueueState": ("changed_at",),
}
#: model name -> float columns holding seconds since the epoch (0 or NULL: unset, left alone).
_EPOCH_FIELDS: dict[str, tuple[str, ...]] = {
    "FlowRate": ("tat",),
    "Breaker": ("open_until", "half_open_since", "window_start", "budget_start"),
}


def _seconds(step: float | datetime.timedelta) -> float:
    seconds = step.total_seconds() if isinstance(step, datetime.timedelta) else step
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise JobguardTestingError(f"advance() takes seconds or a timedelta, not {step!r}")
    if seconds < 0:
        raise JobguardTestingError(f"advance() moves time forward only, not by {seconds} seconds")
    return float(seconds)


class FrozenClock:
    """Time that passes for django-jobguard's rows only when the test says so.

    Start it with ``with frozen_time() as clock:`` (or :meth:`start` and :meth:`stop`), then
    :meth:`advance` it. ``clock.advanced`` is the total moved so far, in seconds.
    """

    def __init__(self, *, using: str | None = None) -> None:
        #: The database alias whose rows it moves (None: ``JOBGUARD["DATABASE_ALIAS"]``).
        self.using = using
        #: Seconds moved so far.
        self.advanced = 0.0
        #: Whether it is started and not stopped.
        self.running = False

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<FrozenClock {state}, advanced {self.advanced:g} s>"

    @property
    def alias(self) -> str:
        return self.using or get_settings().database_alias

    def start(self) -> FrozenClock:
        """Start the clock (``with frozen_time()`` does); stop it with :meth:`stop`."""
        if self.running:
            raise JobguardTestingError("this frozen_time() clock is running already")
        self.running = True
        with _active_lock:
            _active.append(self)
        return self

    def stop(self) -> None:
        """Stop the clock. The rows keep the times it moved them to."""
        self.running = False
        with _active_lock:
            if self in _active:
                _active.remove(self)

    def __enter__(self) -> FrozenClock:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def advance(self, step: float | datetime.timedelta) -> None:
        """Let ``step`` seconds (or a timedelta) pass for every stored job, key, lock and schedule.

        In inline mode the jobs that became due run at once, as a worker would run them.
        """
        if not self.running:
            raise JobguardTestingError("advance() on a frozen_time() clock that is not running: start it")
        seconds = _seconds(step)
        if seconds == 0:
            return
        _move_rows(self.alias, seconds)
        self.advanced += seconds
        from . import modes  # the modes import the runner, which imports this module

        modes.clock_advanced(self.alias)


def _move_rows(alias: str, seconds: float) -> None:
    from .. import models
    from ._stores import memory_store_of, move_memory_back

    memory = memory_store_of(alias)
    if memory is not None:
        move_memory_back(memory, seconds)
        return
    step = datetime.timedelta(seconds=seconds)
    for name, fields in _DATETIME_FIELDS.items():
        model = getattr(models, name)
        model._default_manager.using(alias).update(**{field: F(field) - step for field in fields})
    for name, fields in _EPOCH_FIELDS.items():
        model = getattr(models, name)
        for field in fields:
            model._default_manager.using(alias).filter(Q(**{f"{field}__gt": 0})).update(
                **{field: F(field) - seconds}
            )


def frozen_time(*, using: str | None = None) -> FrozenClock:
    """A clock the test moves with ``clock.advance(seconds)``: ``with frozen_time() as clock:``.

    ``using`` is the database alias whose rows it moves (``JOBGUARD["DATABASE_ALIAS"]``).
    Without ``with``, :meth:`FrozenClock.start` it and :meth:`FrozenClock.stop` it before the
    test ends: one left running fails the test (:class:`ClockLeftRunningError`).
    """
    return FrozenClock(using=using)


def active_clocks() -> list[FrozenClock]:
    """The clocks started and not stopped, oldest first."""
    with _active_lock:
        return list(_active)


def stop_all_clocks() -> None:
    """Stop every running clock; :class:`ClockLeftRunningError` if there was one.

    The pytest plugin and :class:`~django_jobguard.testing.JobguardTestMixin` call it as a
    test ends: a clock left running would move the next test's rows too.
    """
    left = active_clocks()
    for clock in left:
        clock.stop()
    if left:
        raise ClockLeftRunningError(
            f"{len(left)} frozen_time() clock(s) still running at the end of the test ({left[0]!r}): "
            "use `with frozen_time() as clock:` or call clock.stop()"
        )
