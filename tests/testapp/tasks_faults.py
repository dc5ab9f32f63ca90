"""Tasks and the worker-side history recorder of the reliability suite (``tests/reliability``).

The probe tasks write, in the job's own transaction, one row to the un-keyed
``Execution`` table (raw executions, duplicates included) and one row to the
``LedgerEntry`` table whose unique ``effect_key`` is the idempotent effect.

When ``JOBGUARD_TEST_HISTORY`` names a file, a worker process appends one JSON line per
event to it: attempt starts and dead letters (from our signals) and every
``django_jobguard`` log record about a job (acks, stale acks, retries, lease losses...).
Each line is a single ``os.write`` on an ``O_APPEND`` descriptor, so it survives the
SIGKILLs the suite deals out.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import urllib.request
from typing import Any

from django.db import connection, transaction

from django_jobguard import PermanentError, TransientError, _faults, signals, task

from .models import Execution, Interval, LedgerEntry

#: The short test lease of the suite; heartbeats come every third of it.
LEASE_SECONDS = 5.0
#: Queue of every reliability task, so the suite's workers take nothing else.
QUEUE = "reliability"

_HISTORY_FD: int | None = None


def history_event(event: str, **fields: Any) -> None:
    """Append one event to this process's history file (no-op outside the suite)."""
    if _HISTORY_FD is None:
        return
    record = {"event": event, "t": time.time(), "pid": os.getpid(), **fields}
    os.write(_HISTORY_FD, (json.dumps(record, default=str) + "\n").encode())


