"""The one writer of outcomes: the store write, the metric, the log line and the signal of each.

The pipeline decides what became of a job and returns it as an :mod:`~django_jobguard.outcome`
value; :meth:`Completer.settle` turns it into what the rest of the world sees. A success is
the exception to "write here": its ack has to commit in the job's own transaction, under its
lock, so the pipeline calls :meth:`Completer.write_ack` there and the settle only reports it.
:meth:`Completer.settle_many` is the seam where batched acks of non-atomic tasks can go.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import transaction

from .. import _dispatch, _faults, dlq, idempotency, metrics, signals, store
from ..exceptions import LeaseLost
from ..log import job_fields
from ..outcome import (
    Dead,
    Duplicate,
    HandBack,
    HeldState,
    Outcome,
    PutBack,
    PutBackCause,
    Retry,
    Stale,
    Succeeded,
    Tally,
)
from .held import LOGGER_NAME, Held

logger = logging.getLogger(LOGGER_NAME)

__all__ = ["Completer"]


class Completer:
    """Settles the outcomes of one worker's jobs, and counts them for its summary."""

    def __init__(
        self,
        alias: str,
        worker_id: str,
        *,
        lock: threading.Lock | None = None,
        note_run_time: Callable[[float], None] | None = None,
    ) -> None:
        self.alias = alias
        self.worker_id = worker_id
        #: Guards the tally and the held jobs' states (the worker's own lock).
        self.lock = lock or threading.Lock()
        self._note_run_time = note_run_time or (lambda seconds: None)
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

    def count(self, tally: Tally) -> None:
        with self.lock:
            self.outcomes[tally.value] += 1

    # -- writes ------------------------------------------------------------------------

    def write_ack(self, held: Held, scope: str, result: Any, result_json: str) -> None:
        """Mark the job succeeded (and its idempotency key), fenced by the lease token.

        Called by the pipeline inside the job's transaction; raises LeaseLost if refused.
        """
        job = held.job
        if scope and job.idempotency_key:
            idempotency.record_success(self.alias, scope, job.idempotency_key, job.id, result)
        if _faults.ENABLED:
            _faults.maybe_crash("in_complete")
        if not store.complete(self.alias, job.id, job.lease_token, result_json):
            raise LeaseLost(f"job {job.id}: lease lost before the ack")

    def settle_many(self, settled: Iterable[tuple[Held, Outcome]]) -> None:
        """Settle several outcomes (today one by one; batched acks would write them together)."""
        for held, outcome in settled:
            self.settle(held, outcome)

    def settle(self, held: Held, outcome: Outcome) -> None:
        """Write what the outcome says to the store, then its metric, log line and signal."""
        if type(outcome) is Succeeded:  # the hot path first
            self._succeeded(held, outcome)
        else:
            self._settlers[type(outcome)](held, outcome)

    # -- one method per outcome --------------------------------------------------------

    def _succeeded(self, held: Held, outcome: Succeeded) -> None:
        job, duration = held.job, outcome.duration
        if _faults.ENABLED:
            _faults.maybe_crash("after_complete")
        self.count(Tally.SUCCEEDED)
        self._note_run_time(duration)
        metrics.job_succeeded(job.queue_name, job.task_name, duration)
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
        with transaction.atomic(using=self.alias):
            acked = store.complete(self.alias, job.id, job.lease_token, json.dumps(outcome.result))
            if acked:
                idempotency.record_duplicate(self.alias, outcome.scope, job.idempotency_key or "")
        if not acked:
            metrics.lease_lost(job.queue_name, job.task_name, "ack")
            return
        self.count(Tally.SUCCEEDED)
        metrics.duplicate_prevented(job.task_name, "execution")
        logger.info(
            "job_duplicate job_id=%s idempotency_key=%s; stored result returned, handler not run",
            job.id,
            job.idempotency_key,
            extra=job_fields(job, self.worker_id, outcome="duplicate"),
        )

    def _failed_attempt(self, held: Held, error: BaseException, duration: float | None) -> None:
        if duration is not None:
            self._note_run_time(duration)
        if metrics.is_unique_violation(error):
            metrics.unique_conflict(held.job.queue_name, held.job.task_name)

    def _retry(self, held: Held, outcome: Retry) -> None:
        job = held.job
        self._failed_attempt(held, outcome.error, outcome.duration)
        if _faults.ENABLED:
            _faults.maybe_crash("in_retry")
        error = outcome.error
        if not store.requeue(
            self.alias,
            job.id,
            job.lease_token,
            delay=outcome.delay,
            error=f"{outcome.error_class}: {outcome.message}",
            attempt_error=(
                f"{type(error).__module__}.{type(error).__qualname__}",
                outcome.message,
                outcome.traceback,
            ),
        ):
            metrics.lease_lost(job.queue_name, job.task_name, "retry")
            logger.warning(
                "retry_rejected job_id=%s; the lease moved on",
                job.id,
                extra=job_fields(job, self.worker_id, outcome="stale"),
            )
            return
        self.count(Tally.RETRIED)
        metrics.job_failed(job.queue_name, job.task_name, outcome.category, outcome.duration, retried=True)
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
            metrics.job_failed(
                job.queue_name, job.task_name, outcome.category, outcome.duration, retried=False
            )
        if _faults.ENABLED:
            _faults.maybe_crash("in_dead_letter")
        try:
            dlq.dead_letter(
                self.alias,
                job.id,
                job.lease_token,
                reason=outcome.reason,
                category=outcome.category,
                error_class=outcome.error_class,
                error_message=outcome.message,
                traceback=outcome.traceback,
                worker_id=self.worker_id,
                idempotency_scope=outcome.scope,
            )
        except LeaseLost:
            metrics.lease_lost(job.queue_name, job.task_name, "dead_letter")
            logger.warning(
                "dead_letter_rejected job_id=%s reason=%s; the lease moved on",
                job.id,
                outcome.reason,
                extra=job_fields(job, self.worker_id, outcome="stale"),
            )
            return
        self.count(Tally.DEAD_LETTERED)
        logger.error(
            "job_dead_lettered job_id=%s task=%s reason=%s error=%s",
            job.id,
            job.task_name,
            outcome.reason,
            outcome.error_class,
            extra=job_fields(job, self.worker_id, duration=outcome.duration, outcome="dead"),
        )

    def _put_back(self, held: Held, outcome: PutBack) -> None:
        """Back in the queue without using an attempt: the handler did not run."""
        job = held.job
        cause = outcome.cause
        if cause is PutBackCause.IDEMPOTENCY_WAIT:
            logger.info(
                "idempotency_wait job_id=%s idempotency_key=%s; another job owns the key, retry in %.1fs",
                job.id,
                job.idempotency_key,
                outcome.delay,
                extra=job_fields(job, self.worker_id, outcome="idempotency_wait"),
            )
        elif cause is PutBackCause.LOCK_UNAVAILABLE:
            metrics.lock_failed(job.queue_name, job.task_name, "unavailable")
        requeued = store.requeue(
            self.alias,
            job.id,
            job.lease_token,
            delay=outcome.delay,
            error=outcome.error,
            refund_attempt=True,
            contention=cause is PutBackCause.LOCK_CONTENDED,
        )
        if not requeued:
            metrics.lease_lost(job.queue_name, job.task_name, "requeue")
            if cause is PutBackCause.LOCK_CONTENDED:
                return
        else:
            self.count(Tally.PUT_BACK)
        if cause is PutBackCause.LOCK_CONTENDED:
            metrics.lock_contended(job.queue_name, job.task_name)
            logger.info(
                "lock_contended job_id=%s lock_key=%s; retry in %.2fs",
                job.id,
                job.lock_key,
                outcome.delay,
                extra=job_fields(job, self.worker_id, outcome="lock_contended"),
            )
        elif cause is PutBackCause.LOCK_UNAVAILABLE:
            logger.warning(
                "lock_unavailable job_id=%s lock_key=%s; handler not run, retry in %.2fs: %s",
                job.id,
                job.lock_key,
                outcome.delay,
                outcome.detail,
                extra=job_fields(job, self.worker_id, outcome="lock_unavailable"),
            )

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
        with self.lock:
            held.state = HeldState.HANDED_BACK

    def _stale(self, held: Held, outcome: Stale) -> None:
        job = held.job
        metrics.lease_lost(job.queue_name, job.task_name, outcome.operation)
        logger.warning(
            "ack_rejected job_id=%s; the lease moved on, nothing committed",
            job.id,
            extra=job_fields(job, self.worker_id, outcome="stale"),
        )
