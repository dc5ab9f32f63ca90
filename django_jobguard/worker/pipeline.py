"""One claimed job, start to finish, as the article's flow; :func:`run` returns its outcome.

resolve the task → validate the payload (a bad one is a permanent failure) → idempotency
check → take the lock → transaction (when atomic) → handler → ack → on error classify
(retry with backoff, or dead-letter) → release the lock. Each step is a function below;
nothing here reports an outcome: :class:`~.completer.Completer` does, from the value returned.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import time
import traceback
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError

from .. import _dispatch, _faults, idempotency, locks, retry, signals, store
from .._json import normalize_json
from .._redact import payload_secrets, redact
from .._text import clip
from ..conf import RetryPolicy, get_settings
from ..context import JobContext
from ..encryption import JSON_MARKER, DecryptionError
from ..encryption.payloads import ARGS, KWARGS, RESULT, open_json, seal_json_text, seals
from ..exceptions import InvalidArgumentsError, LeaseLost, LockNotAcquired, LockUnavailable
from ..locks.holders import job_owner
from ..log import job_fields
from ..models import DeadLetterReason
from ..outcome import Dead, Duplicate, HeldState, Outcome, PutBack, PutBackCause, Retry, Stale, Succeeded
from ..registry import registry, unknown_task_error
from ..task import Task
from .completer import Completer
from .held import Held, logger
from .leases import renew_lock, write_last_progress

__all__ = ["HandlerTimedOut", "Runtime", "failure_outcome", "handler_outcome", "prepare", "run"]

#: Argument shapes remembered as valid per worker (binding is checked once per shape).
MAX_REMEMBERED_SHAPES = 10_000
#: A job put back on lock contention waits CONTENTION_DELAY plus up to this fraction of it,
#: so the jobs of one busy key do not all come back at the same instant.
CONTENTION_JITTER_FRACTION = 0.5

_STALE_ACK = Stale("ack")


@dataclasses.dataclass(eq=False)
class Runtime:
    """What the pipeline needs of the worker running it."""

    alias: str
    worker_id: str
    completer: Completer
    #: (task, positional count, keyword names) known to bind, so each shape is checked once.
    valid_shapes: set[tuple[str, int, tuple[str, ...]]] = dataclasses.field(default_factory=set)
    #: Calls the handler (None: :func:`invoke`); the async executor's DB threads give their own.
    invoke: Callable[[Task[Any, Any], JobContext | None, store.ClaimedJob], Any] | None = None


class HandlerTimedOut(TimeoutError):  # noqa: N818 (named as the event, like LeaseLost)
    """A coroutine handler ran past its task's hard ``timeout`` and was cancelled."""


class _InvalidResultError(Exception):
    """The handler returned something that cannot be stored as JSON."""

    #: The error class its dead letter records.
    error_class = "TypeError"


class _ResultTooLargeError(_InvalidResultError):
    """The handler's return value takes more bytes as JSON than its limit allows."""

    error_class = "ValueError"


class _LockLostError(Exception):
    """The job's lock could not be renewed: its writes must not commit."""


class _AckStatementLostError(Exception):
    """An atomic job's ack met a prepared statement a pooler had lost: all of it rolled back."""


def run(held: Held, rt: Runtime) -> Outcome:
    """Run one claimed job (its state already ``RUNNING``); what became of it, not yet reported."""
    step = prepare(held, rt)
    if not isinstance(step, tuple):
        return step
    return run_handler(rt, held, *step)


def prepare(held: Held, rt: Runtime) -> Outcome | tuple[Task[Any, Any], str]:
    """The steps before the handler: the task and the key's scope to run with, or the outcome instead.

    Only the idempotency check and the lock touch a store: a job with neither key runs these
    steps without any I/O (the async executor runs them on its event loop then).
    """
    job = held.job
    task = resolve_task(job.task_name)
    if task is None:
        return Dead(
            DeadLetterReason.UNKNOWN_TASK,
            retry.PERMANENT,
            "UnknownTaskError",
            unknown_task_error(job.task_name),
        )
    invalid = (
        open_payload(job, task)
        or check_flow_keys(job, task)
        or validate_payload(job, task, rt.valid_shapes)
        or check_rate_key(job, task)
    )
    if invalid is not None:
        return invalid
    scope = ""
    if job.idempotency_key:
        scope = idempotency.scope_of(task)
        skipped = check_idempotency(rt, job, task, scope)
        if skipped is not None:
            return skipped
    if job.lock_key:
        refused = take_lock(held, task)
        if refused is not None:
            return refused
    return task, scope


