"""Circuit breakers of named limits: the outcomes that move them, and an operator's hand.

A named limit of ``JOBGUARD["LIMITS"]`` with a ``breaker`` guards one dependency (an API, a
mail relay) for every task that names it with ``@task(limit=...)``. Its state is a row of
:class:`~django_jobguard.models.Breaker`, so every worker on every host sees the same thing:

- **closed**: jobs run. Each attempt that ends is a *call*; a failure that says the
  dependency is unwell (a timeout, a connection error, an error the task declares transient
  or recoverable: :func:`is_failed_call`) is a failed call, while an unclassified error (bad
  input) is not. When a window holds ``min_calls`` calls of which at least ``failure_rate``
  failed, the breaker **opens**.
- **open**: the limited claim leaves the dependency's jobs queued, so no attempt is started
  or charged, until ``open_for`` seconds have passed; then the next claim **half-opens** it.
- **half-open**: the claim admits ``probes`` attempts. The first that succeeds (or fails
  permanently: the dependency answered) closes the breaker; the first that fails transiently
  opens it again for ``open_for``.

An operator may open a breaker by hand (it stays open until closed by hand) or close it;
each change, by the fleet or by an operator, appends a
:class:`~django_jobguard.models.BreakerEvent` (who, when, why), is logged on the
``django_jobguard.breakers`` logger and counted in ``jobguard_breaker_transitions_total``.
The claim side (admission, probes, the retry budget) is in ``flow/admission.py``, its SQL in
``store/flow_sql.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models.functions import Now

from . import events, retry, store
from .actors import User
from .conf import BreakerSpec, get_settings
from .exceptions import BreakerError, BreakerPermissionDenied
from .models import Breaker, BreakerEvent, BreakerState

if TYPE_CHECKING:
    from .task import Task

logger = logging.getLogger("django_jobguard.breakers")

__all__ = [
    "PERMISSION",
    "SUCCESSES_HELD_SECONDS",
    "BreakerChange",
    "HeldSuccesses",
    "can_operate",
    "close",
    "is_failed_call",
    "open_breaker",
    "record",
    "report_change",
    "state_value",
]

#: The permission opening and closing by hand needs (``Breaker.Meta.permissions``).
PERMISSION = "jobguard.operate_breaker"
#: The longest reason an operator's change may carry.
MAX_REASON_LENGTH = 500
#: Why a reason with a NUL character is refused (PostgreSQL cannot store one in text).
NUL_IN_REASON = "A reason may not hold a NUL character (\\x00): the database cannot store it."
#: The gauge value of each state (``jobguard_breaker_state``).
STATE_VALUES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}
#: Outcome categories that may count as a failed call (see :func:`is_failed_call`).
FAILED_CATEGORIES = frozenset({retry.TRANSIENT, retry.RECOVERABLE})
#: Errors that mean the dependency did not answer (in time), whatever the task declares:
#: timeouts (a handler past its timeout too), refused, reset and broken connections, name lookups.
DEPENDENCY_ERRORS: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionError,
    socket.gaierror,
    socket.herror,
)


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerChange:
    """What :func:`open_breaker` or :func:`close` did."""

    name: str
    state: str
    #: False when the breaker already was in that state (nothing written).
    changed: bool
    changed_by: str
    reason: str


#: Seconds a closed breaker's successes are gathered before they are counted (:class:`HeldSuccesses`).
SUCCESSES_HELD_SECONDS = 1.0


class HeldSuccesses:
    """The successes of closed breakers, gathered per limit and counted with its next count.

    A transaction per success would make a breaker's row the fleet's busiest. A failure is
    counted at once (it may open the breaker), and so is any outcome while the breaker is not
    closed (a probe's answer closes or reopens it). Gathered successes lost in a crash only
    delay a trip. Not thread-safe: the worker's completer and the outbox relay call it under
    their own locks.
    """

    def __init__(self, hold_seconds: float = SUCCESSES_HELD_SECONDS) -> None:
        self.hold_seconds = hold_seconds
        self._count: dict[str, int] = {}
        self._since: dict[str, float] = {}

    def take(self, name: str, *, failed: bool, closed: bool, now: float) -> int | None:
        """None if this outcome is gathered (nothing to write now); else the earlier successes
        to count with it (in :func:`record`'s ``earlier_successes``)."""
        held = self._count.get(name, 0)
        if not failed and closed and now - self._since.get(name, now) < self.hold_seconds:
            self._count[name] = held + 1
            self._since.setdefault(name, now)
            return None
        self._count.pop(name, None)
        self._since.pop(name, None)
        return held


def is_failed_call(
    error: BaseException | None, category: str, task: Task[Any, Any] | None, spec: BreakerSpec
) -> bool:
    """Whether an attempt that failed with ``error`` (classified ``category``) says the dependency is unwell.

    Only such failures count toward a breaker: a timeout or connection error
    (:data:`DEPENDENCY_ERRORS`), one of the breaker's ``failures`` classes, or an error the task
    declares transient or recoverable (``retry_on`` / ``recoverable_on``, or a ``TransientError``
    / ``RecoverableError`` raised by the handler). An error nobody classified (a ``ValueError``
    from bad input) fails its job but is not a failed call: otherwise anyone who may enqueue
    could open the breaker for every tenant with a handful of bad requests. A permanent failure
    never counts (the dependency answered).
    """
    if error is None or category not in FAILED_CATEGORIES:
        return False
    if isinstance(error, DEPENDENCY_ERRORS) or (spec.failures and isinstance(error, spec.failures)):
        return True
    return retry.declared_category(error, task) in FAILED_CATEGORIES


def state_value(state: str) -> int:
    """0 closed, 1 half-open, 2 open."""
    return STATE_VALUES.get(BreakerState(state), 0)


def can_operate(user: User | None) -> bool:
    """Whether ``user`` may open and close breakers by hand."""
    return bool(user is not None and user.is_authenticated and user.has_perm(PERMISSION))


def _row(alias: str, name: str) -> tuple[Breaker, float]:
    """The breaker's row, created closed if missing, locked to the transaction's end; and the
    database clock, read by the same statement (seconds since the epoch)."""
    locked = Breaker.objects.using(alias).select_for_update().annotate(db_now=Now()).filter(name=name)
    row = locked.first()
    if row is None:
        Breaker.objects.using(alias).get_or_create(name=name)
        row = locked.get()
    return row, row.db_now.timestamp()


def report_change(name: str, from_state: str, to_state: str, actor: str, reason: str) -> None:
    """Log a state change and count it (``jobguard_breaker_transitions_total``), once it committed."""
    events.emit(events.BreakerChanged(name, from_state, to_state))
    level = logging.WARNING if to_state == BreakerState.OPEN else logging.INFO
    logger.log(
        level,
        "breaker_%s limit=%s from=%s by=%r reason=%r",
        to_state,
        name,
        from_state,
        actor,
        reason or "-",
        extra={"limit": name, "from_state": from_state, "to_state": to_state, "actor": actor},
    )


class _NeedsTurnError(Exception):
    """The outcome moves the breaker: run the count again, this time in the claims' turn."""


def record(alias: str, name: str, spec: BreakerSpec, *, failed: bool, earlier_successes: int = 0) -> None:
    """Count one call of the dependency ``name`` and move its breaker if that decides it.

    Called by the worker after an attempt's outcome is written (success, retry or dead
    letter), outside the job's transaction: a count lost to a crash only delays a trip. A
    count that moves the breaker is written in the limited claims' turn (taken before the
    row), so once it commits no claim that read the old state can still lease a job.
    """

    # Each count is a whole transaction: on MariaDB/MySQL a deadlock runs it again (retrying).
    def count(in_turn: bool) -> tuple[str, str, str] | None:
        return _count(alias, name, spec, failed, earlier_successes, in_turn=in_turn)

    try:
        change = store.retrying(alias, "breaker_count", lambda: count(False))
    except _NeedsTurnError:
        change = store.retrying(alias, "breaker_count", lambda: count(True))
    if change is not None:
        report_change(name, change[0], change[1], "system", change[2])


def _count(
    alias: str, name: str, spec: BreakerSpec, failed: bool, earlier: int, *, in_turn: bool
) -> tuple[str, str, str] | None:
    """One count in one transaction; ``(from, to, reason)`` if the breaker moved."""
    with transaction.atomic(using=alias):
        if in_turn:
            store.take_flow_turn(alias)
        else:
            # A count lost to a crash only delays a trip: this commit need not wait for the
            # disk. A change of state (in the turn) does, for its audit row.
            store.asynchronous_commit(alias)
        row, now = _row(alias, name)
        if now - row.window_start >= spec.window:
            row.window_start, row.calls, row.failures = now, 0, 0
        row.calls += 1 + earlier
        row.failures += int(failed)
        fields = ["window_start", "calls", "failures"]
        before, after, reason = row.state, "", ""
        if row.manual:
            pass  # held by an operator: the counts go on, the state does not move
        elif before == BreakerState.CLOSED:
            if row.calls >= spec.min_calls and row.failures >= spec.failure_rate * row.calls:
                after = BreakerState.OPEN
                reason = (
                    f"{row.failures} of {row.calls} calls failed within {spec.window:g}s "
                    f"(threshold {spec.failure_rate:.0%} of at least {spec.min_calls})"
                )
        elif before == BreakerState.HALF_OPEN:
            after = BreakerState.OPEN if failed else BreakerState.CLOSED
            reason = "a probe failed" if failed else "a probe succeeded"
        if not after:
            row.save(using=alias, update_fields=fields)
            return None
        if not in_turn:
            raise _NeedsTurnError
        _move(row, after, now + spec.open_for if after == BreakerState.OPEN else None, reason, fields)
        if after == BreakerState.CLOSED:
            row.window_start, row.calls, row.failures = now, 0, 0
        row.save(using=alias, update_fields=fields)
        BreakerEvent.objects.using(alias).create(
            name=name, from_state=before, to_state=after, actor_name="system", reason=reason
        )
    return before, after, reason


def _move(row: Breaker, state: str, open_until: float | None, reason: str, fields: list[str]) -> None:
    row.state, row.open_until, row.probes, row.half_open_since = state, open_until, 0, None
    row.reason, row.changed_by_name, row.changed_at = reason, "system", Now()
    fields += ["state", "open_until", "probes", "half_open_since", "reason", "changed_by_name", "changed_at"]


def _guarded(name: str) -> BreakerSpec:
    limit = get_settings().limits.get(name)
    if limit is None or limit.breaker is None:
        known = ", ".join(sorted(n for n, lim in get_settings().limits.items() if lim.breaker)) or "none"
        raise BreakerError(
            f"No breaker is named {name!r}: JOBGUARD['LIMITS'] declares breakers for: {known}."
        )
    return limit.breaker


def open_breaker(
    name: str, *, user: User | None = None, actor: str = "", reason: str, using: str | None = None
) -> BreakerChange:
    """Open ``name``'s breaker by hand: its jobs wait until an operator closes it.

    ``user`` (from the admin or the API) needs ``jobguard.operate_breaker``; trusted callers
    (a management command) pass ``user=None`` and name themselves in ``actor``. A reason is
    required: it goes into the audit trail.
    """
    return _change(name, BreakerState.OPEN, user=user, actor=actor, reason=reason, using=using)


def close(
    name: str, *, user: User | None = None, actor: str = "", reason: str = "", using: str | None = None
) -> BreakerChange:
    """Close ``name``'s breaker by hand: its jobs are claimed at the next poll; its counts start over."""
    return _change(name, BreakerState.CLOSED, user=user, actor=actor, reason=reason, using=using)


def _change(
    name: str, state: str, *, user: User | None, actor: str, reason: str, using: str | None
) -> BreakerChange:
    verb = "open" if state == BreakerState.OPEN else "close"
    if user is not None and not can_operate(user):
        raise BreakerPermissionDenied(
            f"You may not {verb} breakers: that needs the {PERMISSION!r} permission."
        )
    _guarded(name)
    reason = (reason or "").strip()
    if state == BreakerState.OPEN and not reason:
        raise BreakerError("A reason is required to open a breaker: it goes into the audit trail.")
    if len(reason) > MAX_REASON_LENGTH:
        raise BreakerError(f"A reason is at most {MAX_REASON_LENGTH} characters, not {len(reason)}.")
    if "\x00" in reason:
        raise BreakerError(NUL_IN_REASON)
    alias = using or get_settings().database_alias
    who = (user.get_username() if user is not None else actor or "system")[:150]
    actor_pk = user.pk if user is not None and user.is_authenticated else None
    manual = state == BreakerState.OPEN

    def run() -> tuple[str, BreakerChange | None]:
        """The state before, and what to return at once if nothing changed."""
        with transaction.atomic(using=alias):
            store.take_flow_turn(alias)  # as an outcome's trip does: see record()
            row, now = _row(alias, name)
            before = row.state
            if before == state and row.manual == manual:
                return before, BreakerChange(name, before, False, row.changed_by_name, row.reason)
            row.state, row.manual, row.open_until, row.probes = state, manual, None, 0
            row.half_open_since, row.window_start, row.calls, row.failures = None, now, 0, 0
            row.changed_by_name, row.reason, row.changed_at = who, reason, Now()
            row.save(using=alias)
            BreakerEvent.objects.using(alias).create(
                name=name, from_state=before, to_state=state, actor_id=actor_pk, actor_name=who, reason=reason
            )
        return before, None

    # One transaction, run again after a deadlock on MariaDB/MySQL.
    before, unchanged = store.retrying(alias, "breaker_change", run)
    if unchanged is not None:
        return unchanged
    report_change(name, before, state, who, reason)
    return BreakerChange(name, state, True, who, reason)
