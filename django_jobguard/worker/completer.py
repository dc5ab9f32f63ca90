"""The one writer of outcomes: the store write, the metric, the log line and the signal of each.

The pipeline decides what became of a job and returns it as an :mod:`~django_jobguard.outcome`
value; :meth:`Completer.settle` turns it into what the rest of the world sees.

Acks. An ``atomic=True`` task's ack has to commit in the job's own transaction, so the
pipeline calls :meth:`Completer.write_ack` there and the settle only reports it. With
``ACK_WINDOW`` above 0, the acks of the other tasks are batched: the executor hands the
outcome over and takes its next job, and the worker's ack thread (:meth:`Completer.run_acks`)
writes the acks gathered over the window, or ``ACK_BATCH_SIZE`` of them, in one statement and
one commit. Each row is still matched by its id and lease token; one that no longer matches
is a lost lease for that job alone. A crash before that commit leaves those jobs running
until their leases expire, and they run again: at-least-once, as for any crash before an ack.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, InterfaceError

from .. import _dispatch, _faults, breakers, dlq, events, idempotency, signals, store, workflows
from .._redact import payload_secrets, redact
from .._text import clip
from ..conf import BreakerSpec, get_settings
from ..encryption.payloads import ERROR, RESULT, seal_history_entry, seal_json, seal_text
from ..exceptions import LeaseLost
from ..log import job_fields
from ..outcome import (
    Dead,
    Duplicate,
    HandBack,
    Outcome,
    PutBack,
    PutBackCause,
    Retry,
    Stale,
    Succeeded,
    Tally,
)
from ..registry import registry
from .held import LOGGER_NAME, Held, close_connection, reset_after_db_error
from .slots import Slots

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["Completer"]

_STALE_ACK = Stale("ack")
#: Outcomes that spend an attempt: dropped for a job shutdown has taken over (see settle).
_FAILURES = frozenset({Retry, Dead})
#: Put on the ack queue by :meth:`Completer.flush`: write the batch gathered so far now.
FLUSH = object()


class Completer:
    """Settles the outcomes of one worker's jobs, and counts them for its summary."""

    def __init__(
        self,
        alias: str,
        worker_id: str,
        *,
        slots: Slots | None = None,
        note_run_time: Callable[[float], None] | None = None,
        ack_window: float = 0.0,
        ack_batch_size: int = 1,
        on_acks_written: Callable[[], None] | None = None,
    ) -> None:
        self.alias = alias
        self.worker_id = worker_id
        #: Seconds an ack waits for others to be written with; 0: each is written on its own.
        self.ack_window = ack_window
        self.ack_batch_size = max(1, ack_batch_size)
        #: Whether a batch of plain acks may be written without a transaction around it.
        self._acks_alone = store.acks_commit_alone(alias)
        #: (held, outcome) acks, FLUSH, or None to stop (typed Any: FLUSH is a plain object).
        self._pending: queue.SimpleQueue[Any] = queue.SimpleQueue()
        #: Whether a FLUSH is on its way to the ack thread (one at a time is enough).
        self._flush_asked = False
        #: Jobs whose handler succeeded and whose ack is not written yet: still ``running`` in
        #: the database, so they count against the worker's prefetch cap (see Worker._loop).
        self.awaiting_acks = 0
        self._on_acks_written = on_acks_written or (lambda: None)
        #: The worker's held jobs: a hand-back or a take-over changes a job's state there.
        self.slots = slots or Slots()
        #: Guards the tally and the count of acks awaited.
        self.lock = threading.Lock()
        self._note_run_time = note_run_time or (lambda seconds: None)
        #: The breaker each guarded task's calls count under: task name -> (limit, its breaker).
        #: Empty unless a named limit declares a breaker (the plain path looks no further).
        self.breakers: dict[str, tuple[str, BreakerSpec]] = {}
        #: Each breaker's state as this worker's last limited claim read it (the worker sets it).
        self.breaker_states: dict[str, str] = {}
        #: Successes of closed breakers not counted yet, and since when they are held.
        self._successes = breakers.HeldSuccesses()
        #: Outcomes of the jobs settled, for the summary on exit (see Worker.summary()).
        self.outcomes: dict[str, int] = {tally.value: 0 for tally in Tally}
        self._settlers: dict[type, Callable[[Held, Any], None]] = {
            Duplicate: self._duplicate,
            Retry: self._retry,
            PutBack: self._put_back,
            HandBack: self._hand_back,
            Dead: self._dead,
            Stale: self._stale,
        }

    @property
    def batches_acks(self) -> bool:
        """Whether the pipeline leaves non-atomic acks to :meth:`run_acks`."""
        return self.ack_window > 0

    def count(self, tally: Tally) -> None:
        with self.lock:
            self.outcomes[tally.value] += 1

    # -- writes ------------------------------------------------------------------------

    def write_ack(
        self, held: Held, scope: str, result: Any, result_json: str, *, commit: bool = False
    ) -> None:
        """Mark the job succeeded (and its idempotency key), fenced by the lease token.

        Called by the pipeline inside the job's transaction; raises LeaseLost if refused.
        ``commit=True``: nothing follows in that transaction (see :func:`store.complete`).
        """
        job = held.job
        if scope and job.idempotency_key:
            idempotency.record_success(
                self.alias, scope, job.idempotency_key, job.id, _stored(job, result, result_json)
            )
        if _faults.ENABLED:
            _faults.maybe_crash("in_complete")
        # A workflow's bookkeeping commits with the ack, so the ack may not send the COMMIT.
        last = commit and job.workflow_id is None
        if not store.complete(self.alias, job.id, job.lease_token, result_json, commit=last):
            raise LeaseLost(f"job {job.id}: lease lost before the ack")
        if job.workflow_id is not None:
            workflows.job_settled(self.alias, job.id, job.workflow_id, "succeeded", result_json)

    def settle_many(self, settled: Iterable[tuple[Held, Outcome]]) -> None:
        """Settle several outcomes: the acks still to write together, the others one by one."""
        acks: list[tuple[Held, Succeeded]] = []
        for held, outcome in settled:
            if type(outcome) is Succeeded and outcome.ack_json is not None:
                acks.append((held, outcome))
            else:
                self.settle(held, outcome)
        if acks:
            self._write_acks(acks)

    # -- batched acks --------------------------------------------------------------------

    def run_acks(self) -> None:
        """The ack thread: write the handed-over acks in batches until :meth:`close_acks`."""
        closing = False
        while not closing:
            batch, closing = self._next_batch()
            if not batch:
                continue
            try:
                self.settle_many(batch)
            except Exception:
                # As an executor does for one job: these jobs keep their leases until they
                # expire and run again; the thread goes on with the next batch.
                logger.exception(
                    "ack_batch_crashed worker_id=%s jobs=%s",
                    self.worker_id,
                    ",".join(str(held.job.id) for held, _ in batch),
                )

    def flush(self) -> None:
        """Ask the ack thread to write what it holds now, without waiting out the window.

        The window lets acks gather while the executors keep running jobs; once the acks
        awaited are what keeps the claimer from claiming, waiting longer only idles them.
        """
        if not self._flush_asked:
            self._flush_asked = True
            self._pending.put(FLUSH)

    def close_acks(self, thread: threading.Thread | None, timeout: float) -> None:
        """Write every ack still waiting, before the worker exits.

        The ack thread writes them and stops; if it is not running (it died, or never
        started), this thread writes them.
        """
        self._pending.put(None)
        if thread is not None and thread.is_alive():
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("ack_thread_stuck worker_id=%s; unwritten acks will run again", self.worker_id)
            return
        batch = []
        while True:
            try:
                item = self._pending.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, tuple):
                batch.append(item)
        if batch:
            self.settle_many(batch)

    def _next_batch(self) -> tuple[list[tuple[Held, Succeeded]], bool]:
        """Wait for an ack, then gather more for up to the window; and whether to stop after."""
        first = self._pending.get()
        if first is None:
            return [], True
        if first is FLUSH:
            self._flush_asked = False
            return [], False
        batch = [first]
        deadline = time.monotonic() + self.ack_window
        while len(batch) < self.ack_batch_size:
            left = deadline - time.monotonic()
            try:
                item = self._pending.get(timeout=left) if left > 0 else self._pending.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            if item is FLUSH:
                self._flush_asked = False
                break
            batch.append(item)
        return batch, False

    def _write_acks(self, acks: list[tuple[Held, Succeeded]]) -> None:
        try:
            self._settle_acks(acks)
        finally:
            # Written or not (a failed one runs again after its lease), no longer waiting here.
            with self.lock:
                self.awaiting_acks -= len(acks)
            self._on_acks_written()

    def _settle_acks(self, acks: list[tuple[Held, Succeeded]]) -> None:
        try:
            done, failed = self._commit_acks(acks), set[int]()
        except (DatabaseError, InterfaceError):
            # One bad moment should not cost the whole batch its acks: retry each alone.
            logger.warning(
                "ack_batch_failed worker_id=%s jobs=%d; writing them one by one",
                self.worker_id,
                len(acks),
                exc_info=True,
            )
            close_connection(self.alias)
            done, failed = self._ack_one_by_one(acks)
        for held, outcome in acks:
            job_id = held.job.id
            if job_id in done:
                if held.trace_scope is None:  # untraced: no context manager per job
                    self._report_succeeded(held, outcome)
                else:
                    with held.trace_scope():
                        self._report_succeeded(held, outcome)
            elif job_id not in failed:
                self._stale(held, _STALE_ACK)

    def _commit_acks(self, acks: list[tuple[Held, Succeeded]]) -> set[int]:
        """Write the acks (and their keys' successes) in one transaction; the ids acked.

        A deadlock on MariaDB/MySQL runs the transaction again (``store.retrying``).
        """
        if _faults.ENABLED:
            _faults.maybe_crash("in_complete")
        return store.retrying(self.alias, "ack_batch", lambda: self._ack_transaction(acks))

    def _ack_transaction(self, acks: list[tuple[Held, Succeeded]]) -> set[int]:
        if self._acks_alone and not any(
            held.job.workflow_id is not None or (outcome.scope and held.job.idempotency_key)
            for held, outcome in acks
        ):
            # Nothing else to commit with them: no BEGIN and COMMIT of their own (two round trips).
            rows = [(held.job.id, held.job.lease_token, outcome.ack_json or "null") for held, outcome in acks]
            return set(store.complete_many(self.alias, rows))
        with store.atomic(self.alias):
            rows = [(held.job.id, held.job.lease_token, outcome.ack_json or "null") for held, outcome in acks]
            acked = store.complete_many(self.alias, rows)
            done = set(acked)
            members: list[tuple[int, int, str, str | None]] = []
            for held, outcome in acks:
                job = held.job
                # Only for acked jobs: a key must not read succeeded for a job that lost its lease.
                if outcome.scope and job.idempotency_key and job.id in done:
                    idempotency.record_success(
                        self.alias,
                        outcome.scope,
                        job.idempotency_key,
                        job.id,
                        _stored(job, outcome.result, outcome.ack_json),
                    )
                if job.workflow_id is not None and job.id in done:
                    members.append((job.id, job.workflow_id, "succeeded", outcome.ack_json or "null"))
            if members:
                # Together: each counter row touched once, in one order across workers.
                parents = {job_id for job_id, has_dependants in acked.items() if has_dependants}
                workflows.jobs_settled(self.alias, members, parents=parents)
        return done

    def _ack_one_by_one(self, acks: list[tuple[Held, Succeeded]]) -> tuple[set[int], set[int]]:
        """Each ack in its own transaction: the ids acked, and those whose write failed."""
        done: set[int] = set()
        failed: set[int] = set()
        for pair in acks:
            held = pair[0]
            try:
                done |= self._commit_acks([pair])
            except (DatabaseError, InterfaceError):
                failed.add(held.job.id)
                consequence = "its ack was not written, it will run again"
                reset_after_db_error(held, self.worker_id, self.alias, consequence)
        return done, failed

    def settle(self, held: Held, outcome: Outcome) -> None:
        """Write what the outcome says to the store, then its metric, log line and signal."""
        if type(outcome) is Succeeded:  # the hot path first
            self._succeeded(held, outcome)
        else:
            self._settlers[type(outcome)](held, outcome)

    def settle_run(self, held: Held, outcome: Outcome) -> None:
        """Settle the outcome a job's own thread reached, unless the worker took the job over.

        Once the watchdog (hard timeout) or shutdown (grace period over) abandoned a job, they
        settle it themselves: the watchdog as a failed attempt, shutdown as a hand-back with
        the attempt refunded. A failure the job's thread reports after that is their doing
        (on SQLite shutdown cut the job's connection), and writing it first would spend an
        attempt.
        """
        if type(outcome) in _FAILURES:
            if self.slots.taken_over(held):
                logger.info(
                    "outcome_dropped job_id=%s outcome=%s; the worker took the job over",
                    held.job.id,
                    type(outcome).__name__,
                    extra=job_fields(held.job, self.worker_id, outcome="abandoned"),
                )
                return
        self.settle(held, outcome)

    # -- one method per outcome --------------------------------------------------------

    def _succeeded(self, held: Held, outcome: Succeeded) -> None:
        if outcome.ack_json is not None:
            with self.lock:
                self.awaiting_acks += 1
            self._pending.put((held, outcome))  # run_acks writes it, then reports it
            return
        self._report_succeeded(held, outcome)

    def _report_succeeded(self, held: Held, outcome: Succeeded) -> None:
        job, duration = held.job, outcome.duration
        if _faults.ENABLED:
            _faults.maybe_crash("after_complete")
        self.count(Tally.SUCCEEDED)
        self._note_run_time(duration)
        if self.breakers:
            self._call(job, failed=False)
        events.emit(events.JobSucceeded(job.queue_name, job.task_name, duration))
        if logger.isEnabledFor(logging.INFO):  # skip building the fields for a dropped record
            logger.info(
                "job_succeeded job_id=%s task=%s duration=%.4f",
                job.id,
                job.task_name,
                duration,
                extra=job_fields(job, self.worker_id, duration=duration, outcome="succeeded"),
            )
        _dispatch.send(
            signals.job_succeeded,
            job_id=job.id,
            task_name=job.task_name,
            result=outcome.result,
            duration=duration,
        )

    def _duplicate(self, held: Held, outcome: Duplicate) -> None:
        job = held.job
        with store.atomic(self.alias):
            result_json = json.dumps(_stored(job, outcome.result))
            acked = store.complete(self.alias, job.id, job.lease_token, result_json)
            if acked:
                idempotency.record_duplicate(self.alias, outcome.scope, job.idempotency_key or "")
                if job.workflow_id is not None:
                    workflows.job_settled(self.alias, job.id, job.workflow_id, "succeeded", result_json)
        if not acked:
            events.emit(events.LeaseLost(job.queue_name, job.task_name, "ack"))
            return
        self.count(Tally.SUCCEEDED)
        events.emit(events.DuplicatePrevented(job.task_name, "execution"))
        fields = job_fields(job, self.worker_id, outcome="duplicate")
        logger.info(
            "job_duplicate job_id=%s idempotency_key=%r; stored result returned, handler not run",
            job.id,
            fields["idempotency_key"],
            extra=fields,
        )

    def _failed_attempt(self, held: Held, error: BaseException, duration: float | None) -> None:
        if duration is not None:
            self._note_run_time(duration)
        if store.is_unique_violation(error):
            events.emit(events.UniqueConflict(held.job.queue_name, held.job.task_name))

    def _retry(self, held: Held, outcome: Retry) -> None:
        job = held.job
        self._failed_attempt(held, outcome.error, outcome.duration)
        if _faults.ENABLED:
            _faults.maybe_crash("in_retry")
        error = outcome.error
        message, traceback = _redacted(job, outcome.message, outcome.traceback)
        summary = f"{outcome.error_class}: {message}"
        if job.sealed:
            summary = seal_text(summary, ERROR)
            message, traceback = seal_history_entry(message, traceback)
        if not store.requeue(
            self.alias,
            job.id,
            job.lease_token,
            delay=outcome.delay,
            error=summary,
            attempt_error=(f"{type(error).__module__}.{type(error).__qualname__}", message, traceback),
        ):
            events.emit(events.LeaseLost(job.queue_name, job.task_name, "retry"))
            logger.warning(
                "retry_rejected job_id=%s; the lease moved on",
                job.id,
                extra=job_fields(job, self.worker_id, outcome="stale"),
            )
            return
        self.count(Tally.RETRIED)
        if self.breakers:
            self._call(job, failed=self._failed_call(job, outcome.error, outcome.category))
        events.emit(
            events.JobFailed(job.queue_name, job.task_name, outcome.category, outcome.duration, retried=True)
        )
        logger.warning(
            "job_retry job_id=%s task=%s attempt=%d category=%s delay=%.2f error=%s",
            job.id,
            job.task_name,
            job.attempts,
            outcome.category,
            outcome.delay,
            outcome.error_class,
            extra=job_fields(job, self.worker_id, duration=outcome.duration, outcome="retry"),
        )
        _dispatch.send(
            signals.job_retried,
            job_id=job.id,
            task_name=job.task_name,
            attempt=job.attempts,
            error=error,
            delay=outcome.delay,
        )

    def _dead(self, held: Held, outcome: Dead) -> None:
        job = held.job
        if outcome.error is not None:
            self._failed_attempt(held, outcome.error, outcome.duration)
            events.emit(
                events.JobFailed(job.queue_name, job.task_name, outcome.category, outcome.duration, False)
            )
        if _faults.ENABLED:
            _faults.maybe_crash("in_dead_letter")
        message, traceback = _redacted(job, outcome.message, outcome.traceback)
        try:
            dlq.dead_letter(
                self.alias,
                job.id,
                job.lease_token,
                reason=outcome.reason,
                category=outcome.category,
                error_class=outcome.error_class,
                error_message=message,
                traceback=traceback,
                worker_id=self.worker_id,
                idempotency_scope=outcome.scope,
                encrypt=job.sealed,
            )
        except LeaseLost:
            events.emit(events.LeaseLost(job.queue_name, job.task_name, "dead_letter"))
            logger.warning(
                "dead_letter_rejected job_id=%s reason=%s; the lease moved on",
                job.id,
                outcome.reason,
                extra=job_fields(job, self.worker_id, outcome="stale"),
            )
            return
        self.count(Tally.DEAD_LETTERED)
        if self.breakers and outcome.error is not None:
            self._call(job, failed=self._failed_call(job, outcome.error, outcome.category))
        logger.error(
            "job_dead_lettered job_id=%s task=%r reason=%s error=%s",
            job.id,
            job.task_name,
            outcome.reason,
            outcome.error_class,
            extra=job_fields(job, self.worker_id, duration=outcome.duration, outcome="dead"),
        )

    def _put_back(self, held: Held, outcome: PutBack) -> None:
        """Back in the queue without using an attempt: the handler did not run (or rolled back)."""
        job = held.job
        cause = outcome.cause
        if cause is PutBackCause.IDEMPOTENCY_WAIT:
            fields = job_fields(job, self.worker_id, outcome="idempotency_wait")
            logger.info(
                "idempotency_wait job_id=%s idempotency_key=%r; another job owns the key, retry in %.1fs",
                job.id,
                fields["idempotency_key"],
                outcome.delay,
                extra=fields,
            )
        elif cause is PutBackCause.LOCK_UNAVAILABLE:
            events.emit(events.LockFailed(job.queue_name, job.task_name, "unavailable"))
        requeued = store.requeue(
            self.alias,
            job.id,
            job.lease_token,
            delay=outcome.delay,
            error=None if outcome.error is None else _sealed_error(job, _redacted(job, outcome.error)[0]),
            refund_attempt=True,
            contention=cause is PutBackCause.LOCK_CONTENDED,
        )
        if not requeued:
            events.emit(events.LeaseLost(job.queue_name, job.task_name, "requeue"))
            if cause is PutBackCause.LOCK_CONTENDED:
                return
        else:
            self.count(Tally.PUT_BACK)
        if cause is PutBackCause.STATEMENT_LOST:
            # As a transaction of ours run again (store.retrying): counted and logged the same way.
            events.emit(events.StatementRetried(operation="atomic_job", reason="prepared_statement_lost"))
            logger.info(
                "statement_retried alias=%s operation=atomic_job reason=prepared_statement_lost job_id=%s; "
                "its transaction rolled back with the handler's writes, due again at once",
                self.alias,
                job.id,
                extra=job_fields(job, self.worker_id, outcome="statement_lost"),
            )
        elif cause is PutBackCause.LOCK_CONTENDED:
            events.emit(events.LockContended(job.queue_name, job.task_name))
            fields = job_fields(job, self.worker_id, outcome="lock_contended")
            logger.info(
                "lock_contended job_id=%s lock_key=%r; retry in %.2fs",
                job.id,
                fields["lock_key"],
                outcome.delay,
                extra=fields,
            )
        elif cause is PutBackCause.NEEDS_THREAD:
            logger.warning(
                "job_refused job_id=%s task=%s; %s; back in the queue, retry in %.0fs",
                job.id,
                job.task_name,
                outcome.error,
                outcome.delay,
                extra=job_fields(job, self.worker_id, outcome="refused"),
            )
        elif cause is PutBackCause.LOCK_UNAVAILABLE:
            fields = job_fields(job, self.worker_id, outcome="lock_unavailable")
            logger.warning(
                "lock_unavailable job_id=%s lock_key=%r; handler not run, retry in %.2fs: %r",
                job.id,
                fields["lock_key"],
                outcome.delay,
                str(outcome.detail),
                extra=fields,
            )

    def _failed_call(self, job: store.ClaimedJob, error: BaseException | None, category: str) -> bool:
        """Whether a failed attempt counts as a failed call of its breaker's dependency."""
        guarded = self.breakers.get(job.task_name)
        if guarded is None:
            return False
        return breakers.is_failed_call(error, category, registry.find(job.task_name), guarded[1])

    def _call(self, job: store.ClaimedJob, *, failed: bool) -> None:
        """Count an attempt that reached its end under the task's breaker, if it has one.

        The breaker's state is the one this worker's last claim read; the successes of a
        closed breaker are gathered (:class:`~django_jobguard.breakers.HeldSuccesses`).
        """
        guarded = self.breakers.get(job.task_name)
        if guarded is None:
            return
        name, spec = guarded
        with self.lock:
            closed = self.breaker_states.get(name, "closed") == "closed"
            held = self._successes.take(name, failed=failed, closed=closed, now=time.monotonic())
        if held is None:
            return
        try:
            breakers.record(self.alias, name, spec, failed=failed, earlier_successes=held)
        except (DatabaseError, InterfaceError):
            # The outcome is written already; a lost count only delays a trip.
            logger.warning("breaker_count_failed job_id=%s limit=%s", job.id, name, exc_info=True)

    def _hand_back(self, held: Held, outcome: HandBack) -> None:
        """The worker stops: give the job back at once, its attempt refunded."""
        job = held.job
        if store.requeue(self.alias, job.id, job.lease_token, delay=0, error=None, refund_attempt=True):
            self.count(Tally.PUT_BACK)
            logger.info(
                "job_handed_back job_id=%s started=%s",
                job.id,
                outcome.started,
                extra=job_fields(job, self.worker_id, outcome="handed_back"),
            )
        self.slots.handed_back(held)

    def _stale(self, held: Held, outcome: Stale) -> None:
        job = held.job
        events.emit(events.LeaseLost(job.queue_name, job.task_name, outcome.operation))
        logger.warning(
            "ack_rejected job_id=%s; the lease moved on, nothing committed",
            job.id,
            extra=job_fields(job, self.worker_id, outcome="stale"),
        )


def _stored(job: store.ClaimedJob, result: Any, result_json: str | None = None) -> Any:
    """A result as an idempotency key stores it: sealed for a job whose data is encrypted,
    the job's own ciphertext when its ack has one (``result_json``): a result is sealed once."""
    if not job.sealed or result is None:
        return result
    return json.loads(result_json) if result_json is not None else seal_json(result, RESULT)


def _sealed_error(job: store.ClaimedJob, error: str) -> str:
    return seal_text(error, ERROR) if job.sealed else error


def _redacted(job: store.ClaimedJob, *texts: str) -> list[str]:
    """``texts`` with the job's ``JOBGUARD["REDACT"]`` values replaced, before they are stored.

    Here, in the one writer of outcomes, so every failure's text passes through it; the
    result is clipped again because a replacement may be longer than the value it hides.
    """
    secrets = payload_secrets(job)
    if not secrets:
        return list(texts)
    limit = get_settings().max_error_chars
    return [clip(redact(text, secrets), limit) for text in texts]