# -- steps before the handler ------------------------------------------------------------


def resolve_task(name: str) -> Task[Any, Any] | None:
    """The task to run for this name: registered, or found by a resolver (see the registry)."""
    return registry.resolve(name)


def open_payload(job: store.ClaimedJob, task: Task[Any, Any]) -> Dead | None:
    """Decrypt encrypted arguments in place, and say whether the run's data is stored sealed.

    A job whose arguments cannot be decrypted (their key is not configured, or the stored
    ciphertext was altered) never runs on garbage: it is dead-lettered as permanent, its
    error naming the key, and its stored payload is left as it is (a replay works once the
    key is back). Its error holds no payload, so it is stored in clear.
    """
    # Sealed arguments are an object holding the marker; other objects in args are malformed
    # payloads, which the argument check dead-letters as such (in clear).
    args, kwargs = job.args, job.kwargs
    encrypted = (isinstance(args, dict) and JSON_MARKER in args) or (
        isinstance(kwargs, dict) and JSON_MARKER in kwargs
    )
    if not encrypted and not task.encrypt and not get_settings().encryption.all_tasks:
        return None  # the plain path: one cached attribute read
    if not encrypted and store.memory_store() is not None:
        return None  # the in-memory store (tests only) keeps every value in clear
    try:
        sealed = encrypted or seals(task, get_settings())
        if encrypted:
            job.args = open_json(job.args, ARGS, "job.args")
            job.kwargs = open_json(job.kwargs, KWARGS, "job.kwargs")
    except (DecryptionError, ImproperlyConfigured) as exc:
        return Dead(
            DeadLetterReason.INVALID_PAYLOAD,
            retry.PERMANENT,
            f"{type(exc).__module__}.{type(exc).__qualname__}",
            str(exc),
            scope=idempotency.scope_of(task),
        )
    job.sealed = sealed
    return None


def validate_payload(
    job: store.ClaimedJob, task: Task[Any, Any], valid_shapes: set[tuple[str, int, tuple[str, ...]]]
) -> Dead | None:
    """Dead-letter arguments the handler cannot take (a permanent failure); None if they bind.

    Whether arguments bind depends only on how many are positional and which are named, so
    each shape is checked once per worker. A stored string or number (not a JSON list and
    object) would otherwise be unpacked character by character.
    """
    shape = (
        (job.task_name, len(job.args), tuple(sorted(job.kwargs)))
        if isinstance(job.args, list) and isinstance(job.kwargs, dict)
        else None
    )
    if shape is not None and shape in valid_shapes:
        return None
    try:
        if shape is None:
            raise InvalidArgumentsError(
                f"stored arguments of job {job.id} are not a JSON list and object "
                f"(args: {type(job.args).__name__}, kwargs: {type(job.kwargs).__name__})"
            )
        task.bind(job.args, job.kwargs)
    except InvalidArgumentsError as exc:
        return Dead(
            DeadLetterReason.INVALID_PAYLOAD,
            retry.PERMANENT,
            "InvalidArgumentsError",
            str(exc),
            scope=idempotency.scope_of(task),
        )
    if len(valid_shapes) >= MAX_REMEMBERED_SHAPES:
        valid_shapes.clear()
    valid_shapes.add(shape)
    return None


def check_rate_key(job: store.ClaimedJob, task: Task[Any, Any]) -> Dead | None:
    """Dead-letter a job whose keyed rate's key the rate table cannot hold; None otherwise.

    Enqueue refuses such a key; a job stored before it did (or written by hand) is leased by
    the claim without rate state for that key, and never runs: its limit cannot be kept.
    """
    if task.rate is None or task.rate.key is None:
        return None
    try:
        task.rate_key_for(task.bind(job.args, job.kwargs))
    except InvalidArgumentsError as exc:
        return Dead(
            DeadLetterReason.INVALID_PAYLOAD,
            retry.PERMANENT,
            "InvalidArgumentsError",
            f"its rate cannot be kept, so it was never run: {exc}",
            scope=idempotency.scope_of(task),
        )
    return None