class _HistoryHandler(logging.Handler):
    """Turns the worker's ``event key=value`` log records into history events."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            event = message.split(" ", 1)[0]
            fields: dict[str, Any] = {"message": message[:300]}
            for name in ("job_id", "attempt", "worker_id", "outcome", "job_type"):
                value = getattr(record, name, None)
                if value is not None:
                    fields[name] = value
            history_event(event, **fields)
        except Exception:
            self.handleError(record)


def _on_started(sender: Any, job_id: int, task_name: str, attempt: int, **kwargs: Any) -> None:
    history_event("start", job_id=job_id, job_type=task_name, attempt=attempt)


def _on_dead_lettered(sender: Any, dead_letter: Any, **kwargs: Any) -> None:
    history_event(
        "dead_letter",
        job_id=dead_letter.job_id,
        job_type=dead_letter.task_name,
        attempt=dead_letter.attempts,
        reason=dead_letter.reason,
        worker_id=dead_letter.worker_id,
    )


def _install_history(path: str) -> None:
    global _HISTORY_FD
    _HISTORY_FD = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    logging.getLogger("django_jobguard").addHandler(_HistoryHandler(level=logging.INFO))
    signals.job_started.connect(_on_started, dispatch_uid="reliability-history-started")
    signals.job_dead_lettered.connect(_on_dead_lettered, dispatch_uid="reliability-history-dead")
    history_event("process_started", argv=" ".join(sys.argv[-8:]))


if os.environ.get("JOBGUARD_TEST_HISTORY"):
    _install_history(os.environ["JOBGUARD_TEST_HISTORY"])


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def _execution(context: Any, marker: str) -> None:
    Execution.objects.create(
        marker=marker,
        job_id=context.job_id,
        attempt=context.attempt,
        worker=context.worker_id,
        pid=os.getpid(),
    )


@task(
    atomic=True,
    takes_context=True,
    queue_name=QUEUE,
    visibility_timeout=LEASE_SECONDS,
    max_attempts=25,
    retry={"base": 0.05, "max": 0.5, "jitter": 0.05},
)
def probe(context: Any, marker: str, seconds: float = 0.0, fail: str = "") -> str:
    """The probe: one raw execution and one ledger effect, committed with the ack or not at all.

    ``fail="first"`` raises a transient error on the first attempt (``first-retry-after-N``:
    asking for an N-second delay); ``fail="always"`` a permanent one (straight to the
    dead-letter queue).
    """
    _execution(context, marker)
    if _faults.ENABLED:
        _faults.maybe_crash("mid_task")
    if seconds:
        _sleep(seconds)
    if fail == "always":
        raise PermanentError(f"{marker}: refused for good")
    if fail == "first" and context.attempt == 1:
        raise TransientError(f"{marker}: first attempt fails")
    if fail.startswith("first-retry-after-") and context.attempt == 1:
        # Asks for a precise delay, so an early retry (a worker's own clock) would show.
        raise TransientError(f"{marker}: retry later", retry_after=float(fail.rsplit("-", 1)[1]))
    LedgerEntry.objects.create(effect_key=marker, job_id=context.job_id)
    return marker


@task(
    takes_context=True,
    queue_name=QUEUE,
    visibility_timeout=LEASE_SECONDS,
    max_attempts=25,
    retry={"base": 0.05, "max": 0.5, "jitter": 0.05},
)
def probe_external(context: Any, marker: str, url: str, seconds: float = 0.0) -> int:
    """The external-effect variant: not atomic, calls a provider with the job's idempotency key.

    Its execution row commits on its own (so redeliveries show up as raw executions); the
    provider must apply the effect once per key however often it is called.
    """
    _execution(context, marker)
    if _faults.ENABLED:
        _faults.maybe_crash("mid_task")
    if seconds:
        _sleep(seconds)
    body = json.dumps({"marker": marker, "amount": 1}).encode()
    request = urllib.request.Request(  # noqa: S310 - a loopback stub the test started
        url,
        data=body,
        method="POST",
        headers={"Idempotency-Key": context.idempotency_key or "", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback stub
        return int(json.loads(response.read())["charge"])


@task(atomic=True, takes_context=True, queue_name=QUEUE, visibility_timeout=LEASE_SECONDS, max_attempts=5)
def probe_stale(context: Any, marker: str, outcome: str = "complete") -> str:
    """First attempt: waits until its worker learns the lease was lost, then ends with ``outcome``.

    ``complete`` returns (a stale ack), ``retry`` raises a transient error (a stale retry),
    ``dead`` a permanent one (a stale dead-lettering). Later attempts just succeed. The
    ledger key names the attempt, so a stale effect that committed would show as its own row.
    """
    _execution(context, marker)
    if context.attempt == 1:
        deadline = time.monotonic() + 120
        while not context.lease_lost and time.monotonic() < deadline:
            time.sleep(0.05)
        history_event(
            "stale_attempt_end",
            job_id=context.job_id,
            attempt=context.attempt,
            outcome=outcome,
            lease_lost=context.lease_lost,
        )
        if outcome == "retry":
            raise TransientError(f"{marker}: stale attempt asks for a retry")
        if outcome == "dead":
            raise PermanentError(f"{marker}: stale attempt asks for the dead-letter queue")
    LedgerEntry.objects.create(effect_key=f"{marker}:{context.attempt}", job_id=context.job_id)
    return marker


@task(
    takes_context=True,
    queue_name=QUEUE,
    visibility_timeout=LEASE_SECONDS,
    lock="fc:{resource}",
    lock_ttl=3.0,
    max_attempts=80,
    retry={"base": 0.05, "max": 0.3, "jitter": 0.05},
)
def locked_increment(context: Any, resource: str, marker: str, hold: float = 0.05) -> int:
    """Read-modify-write on a fenced counter under the resource's lock (not atomic).

    Every access carries the lock's fencing token, as a fenced resource demands: the read
    registers the token (refused if a newer holder was seen), the write is accepted only
    while the token is still the newest. The write, its interval and its ledger row commit
    together, and the ledger's unique marker makes a retry after a refused ack a no-op.
    A refused access raises a transient error, so the job tries again with a new lock.
    """
    token = context.fencing_token or 0
    if LedgerEntry.objects.filter(effect_key=marker).exists():
        return -1  # applied by an earlier attempt whose ack was refused
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE testapp_fencedcounter SET last_fencing_token = %s "
            "WHERE resource = %s AND last_fencing_token <= %s RETURNING value",
            [token, resource, token],
        )
        row = cursor.fetchone()
    # The run's interval starts once the read has registered its token: that is where the
    # fenced section begins. Sampled before the read, a run that took the lock from a holder
    # Redis forgot could start microseconds before that holder's accepted write ended (its
    # read then waits for that commit), an overlap of the clock samples, not of the runs.
    started = time.time()
    if row is None:
        _refused(context, resource, token, "read")
    value = row[0]
    history_event("locked_read", job_id=context.job_id, resource=resource, token=token, value=value)
    _sleep(hold)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE testapp_fencedcounter SET value = %s WHERE resource = %s AND last_fencing_token = %s",
                [value + 1, resource, token],
            )
            accepted = cursor.rowcount == 1
        if accepted:
            Interval.objects.create(
                resource=resource, started=started, ended=time.time(), pid=os.getpid(), fencing_token=token
            )
            LedgerEntry.objects.create(effect_key=marker, amount=value + 1, job_id=context.job_id)
    if not accepted:
        _refused(context, resource, token, "write")
    return value + 1


def _refused(context: Any, resource: str, token: int, access: str) -> None:
    history_event(
        "fenced_access_refused", job_id=context.job_id, resource=resource, token=token, access=access
    )
    raise TransientError(f"{resource}: {access} with fencing token {token} refused (a newer holder was seen)")


# Poison: each must reach the dead-letter queue with its reason, after the right attempts.


@task(queue_name=QUEUE, visibility_timeout=LEASE_SECONDS, max_attempts=2)
def poison_kill() -> None:
    """Takes its worker down on every attempt: dead-lettered as lease_expired after 2."""
    os.kill(os.getpid(), 9)


@task(queue_name=QUEUE, visibility_timeout=LEASE_SECONDS, max_attempts=2, timeout=1.0)
def poison_hang() -> None:
    """Runs past its hard timeout on every attempt: dead-lettered as hard_timeout after 2."""
    _sleep(600)


@task(queue_name=QUEUE, visibility_timeout=LEASE_SECONDS, max_attempts=3)
def poison_object() -> object:
    """Returns something that is not JSON: dead-lettered as invalid_result at once."""
    return object()


@task(
    queue_name=QUEUE,
    visibility_timeout=LEASE_SECONDS,
    max_attempts=3,
    retry={"base": 0.05, "max": 0.2, "jitter": 0.05},
)
def poison_exit() -> None:
    """Raises SystemExit: a failing job (not a stop request), retries_exhausted after 3."""
    raise SystemExit(3)


@task(queue_name=QUEUE, visibility_timeout=LEASE_SECONDS, max_attempts=3)
def takes_one(value: int) -> int:
    """A healthy task whose stored payload the suite corrupts (undecodable payload)."""
    return value


#: Queue of the state-machine test (T13), which drives the service functions itself.
STATE_MACHINE_QUEUE = "reliability-sm"
#: Its lease: an hour, so that only the machine's own "expire" rule ends one. With a few
#: seconds, an example slowed by a loaded host saw real leases run out, and the reaper its
#: "expire" rule runs took those too, behind the model's back (failed CI once).
STATE_MACHINE_LEASE_SECONDS = 3600.0


@task(queue_name=STATE_MACHINE_QUEUE, visibility_timeout=STATE_MACHINE_LEASE_SECONDS, max_attempts=3)
def sm_job(value: int) -> int:
    """The job type of the T13 state machine (never run by a worker)."""
    return value