def check_flow_keys(job: store.ClaimedJob, task: Task[Any, Any]) -> Dead | None:
    """Dead-letter a job whose stored flow keys are not a list of strings; None otherwise.

    Enqueue stores a JSON array of strings; a row written by hand, through the ORM or by an
    older release may hold anything else. The limited claim leases such a job counted under
    none of its keyed limits (rather than fail every claim of its queue) and marks it: it
    never runs, since its limits cannot be kept.
    """
    if job.unreadable_flow_keys is None:
        return None
    return Dead(
        DeadLetterReason.INVALID_PAYLOAD,
        retry.PERMANENT,
        "InvalidArgumentsError",
        "its flow keys are not a list of strings, so its limits cannot be kept and it was never "
        f"run: {job.unreadable_flow_keys}",
        scope=idempotency.scope_of(task),
    )


def check_idempotency(rt: Runtime, job: store.ClaimedJob, task: Task[Any, Any], scope: str) -> Outcome | None:
    """A keyed job whose action succeeded already, is owned by another job, or conflicts; None to run."""
    key = job.idempotency_key or ""  # run() calls this for keyed jobs only
    decision = idempotency.begin_execution(rt.alias, task, job.id, key, job.args, job.kwargs)
    if decision.action == idempotency.RUN:
        return None
    if decision.action == idempotency.CONFLICT:
        return Dead(
            DeadLetterReason.PERMANENT_ERROR,
            retry.PERMANENT,
            "django_jobguard.exceptions.IdempotencyConflict",
            decision.message,
            scope=scope,
        )
    if decision.action == idempotency.WAIT:
        # Like a taken lock: back in the queue without using an attempt.
        return PutBack(PutBackCause.IDEMPOTENCY_WAIT, get_settings().locks.contention_delay)
    return Duplicate(decision.result, scope)


def take_lock(held: Held, task: Task[Any, Any]) -> Outcome | None:
    """Acquire the job's lock (None); on contention or outage, the job goes back unrun.

    Neither case uses up an attempt: the handler did not run.
    """
    job = held.job
    conf = get_settings().locks
    try:
        # The claim owns the lock: its owner token names the job, so the lock names its holder.
        owner = job_owner(job.id, job.lease_token)
        handle = locks.lock(job.lock_key, ttl=task.lock_ttl or conf.ttl, owner=owner)
    except ValueError as exc:
        return Dead(
            DeadLetterReason.INVALID_PAYLOAD,
            retry.PERMANENT,
            "ValueError",
            str(exc),
            scope=idempotency.scope_of(task),
        )
    try:
        acquired = handle.acquire(blocking=False)
    except LockUnavailable as exc:
        # The handler never runs unlocked, and no attempt is used: an outage of the lock
        # store says nothing about the job, and must not dead-letter every locked job.
        delay = retry.backoff(retry.policy_for(task, job.queue_name, retry.TRANSIENT), job.attempts)
        error = f"{LockUnavailable.__module__}.LockUnavailable: {exc}"
        return PutBack(PutBackCause.LOCK_UNAVAILABLE, delay, error, exc)
    if not acquired:
        jitter = conf.contention_delay * CONTENTION_JITTER_FRACTION
        policy = RetryPolicy(base=conf.contention_delay, max=conf.contention_delay, jitter=jitter)
        return PutBack(PutBackCause.LOCK_CONTENDED, retry.backoff(policy, 1))
    held.lock = handle
    held.lock_renewed_at = time.monotonic()
    return None


# -- the handler, its transaction and its ack ---------------------------------------------


def run_handler(rt: Runtime, held: Held, task: Task[Any, Any], scope: str) -> Outcome:
    """Run the handler (in a transaction when atomic) and ack; release the lock; classify errors."""
    job = held.job
    if task.timeout and not held.on_loop:  # a coroutine's own timeout cancels it instead
        held.deadline = held.started_at + task.timeout
    context = make_context(rt, held, task) if task.takes_context else None
    _dispatch.send(signals.job_started, job_id=job.id, task_name=job.task_name, attempt=job.attempts)
    began = time.perf_counter()
    try:
        try:
            result, ack_json = _invoke_and_ack(rt, held, task, context, scope)
        finally:
            release_lock(held, rt.worker_id)
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        # SystemExit from a handler is a failing job, not a request to stop the worker.
        return handler_outcome(job, task, exc, time.perf_counter() - began)
    return Succeeded(result, time.perf_counter() - began, ack_json, scope)


def handler_outcome(
    job: store.ClaimedJob, task: Task[Any, Any], exc: BaseException, duration: float
) -> Outcome:
    """What an exception out of the handler-and-ack step makes of the job."""
    if isinstance(exc, LeaseLost):
        return _STALE_ACK
    if isinstance(exc, _AckStatementLostError):
        # Nothing of the attempt committed and the pooler is known now: due again at once,
        # its attempt given back (a --burst worker takes it again before it exits).
        return PutBack(PutBackCause.STATEMENT_LOST, 0.0)
    if isinstance(exc, _InvalidResultError):
        scope_of = idempotency.scope_of(task)
        reason = DeadLetterReason.INVALID_RESULT
        return Dead(reason, retry.PERMANENT, exc.error_class, str(exc), scope=scope_of)
    if isinstance(exc, HandlerTimedOut):
        return failure_outcome(
            job, task, exc, duration, forced_category=retry.TRANSIENT, reason=DeadLetterReason.HARD_TIMEOUT
        )
    return failure_outcome(job, task, exc, duration)


def make_context(rt: Runtime, held: Held, task: Task[Any, Any]) -> JobContext:
    job = held.job
    held.context = JobContext(
        task=task,
        job_id=job.id,
        attempt=job.attempts,
        max_attempts=job.max_attempts,
        queue_name=job.queue_name,
        idempotency_key=job.idempotency_key,
        lock_key=job.lock_key,
        fencing_token=getattr(held.lock, "fencing_token", None),
        worker_id=rt.worker_id,
        signals=held.signals,
        _lease_token=job.lease_token,
        _alias=rt.alias,
        _sealed=job.sealed,
    )
    return held.context


def _invoke_and_ack(
    rt: Runtime, held: Held, task: Task[Any, Any], context: JobContext | None, scope: str
) -> tuple[Any, str | None]:
    """The handler's result, and its JSON when the ack is left to the completer's batch."""
    job = held.job
    call = rt.invoke or invoke
    if task.atomic:
        # Its writes and its ack commit together: one transaction per job, never batched.
        # The heartbeat reports the longest one open (it holds the vacuum horizon meanwhile).
        held.transaction_started_at = time.monotonic()
        try:
            # (On the in-memory store, its transaction too: the ack rolls back with the writes.)
            with store.atomic(rt.alias, database=True):
                result = call(task, context, job)
                if context is not None and context.reported_progress is not None:
                    write_last_progress(rt.alias, held)  # commits with the ack
                if _faults.ENABLED:
                    _faults.maybe_crash("after_effect")
                try:
                    ack(rt, held, scope, result, commit=True)  # the block's last statement
                except DatabaseError as exc:
                    if store.statement_lost(rt.alias, exc):  # leaving the block rolls all of it back
                        raise _AckStatementLostError(str(exc)) from exc
                    raise
        finally:
            held.transaction_started_at = 0.0
        return result, None
    result = call(task, context, job)
    if context is not None and context.reported_progress is not None:
        write_last_progress(rt.alias, held)
    if _faults.ENABLED:
        _faults.maybe_crash("after_effect")
    return after_handler(rt, held, scope, result)


def after_handler(rt: Runtime, held: Held, scope: str, result: Any) -> tuple[Any, str | None]:
    """A non-atomic handler returned ``result``: ack it now, or check it for the completer's batch."""
    if rt.completer.batches_acks:
        result, result_json = checked_result(rt, held, result)
        return result, result_json
    if scope or held.job.workflow_id is not None:
        # A key's success, and a workflow member's bookkeeping, commit with the ack or not at all.
        # The handler's writes are committed already: only this transaction runs again after a
        # failure a rerun cures (a prepared statement a pooler lost, a MariaDB deadlock).
        def ack_in_transaction() -> None:
            with store.atomic(rt.alias):
                ack(rt, held, scope, result, commit=True)

        store.retrying(rt.alias, "ack", ack_in_transaction)
    else:
        ack(rt, held, scope, result)
    return result, None


def invoke(task: Task[Any, Any], context: JobContext | None, job: store.ClaimedJob) -> Any:
    """Call the handler in this executor thread; a coroutine handler runs to completion here.

    ``async_to_sync`` keeps the executor thread blocked for the whole coroutine, so the
    heartbeat, the hard-timeout watchdog and the fenced ack treat it like any other job.
    """
    args = (context, *job.args) if context is not None else job.args
    if inspect.iscoroutinefunction(task.func):
        return async_to_sync(task.func)(*args, **job.kwargs)
    return task.func(*args, **job.kwargs)


def ack(rt: Runtime, held: Held, scope: str, result: Any, *, commit: bool = False) -> None:
    """Check the lease and the lock are still ours and the result is JSON, then write the ack.

    ``commit=True`` when the ack ends the job's atomic block: it may send the COMMIT too.
    """
    result, result_json = checked_result(rt, held, result)
    rt.completer.write_ack(held, scope, result, result_json, commit=commit)


def checked_result(rt: Runtime, held: Held, result: Any) -> tuple[Any, str]:
    """The result as stored and its JSON, once the lease and the lock are known to be ours.

    Raises LeaseLost for an abandoned job, ``_LockLostError`` for a lost lock and
    ``_InvalidResultError`` for a result that is not JSON or is larger than its limit
    (measured on the JSON to be stored: a result is serialised once, and None not at all).
    """
    job = held.job
    if held.state is HeldState.ABANDONED:
        raise LeaseLost(f"job {job.id}: abandoned past its hard timeout")
    if held.lock is not None and not held.lock_lost:
        # Check the lock once more just before the ack: if it is still ours, no one held
        # it since the acquire (an expired lock never comes back to the same token).
        renew_lock(held, time.monotonic(), rt.worker_id)
    if held.lock_lost:
        raise _LockLostError(f"job {job.id}: lock {job.lock_key!r} was lost while the handler ran")
    if result is None:
        result_json = "null"
    else:
        try:
            result = normalize_json(result, "return value")
        except InvalidArgumentsError as exc:
            raise _InvalidResultError(str(exc)) from None
        result_json = json.dumps(result)
        if len(result_json) > _result_limit(job.task_name):  # ASCII: one byte per character
            raise _ResultTooLargeError(_too_large(job.task_name, len(result_json)))
        if job.sealed:  # measured in clear above: the limit is the user's data, not the cipher's
            result_json = seal_json_text(result, RESULT, result_json)
    return result, result_json


def _result_limit(task_name: str) -> int:
    """Bytes a return value of this task may take as stored JSON."""
    task = registry.find(task_name)
    own = task.max_result_bytes if task is not None else None
    return own or get_settings().max_result_bytes


def _too_large(task_name: str, size: int) -> str:
    task = registry.find(task_name)
    if task is not None and task.max_result_bytes:
        setting = f"@task(max_result_bytes=...) of {task_name}"
    else:
        setting = 'JOBGUARD["MAX_RESULT_BYTES"]'
    return (
        f"return value takes {size:,} bytes as JSON, more than the limit of {_result_limit(task_name):,} "
        f"bytes ({setting}); nothing of it was stored. Store large data elsewhere (a model, a file) "
        "and return its id."
    )


def release_lock(held: Held, worker_id: str) -> None:
    """Free the job's lock, unless it was lost; one no longer ours is left to its TTL."""
    handle, held.lock = held.lock, None
    if handle is None or held.lock_lost:
        return
    try:
        handle.release()
    except (LockUnavailable, LockNotAcquired) as exc:
        fields = job_fields(held.job, worker_id)
        logger.warning(
            "lock_release_failed job_id=%s lock_key=%r: %r",
            held.job.id,
            fields["lock_key"],
            redact(str(exc), payload_secrets(held.job)),  # the error names the key
            extra=fields,
        )


# -- on error ------------------------------------------------------------------------------


def failure_outcome(
    job: store.ClaimedJob,
    task: Task[Any, Any] | None,
    exc: BaseException,
    duration: float | None,
    *,
    forced_category: str | None = None,
    reason: str | None = None,
) -> Retry | Dead:
    """A failed attempt: retry later with backoff, or dead-letter (permanent, or out of attempts)."""
    category = forced_category or (
        retry.TRANSIENT if isinstance(exc, _LockLostError) else retry.classify(exc, task)
    )
    error_class = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    # Redacted before it is clipped: a cut through a secret would leave a piece of it that
    # the completer's redaction of the whole value no longer recognises.
    limit, secrets = get_settings().max_error_chars, payload_secrets(job)
    message = clip(redact(str(exc), secrets), limit)
    tb = clip(redact("".join(traceback.format_exception(exc)), secrets), limit)
    if category == retry.PERMANENT or job.attempts >= job.max_attempts:
        default = (
            DeadLetterReason.PERMANENT_ERROR
            if category == retry.PERMANENT
            else DeadLetterReason.RETRIES_EXHAUSTED
        )
        scope = idempotency.scope_of(task) if task is not None else None
        return Dead(reason or default, category, error_class, message, tb, duration, scope, exc)
    delay = retry.delay_for(exc, task, job.queue_name, category, job.attempts)
    return Retry(exc, category, delay, duration, error_class, message, tb)
