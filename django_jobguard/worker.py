"""The worker: claim loop, executor threads, heartbeat, reaper, OS signals, graceful shutdown.

One process runs:

- the **main thread**, which claims batches of due jobs (never more than it has room
  for), reaps expired leases every ``REAPER_INTERVAL`` seconds, and sleeps on
  LISTEN/NOTIFY (PostgreSQL) or a poll timer when there is nothing to do;
- ``concurrency`` **executor threads**, each with its own database connection, running
  one job at a time;
- a **heartbeat thread** that extends the leases (and renews the locks) of held jobs
  every third of their visibility timeout, and fails jobs past their hard ``timeout``.

SIGTERM / SIGINT stop the claiming; jobs not started are handed back at once, running
ones get ``SHUTDOWN_GRACE`` seconds, and what is still running then is handed back (it
will run again: handlers must be idempotent). On SQLite the running jobs' connections are
closed first, rolling their transactions back, since an open one blocks every write. A
second signal skips the grace period.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from typing import Any

from asgiref.sync import async_to_sync
from django.db import DatabaseError, InterfaceError, connections, transaction

from . import _dispatch, _faults, beats, dlq, idempotency, metrics, retry, schedules, signals, store
from . import queues as queue_states  # `queue` is the stdlib module here
from .conf import WORKER_ID_MAX_LENGTH, RetryPolicy, get_settings
from .context import JobContext
from .enqueue import normalize_json
from .exceptions import InvalidArgumentsError, LeaseLost, LockNotAcquired, LockUnavailable
from .leadership import MaintenanceLeadership
from .log import job_fields
from .models import DeadLetterReason
from .registry import registry

logger = logging.getLogger(__name__)

__all__ = ["Worker"]

#: How often the heartbeat thread wakes to see whose lease or lock needs renewing.
HEARTBEAT_TICK_SECONDS = 0.25
#: Leases are renewed when this fraction of the visibility timeout has passed.
HEARTBEAT_FRACTION = 1 / 3
#: Seconds between two touches of JOBGUARD["LIVENESS_FILE"] by the heartbeat thread.
LIVENESS_TOUCH_SECONDS = 1.0
#: Back-off after a database error in the loop (the connection is reopened), doubling to the max.
DB_ERROR_BACKOFF_SECONDS = 0.5
DB_ERROR_BACKOFF_MAX_SECONDS = 5.0
#: Past this mean handler time (seconds) a worker stops holding more jobs than it can start.
PREFETCH_MAX_RUN_SECONDS = 1.0
#: Weight of the newest run in the mean handler time.
RUN_TIME_SMOOTHING = 0.1
#: Argument shapes remembered as valid per worker (binding is checked once per shape).
MAX_REMEMBERED_SHAPES = 10_000
#: Shortest wait between two scheduler passes, however close the next tick is.
SCHEDULER_MIN_SLEEP_SECONDS = 0.01
#: Wait before the scheduler tries again after a failed pass (a missing migration, an outage),
#: well within SCHEDULER.MISSED_AFTER so a brief outage loses no tick.
SCHEDULER_RETRY_SECONDS = 10.0
#: Executor threads abandoned past their hard timeout before the worker exits to be restarted.
MAX_ABANDONED_THREADS = 16
#: A job put back on lock contention waits CONTENTION_DELAY plus up to this fraction of it,
#: so the jobs of one busy key do not all come back at the same instant.
CONTENTION_JITTER_FRACTION = 0.5
#: What summary() counts: acked (a duplicate acked with the stored result included), put
#: back to retry after a failed attempt, dead-lettered, put back without using an attempt
#: (lock contention, another job owning the key, shutdown hand-back).
OUTCOMES = ("succeeded", "retried", "dead_lettered", "put_back")
#: An executor idle this long checks its connection before the next job, so a connection
#: the database dropped meanwhile (restart, failover, idle timeout) costs that job no attempt.
CONNECTION_CHECK_AFTER_IDLE_SECONDS = 1.0


def _invoke(task: Any, context: JobContext | None, job: store.ClaimedJob) -> Any:
    """Call the handler in this executor thread; a coroutine handler runs to completion here.

    ``async_to_sync`` keeps the executor thread blocked for the whole coroutine, so the
    heartbeat, the hard-timeout watchdog and the fenced ack treat it like any other job.
    """
    args = (context, *job.args) if context is not None else job.args
    if inspect.iscoroutinefunction(task.func):
        return async_to_sync(task.func)(*args, **job.kwargs)
    return task.func(*args, **job.kwargs)


def _django_task(name: str) -> Any:
    """The jobguard twin of a Django task on a ``JobGuardBackend``, imported by module path.

    Only when ``TASKS`` configures such a backend; a path that imports but is not a Django
    task resolves to None, so the job is dead-lettered as an unknown task and never run.
    """
    from django.conf import settings

    backends = getattr(settings, "TASKS", None) or {}
    if not any(
        str(config.get("BACKEND", "")).startswith("django_jobguard.backends") for config in backends.values()
    ):
        return None
    from .backends.backend import resolve_task  # optional: needs Django's Tasks framework

    return resolve_task(name)


class _InvalidResultError(Exception):
    """The handler returned something that cannot be stored as JSON."""


class _LockLostError(Exception):
    """The job's lock could not be renewed: its writes must not commit."""


@dataclasses.dataclass(eq=False)
class _Held:
    """A job this worker holds a lease on, from claim to ack or hand-back."""

    job: store.ClaimedJob
    renewed_at: float
    state: str = "waiting"  # waiting → running → done | handed_back | abandoned
    started_at: float = 0.0
    deadline: float | None = None
    context: JobContext | None = None
    lock: Any = None
    lock_renewed_at: float = 0.0
    lock_lost: bool = False
    lease_lost: bool = False
    #: The executor thread's connection while the job runs, so shutdown can cut it (SQLite).
    connection: Any = None


def default_worker_id() -> str:
    """``host:pid:random``: unique across hosts, and across restarts that reuse a pid (containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"[:WORKER_ID_MAX_LENGTH]


class Worker:
    """Runs jobs of some queues until stopped. ``manage.py jobguard_worker`` builds one."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        exclude_queues: Sequence[str] = (),
        concurrency: int = 1,
        batch_size: int | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        worker_id: str | None = None,
        database_alias: str | None = None,
        poll_interval: float | None = None,
        reaper_interval: float | None = None,
        shutdown_grace: float | None = None,
        install_signal_handlers: bool = True,
        run_scheduler: bool = True,
    ) -> None:
        conf = get_settings()
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.queues = list(queues) if queues else None
        #: Queues never claimed from (django-tasks-db's --exclude-queues).
        self.exclude_queues = list(exclude_queues)
        self.concurrency = concurrency
        self.capacity = batch_size or conf.batch_size or concurrency * 2
        self._explicit_batch = bool(batch_size or conf.batch_size)
        self._mean_run_seconds = 0.0
        self._valid_shapes: set[tuple[str, int, tuple[str, ...]]] = set()
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = worker_id or conf.worker_id or default_worker_id()
        self.alias = database_alias or conf.database_alias
        self.poll_interval = poll_interval if poll_interval is not None else conf.poll_interval
        self.reaper_interval = reaper_interval if reaper_interval is not None else conf.reaper_interval
        self.shutdown_grace = shutdown_grace if shutdown_grace is not None else conf.shutdown_grace
        self.install_signal_handlers = install_signal_handlers
        # A burst worker drains and exits: it leaves schedules to the long-running workers.
        self.run_scheduler = run_scheduler and not burst
        self._next_schedule = 0.0 if self.run_scheduler else float("inf")
        self._schedules_synced = False

        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        self._ready: queue.SimpleQueue[_Held | None] = queue.SimpleQueue()
        self._slot_freed = threading.Event()
        self._wake = threading.Event()
        self._stopping = False
        self._forced = False
        self._heartbeat_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._abandoned = 0
        self._next_prune = 0.0
        self._liveness_touched_at = -LIVENESS_TOUCH_SECONDS
        self._listener: store.Listener | None = None
        self._leadership = (
            MaintenanceLeadership(self.alias, self.worker_id, self.reaper_interval)
            if conf.maintenance_leader
            else None
        )
        self.claimed = 0
        self.processed = 0
        #: Outcomes of the jobs this worker finished, for the summary on exit (see summary()).
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self._started_at: float | None = None
        self._beat = beats.Beat(
            worker_id=self.worker_id,
            alias=self.alias,
            queues=self.queues,
            concurrency=concurrency,
            pid=os.getpid(),
        )

    # -- public ------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, with ``burst``, until nothing is due). Returns the exit code."""
        self._started_at = time.monotonic()
        if self.install_signal_handlers:
            self._install_signal_handlers()
        listener = self._listener = store.Listener(get_settings().listen_alias(self.alias), self.queues)
        if not self.burst:
            # LISTEN before announcing readiness, so no enqueue after "worker_started" is missed.
            listener.start()
        logger.info(
            "worker_started worker_id=%s queues=%s concurrency=%d batch=%d",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.capacity,
            extra={"worker_id": self.worker_id},
        )
        for index in range(self.concurrency):
            self._start_executor(index)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="jobguard-heartbeat", daemon=True)
        heartbeat.start()
        try:
            self._loop(listener)
        finally:
            listener.close()
            if self._leadership is not None:
                self._leadership.resign()
            abandoned = self._shutdown()
            self._heartbeat_stop.set()
            heartbeat.join(timeout=5)
            connections.close_all()
        logger.info(
            "worker_stopped worker_id=%s processed=%d",
            self.worker_id,
            self.processed,
            extra={"worker_id": self.worker_id},
        )
        if abandoned:
            # Threads still inside handlers cannot be joined; leave without waiting for them.
            logging.shutdown()
            os._exit(0)
        return 0

    def summary(self) -> str:
        """One line on what this worker did: jobs run, succeeded, retried, dead-lettered, elapsed.

        ``key=value`` like the log lines, so scripts can read it: ``jobs=3 succeeded=1
        retried=1 dead_lettered=1 put_back=0 elapsed=0.42s``.
        """
        elapsed = time.monotonic() - self._started_at if self._started_at is not None else 0.0
        counts = " ".join(f"{outcome}={self.outcomes[outcome]}" for outcome in OUTCOMES)
        return f"jobs={self.processed} {counts} elapsed={elapsed:.2f}s"

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and shut down (what SIGTERM does); ``force`` skips the grace period."""
        self._forced = self._forced or force or self._stopping
        self._stopping = True
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        self._wake.set()
        self._slot_freed.set()
        if self._listener is not None:
            self._listener.wake()

    # -- main loop ---------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: Any) -> None:
            # This runs in the main thread between two bytecodes, possibly while that thread
            # holds an Event's internal lock (inside Event.clear() or wait()): setting the
            # Events from here could deadlock. Flags and the listener's pipe are safe; a
            # short-lived thread sets the Events.
            self._forced = self._forced or self._stopping
            self._stopping = True
            logger.info("worker_stopping worker_id=%s signal=%s", self.worker_id, signal.Signals(signum).name)
            if self._listener is not None:
                self._listener.wake()
            threading.Thread(target=self._wake_waiters, name="jobguard-stop", daemon=True).start()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _loop(self, listener: store.Listener) -> None:
        next_reap = 0.0
        backoff = DB_ERROR_BACKOFF_SECONDS
        wait = self.poll_interval
        while not self._stopping:
            self._slot_freed.clear()
            try:
                now = time.monotonic()
                if now >= next_reap:
                    # With an elected leader, the other workers skip maintenance passes.
                    leading = self._leadership is None or self._leadership.hold()
                    if leading:
                        self._reap()
                        dlq.redrive(worker_id=self.worker_id, using=self.alias)
                    next_reap = now + self.reaper_interval
                    if leading:
                        self._prune_keys(now)
                if now >= self._next_schedule:
                    self._schedule(now)
                capacity = self._capacity()
                free = capacity - len(self._held)
                if self.max_jobs is not None:
                    free = min(free, self.max_jobs - self.claimed)
                    if free <= 0 and not self._held:
                        return
                # Refill in batches: one claim per half a batch of room, not one per freed slot
                # (measured: a third less CPU per job, in the worker and in PostgreSQL).
                asked = free if free >= max(1, capacity // 2) or (free > 0 and not self._held) else 0
                claimed = self._claim(asked) if asked else 0
                backoff = DB_ERROR_BACKOFF_SECONDS
            except (DatabaseError, InterfaceError):
                logger.warning(
                    "claim_failed worker_id=%s; retrying in %.1fs", self.worker_id, backoff, exc_info=True
                )
                connections[self.alias].close()
                self._wake.wait(backoff)
                backoff = min(backoff * 2, DB_ERROR_BACKOFF_MAX_SECONDS)
                continue
            if self.burst and claimed == 0 and not self._held:
                return
            if not asked or claimed == asked or self.burst:
                # Full (or draining in burst mode): wait for an executor to free a slot.
                self._slot_freed.wait(wait)
            else:
                # Nothing more is due: sleep until a NOTIFY, the next reaper pass or a poll.
                until = min(next_reap, self._next_schedule) - time.monotonic()
                listener.wait(max(0.0, min(wait, until)))

    def _capacity(self) -> int:
        """Jobs to hold: a batch for short jobs; for long ones only what executors can start now.

        Jobs held beyond the free executors wait in this process while other workers may
        be idle, which only pays off when jobs are short.
        """
        if not self._explicit_batch and self._mean_run_seconds > PREFETCH_MAX_RUN_SECONDS:
            return self.concurrency
        return self.capacity

    def _claim(self, limit: int) -> int:
        # Paused queues are read before every claim, so a pause reaches us within one poll.
        paused = queue_states.paused_queues(self.alias)
        wanted = self.queues
        if paused and wanted:
            wanted = [name for name in wanted if name not in paused]
            if not wanted:
                return 0
        exclude = sorted({*self.exclude_queues, *paused})
        jobs = store.claim(self.alias, wanted, limit, self.worker_id, exclude)
        if not jobs:
            return 0
        if _faults.ENABLED:
            _faults.maybe_crash("after_claim")
        now = time.monotonic()
        with self._lock:
            for job in jobs:
                held = _Held(job=job, renewed_at=now)
                self._held[job.id] = held
                self._ready.put(held)
        self.claimed += len(jobs)
        return len(jobs)

    def _reap(self) -> None:
        requeued, exhausted = store.reap(self.alias)
        if requeued:
            from .models import Job

            # Reappearances are rare: one more query gives their records every job field.
            reaped = Job.objects.using(self.alias).in_bulk([job_id for job_id, _ in requeued])
            for job_id, queue_name in requeued:
                metrics.reappeared(queue_name)
                row = reaped.get(job_id)
                logger.warning(
                    "lease_expired job_id=%s queue=%s; job visible again",
                    job_id,
                    queue_name,
                    extra=job_fields(row, self.worker_id, outcome="reappeared")
                    if row is not None
                    else {"job_id": job_id, "queue": queue_name, "outcome": "reappeared"},
                )
        for job_id, token in exhausted:
            try:
                letter = dlq.dead_letter(
                    self.alias,
                    job_id,
                    token,
                    reason=DeadLetterReason.LEASE_EXPIRED,
                    category=retry.TRANSIENT,
                    error_class="LeaseExpired",
                    error_message="the lease expired on the last attempt (worker crashed, froze or cut off)",
                    worker_id="",
                )
            except LeaseLost:
                continue  # its worker acked it just in time
            logger.error(
                "job_dead_lettered job_id=%s task=%s reason=%s error=LeaseExpired",
                job_id,
                letter.task_name,
                DeadLetterReason.LEASE_EXPIRED,
                # The dead letter carries the job's fields; its own id is not the job's.
                extra={**job_fields(letter, self.worker_id, outcome="dead"), "job_id": job_id},
            )

    def _schedule(self, now: float) -> None:
        """Enqueue the schedules' due ticks (see :mod:`django_jobguard.schedules`); sync them first once."""
        interval = get_settings().scheduler.interval
        self._next_schedule = now + interval
        try:
            if not self._schedules_synced:
                schedules.sync(using=self.alias)
                self._schedules_synced = True
            done = schedules.run_once(using=self.alias)
            if done.next_due_in is not None:
                # Wake for the next tick rather than up to a whole interval after it.
                self._next_schedule = now + min(interval, max(SCHEDULER_MIN_SLEEP_SECONDS, done.next_due_in))
        except (DatabaseError, InterfaceError):
            self._next_schedule = now + max(interval, SCHEDULER_RETRY_SECONDS)
            logger.warning(
                "scheduler_failed worker_id=%s; retrying in %.0fs",
                self.worker_id,
                max(interval, SCHEDULER_RETRY_SECONDS),
                exc_info=True,
            )
        except Exception:
            # A scheduler bug must not stop this worker from running jobs.
            self._next_schedule = now + max(interval, SCHEDULER_RETRY_SECONDS)
            logger.exception("scheduler_crashed worker_id=%s", self.worker_id)

    def _prune_keys(self, now: float) -> None:
        """Delete a batch of expired idempotency keys, at most once every WORKER_PRUNE_INTERVAL_SECONDS."""
        if now < self._next_prune or not get_settings().idempotency.prune_in_worker:
            return
        self._next_prune = now + idempotency.WORKER_PRUNE_INTERVAL_SECONDS
        try:
            deleted = idempotency.prune_expired(
                self.alias, batch_size=idempotency.WORKER_PRUNE_BATCH_SIZE, max_batches=1
            )
        except (DatabaseError, InterfaceError):
            logger.warning("prune_failed worker_id=%s", self.worker_id, exc_info=True)
            return
        if deleted:
            logger.info("idempotency_keys_pruned worker_id=%s deleted=%d", self.worker_id, deleted)

    # -- executors ---------------------------------------------------------------------

    def _start_executor(self, index: int) -> None:
        thread = threading.Thread(target=self._executor_loop, name=f"jobguard-exec-{index}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _executor_loop(self) -> None:
        try:
            while True:
                idle_since = time.monotonic()
                held = self._ready.get()
                if held is None:
                    return
                if time.monotonic() - idle_since >= CONNECTION_CHECK_AFTER_IDLE_SECONDS:
                    self._drop_unusable_connection()
                with self._lock:
                    if self._stopping or held.state != "waiting":
                        start = False
                    else:
                        held.state = "running"
                        held.started_at = time.monotonic()
                        held.connection = connections[self.alias]
                        start = True
                try:
                    if start:
                        self._execute(held)
                    elif held.state == "waiting":
                        self._hand_back(held, refund=True)
                except (DatabaseError, InterfaceError):
                    # The job keeps its lease until it expires; the reaper gives it back.
                    logger.warning(
                        "job_db_error job_id=%s; connection reset",
                        held.job.id,
                        exc_info=True,
                        extra=job_fields(held.job, self.worker_id, outcome="db_error"),
                    )
                    connections[self.alias].close()
                except Exception:
                    logger.exception(
                        "job_crashed job_id=%s",
                        held.job.id,
                        extra=job_fields(held.job, self.worker_id, outcome="crashed"),
                    )
                finally:
                    with self._lock:
                        # An abandoned job's slot went to a replacement thread already.
                        replaced = held.state == "abandoned"
                        if not replaced:
                            if held.state in ("waiting", "running"):
                                held.state = "done"
                            self._held.pop(held.job.id, None)
                            self.processed += 1
                    self._slot_freed.set()
                if replaced:
                    return
        finally:
            connections.close_all()

    def _drop_unusable_connection(self) -> None:
        """Close this thread's connection if the database dropped it; the next query reconnects."""
        connection = connections[self.alias]
        if connection.connection is not None and not connection.is_usable():
            logger.info("connection_reset worker_id=%s; the database had dropped it", self.worker_id)
            connection.close()

    def _execute(self, held: _Held) -> None:
        job = held.job
        task = registry.find(job.task_name) or _django_task(job.task_name)
        if task is None:
            self._dead(
                held,
                None,
                DeadLetterReason.UNKNOWN_TASK,
                retry.PERMANENT,
                "UnknownTaskError",
                f"no task is registered as {job.task_name!r} in this worker; it was never run",
            )
            return
        # Whether arguments bind depends only on how many are positional and which are named,
        # so each shape is checked once per worker. A stored string or number (not a JSON list
        # and object) would otherwise be unpacked character by character.
        shape = (
            (job.task_name, len(job.args), tuple(sorted(job.kwargs)))
            if isinstance(job.args, list) and isinstance(job.kwargs, dict)
            else None
        )
        if shape is None or shape not in self._valid_shapes:
            try:
                if shape is None:
                    raise InvalidArgumentsError(
                        f"stored arguments of job {job.id} are not a JSON list and object "
                        f"(args: {type(job.args).__name__}, kwargs: {type(job.kwargs).__name__})"
                    )
                task.bind(job.args, job.kwargs)
            except InvalidArgumentsError as exc:
                self._dead(
                    held,
                    task,
                    DeadLetterReason.INVALID_PAYLOAD,
                    retry.PERMANENT,
                    "InvalidArgumentsError",
                    str(exc),
                )
                return
            if len(self._valid_shapes) >= MAX_REMEMBERED_SHAPES:
                self._valid_shapes.clear()
            self._valid_shapes.add(shape)
        scope = idempotency.scope_of(task) if job.idempotency_key else ""
        if job.idempotency_key:
            decision = idempotency.begin_execution(
                self.alias, task, job.id, job.idempotency_key, job.args, job.kwargs
            )
            if decision.action != idempotency.RUN:
                self._not_run(held, task, scope, decision)
                return
        if job.lock_key and not self._take_lock(held, task):
            return
        if task.timeout:
            held.deadline = held.started_at + task.timeout
        context = None
        if task.takes_context:
            context = JobContext(
                task=task,
                job_id=job.id,
                attempt=job.attempts,
                max_attempts=job.max_attempts,
                queue_name=job.queue_name,
                idempotency_key=job.idempotency_key,
                lock_key=job.lock_key,
                fencing_token=getattr(held.lock, "fencing_token", None),
                worker_id=self.worker_id,
                _lease_token=job.lease_token,
                _alias=self.alias,
            )
            held.context = context
        _dispatch.send(signals.job_started, job_id=job.id, task_name=job.task_name, attempt=job.attempts)
        began = time.perf_counter()
        try:
            try:
                if task.atomic:
                    with transaction.atomic(using=self.alias):
                        result = _invoke(task, context, job)
                        if _faults.ENABLED:
                            _faults.maybe_crash("after_effect")
                        self._ack(held, scope, result)
                else:
                    result = _invoke(task, context, job)
                    if _faults.ENABLED:
                        _faults.maybe_crash("after_effect")
                    if scope:
                        with transaction.atomic(using=self.alias):
                            self._ack(held, scope, result)
                    else:
                        self._ack(held, scope, result)
            finally:
                self._release_lock(held)
        except LeaseLost:
            metrics.lease_lost(job.queue_name, job.task_name, "ack")
            logger.warning(
                "ack_rejected job_id=%s; the lease moved on, nothing committed",
                job.id,
                extra=job_fields(job, self.worker_id, outcome="stale"),
            )
            return
        except _InvalidResultError as exc:
            self._dead(held, task, DeadLetterReason.INVALID_RESULT, retry.PERMANENT, "TypeError", str(exc))
            return
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            # SystemExit from a handler is a failing job, not a request to stop the worker.
            self._failed(held, task, exc, time.perf_counter() - began)
            return
        duration = time.perf_counter() - began
        if _faults.ENABLED:
            _faults.maybe_crash("after_complete")
        self._count("succeeded")
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
            signals.job_succeeded, job_id=job.id, task_name=job.task_name, result=result, duration=duration
        )

    def _note_run_time(self, seconds: float) -> None:
        # A plain float updated by several threads: a lost update only nudges an estimate.
        self._mean_run_seconds += RUN_TIME_SMOOTHING * (seconds - self._mean_run_seconds)

    def _ack(self, held: _Held, scope: str, result: Any) -> None:
        """Mark the job succeeded (and its idempotency key), fenced by the lease token."""
        job = held.job
        if held.state == "abandoned":
            raise LeaseLost(f"job {job.id}: abandoned past its hard timeout")
        if held.lock is not None and not held.lock_lost:
            # Check the lock once more just before the ack: if it is still ours, no one held
            # it since the acquire (an expired lock never comes back to the same token).
            self._renew_lock(held, time.monotonic())
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
        if scope and job.idempotency_key:
            idempotency.record_success(self.alias, scope, job.idempotency_key, job.id, result)
        if _faults.ENABLED:
            _faults.maybe_crash("in_complete")
        if not store.complete(self.alias, job.id, job.lease_token, result_json):
            raise LeaseLost(f"job {job.id}: lease lost before the ack")

    def _not_run(self, held: _Held, task: Any, scope: str, decision: idempotency.Decision) -> None:
        """A keyed job whose action succeeded already, is owned by another job, or conflicts."""
        job = held.job
        if decision.action == idempotency.CONFLICT:
            self._dead(
                held,
                task,
                DeadLetterReason.PERMANENT_ERROR,
                retry.PERMANENT,
                "django_jobguard.exceptions.IdempotencyConflict",
                decision.message,
            )
            return
        if decision.action == idempotency.WAIT:
            # Like a taken lock: back in the queue without using an attempt.
            delay = get_settings().locks.contention_delay
            logger.info(
                "idempotency_wait job_id=%s idempotency_key=%s; another job owns the key, retry in %.1fs",
                job.id,
                job.idempotency_key,
                delay,
                extra=job_fields(job, self.worker_id, outcome="idempotency_wait"),
            )
            if not store.requeue(
                self.alias, job.id, job.lease_token, delay=delay, error=None, refund_attempt=True
            ):
                metrics.lease_lost(job.queue_name, job.task_name, "requeue")
            else:
                self._count("put_back")
            return
        with transaction.atomic(using=self.alias):
            acked = store.complete(self.alias, job.id, job.lease_token, json.dumps(decision.result))
            if acked:
                idempotency.record_duplicate(self.alias, scope, job.idempotency_key or "")
        if not acked:
            metrics.lease_lost(job.queue_name, job.task_name, "ack")
            return
        self._count("succeeded")
        metrics.duplicate_prevented(job.task_name, "execution")
        logger.info(
            "job_duplicate job_id=%s idempotency_key=%s; stored result returned, handler not run",
            job.id,
            job.idempotency_key,
            extra=job_fields(job, self.worker_id, outcome="duplicate"),
        )

    # -- locks -------------------------------------------------------------------------

    def _take_lock(self, held: _Held, task: Any) -> bool:
        """Acquire the job's lock; on contention or outage, give the job back and say False.

        Neither case uses up an attempt: the handler did not run.
        """
        from . import locks

        job = held.job
        conf = get_settings().locks
        try:
            handle = locks.lock(job.lock_key, ttl=task.lock_ttl or conf.ttl)
        except ValueError as exc:
            self._dead(held, task, DeadLetterReason.INVALID_PAYLOAD, retry.PERMANENT, "ValueError", str(exc))
            return False
        try:
            acquired = handle.acquire(blocking=False)
        except LockUnavailable as exc:
            self._lock_unavailable(held, task, exc)
            return False
        if not acquired:
            delay = retry.backoff(
                RetryPolicy(
                    base=conf.contention_delay,
                    max=conf.contention_delay,
                    jitter=conf.contention_delay * CONTENTION_JITTER_FRACTION,
                ),
                1,
            )
            if not store.requeue(
                self.alias,
                job.id,
                job.lease_token,
                delay=delay,
                error=None,
                refund_attempt=True,
                contention=True,
            ):
                metrics.lease_lost(job.queue_name, job.task_name, "requeue")
                return False
            self._count("put_back")
            metrics.lock_contended(job.queue_name, job.task_name)
            logger.info(
                "lock_contended job_id=%s lock_key=%s; retry in %.2fs",
                job.id,
                job.lock_key,
                delay,
                extra=job_fields(job, self.worker_id, outcome="lock_contended"),
            )
            return False
        held.lock = handle
        held.lock_renewed_at = time.monotonic()
        return True

    def _lock_unavailable(self, held: _Held, task: Any, exc: LockUnavailable) -> None:
        """The lock back end did not answer: retry later with the transient backoff.

        The handler never runs unlocked, and no attempt is used: an outage of the lock
        store says nothing about the job, and must not dead-letter every locked job.
        """
        job = held.job
        metrics.lock_failed(job.queue_name, job.task_name, "unavailable")
        delay = retry.backoff(retry.policy_for(task, job.queue_name, retry.TRANSIENT), job.attempts)
        requeued = store.requeue(
            self.alias,
            job.id,
            job.lease_token,
            delay=delay,
            error=f"{LockUnavailable.__module__}.LockUnavailable: {exc}",
            refund_attempt=True,
        )
        if not requeued:
            metrics.lease_lost(job.queue_name, job.task_name, "requeue")
        else:
            self._count("put_back")
        logger.warning(
            "lock_unavailable job_id=%s lock_key=%s; handler not run, retry in %.2fs: %s",
            job.id,
            job.lock_key,
            delay,
            exc,
            extra=job_fields(job, self.worker_id, outcome="lock_unavailable"),
        )

    def _release_lock(self, held: _Held) -> None:
        handle, held.lock = held.lock, None
        if handle is None or held.lock_lost:
            return
        try:
            handle.release()
        except (LockUnavailable, LockNotAcquired) as exc:
            # Not ours any more, or unreachable: its TTL frees it.
            logger.warning(
                "lock_release_failed job_id=%s lock_key=%s: %s",
                held.job.id,
                held.job.lock_key,
                exc,
                extra=job_fields(held.job, self.worker_id),
            )

    # -- failures ----------------------------------------------------------------------

    def _failed(
        self,
        held: _Held,
        task: Any,
        exc: BaseException,
        duration: float | None,
        *,
        forced_category: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Classify a failed attempt: retry later with backoff, or dead-letter."""
        job = held.job
        if duration is not None:
            self._note_run_time(duration)
        category = forced_category or (
            retry.TRANSIENT if isinstance(exc, _LockLostError) else retry.classify(exc, task)
        )
        error_class = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
        message = str(exc)
        tb = "".join(traceback.format_exception(exc))
        if metrics.is_unique_violation(exc):
            metrics.unique_conflict(job.queue_name, job.task_name)
        if category == retry.PERMANENT:
            metrics.job_failed(job.queue_name, job.task_name, category, duration, retried=False)
            self._dead(
                held,
                task,
                reason or DeadLetterReason.PERMANENT_ERROR,
                category,
                error_class,
                message,
                tb,
                duration=duration,
            )
            return
        if job.attempts >= job.max_attempts:
            metrics.job_failed(job.queue_name, job.task_name, category, duration, retried=False)
            self._dead(
                held,
                task,
                reason or DeadLetterReason.RETRIES_EXHAUSTED,
                category,
                error_class,
                message,
                tb,
                duration=duration,
            )
            return
        delay = retry.delay_for(exc, task, job.queue_name, category, job.attempts)
        if _faults.ENABLED:
            _faults.maybe_crash("in_retry")
        if not store.requeue(
            self.alias,
            job.id,
            job.lease_token,
            delay=delay,
            error=f"{error_class}: {message}",
            attempt_error=(f"{type(exc).__module__}.{type(exc).__qualname__}", message, tb),
        ):
            metrics.lease_lost(job.queue_name, job.task_name, "retry")
            logger.warning(
                "retry_rejected job_id=%s; the lease moved on",
                job.id,
                extra=job_fields(job, self.worker_id, outcome="stale"),
            )
            return
        self._count("retried")
        metrics.job_failed(job.queue_name, job.task_name, category, duration, retried=True)
        logger.warning(
            "job_retry job_id=%s task=%s attempt=%d category=%s delay=%.2f error=%s",
            job.id,
            job.task_name,
            job.attempts,
            category,
            delay,
            error_class,
            extra=job_fields(job, self.worker_id, duration=duration, outcome="retry"),
        )
        _dispatch.send(
            signals.job_retried,
            job_id=job.id,
            task_name=job.task_name,
            attempt=job.attempts,
            error=exc,
            delay=delay,
        )

    def _dead(
        self,
        held: _Held,
        task: Any,
        reason: str,
        category: str,
        error_class: str,
        message: str,
        tb: str = "",
        *,
        duration: float | None = None,
    ) -> None:
        job = held.job
        if _faults.ENABLED:
            _faults.maybe_crash("in_dead_letter")
        try:
            dlq.dead_letter(
                self.alias,
                job.id,
                job.lease_token,
                reason=reason,
                category=category,
                error_class=error_class,
                error_message=message,
                traceback=tb,
                worker_id=self.worker_id,
                idempotency_scope=idempotency.scope_of(task) if task is not None else None,
            )
        except LeaseLost:
            metrics.lease_lost(job.queue_name, job.task_name, "dead_letter")
            logger.warning(
                "dead_letter_rejected job_id=%s reason=%s; the lease moved on",
                job.id,
                reason,
                extra=job_fields(job, self.worker_id, outcome="stale"),
            )
            return
        self._count("dead_lettered")
        logger.error(
            "job_dead_lettered job_id=%s task=%s reason=%s error=%s",
            job.id,
            job.task_name,
            reason,
            error_class,
            extra=job_fields(job, self.worker_id, duration=duration, outcome="dead"),
        )

    # -- heartbeat ---------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        try:
            while not self._heartbeat_stop.wait(HEARTBEAT_TICK_SECONDS):
                try:
                    self._heartbeat_once()
                    self._touch_liveness_file()
                except (DatabaseError, InterfaceError):
                    logger.warning("heartbeat_failed worker_id=%s", self.worker_id, exc_info=True)
                    connections[self.alias].close()
                except Exception:
                    logger.exception("heartbeat_crashed worker_id=%s", self.worker_id)
        finally:
            connections.close_all()

    def _touch_liveness_file(self) -> None:
        """Show a liveness probe that heartbeats still run (skipped while they fail)."""
        path = get_settings().liveness_file
        now = time.monotonic()
        if not path or now - self._liveness_touched_at < LIVENESS_TOUCH_SECONDS:
            return
        self._liveness_touched_at = now
        try:
            with open(path, "a"):
                os.utime(path)
        except OSError:
            logger.warning("liveness_file_failed worker_id=%s path=%s", self.worker_id, path, exc_info=True)

    def _heartbeat_once(self) -> None:
        now = time.monotonic()
        with self._lock:
            active = [h for h in self._held.values() if h.state in ("waiting", "running")]
        # Locks first, and even for jobs whose lease is lost: the handler still runs, so its
        # resource stays locked until it returns. A database error below must not stop them.
        for h in active:
            handle = h.lock
            if (
                handle is not None
                and not h.lock_lost
                and now - h.lock_renewed_at >= handle.ttl * HEARTBEAT_FRACTION
            ):
                self._renew_lock(h, now)
        held = [h for h in active if not h.lease_lost]
        due = [h for h in held if now - h.renewed_at >= h.job.visibility_timeout * HEARTBEAT_FRACTION]
        if due:
            if _faults.ENABLED:
                _faults.maybe_crash("in_heartbeat")
            cancels: set[int] = set()
            renewed = store.heartbeat(
                self.alias, [(h.job.id, h.job.lease_token) for h in due], cancel_requested=cancels
            )
            for h in due:
                if h.job.id in renewed:
                    h.renewed_at = now
                    if h.job.id in cancels and h.context is not None:
                        h.context._cancel_requested.set()
                else:
                    h.lease_lost = True
                    if h.context is not None:
                        h.context._lease_lost.set()
                    metrics.lease_lost(h.job.queue_name, h.job.task_name, "heartbeat")
                    logger.warning(
                        "lease_lost job_id=%s; another worker may run it now",
                        h.job.id,
                        extra=job_fields(h.job, self.worker_id, outcome="lease_lost"),
                    )
        for h in held:
            if h.deadline is not None and now >= h.deadline and h.state == "running":
                self._abandon(h)
        # The worker's own row and the outcome counts: one upsert each per beat interval.
        self._beat.maybe_beat(now, len(active))

    def _renew_lock(self, held: _Held, now: float) -> None:
        """Extend the job's lock; if it is gone, say so to the handler and refuse the ack."""
        handle = held.lock
        if handle is None:
            return
        try:
            kept = handle.extend()
            cause = "it expired, and another owner may have taken it"
        except LockUnavailable as exc:
            # Unknown is lost: the store may have restarted empty and given the key away.
            kept, cause = False, str(exc)
        if kept:
            held.lock_renewed_at = now
            return
        if held.lock is not handle or held.lock_lost:
            return  # released by the executor meanwhile, or already reported
        held.lock_lost = True
        if held.context is not None:
            held.context._lock_lost.set()
        metrics.lock_failed(held.job.queue_name, held.job.task_name, "lost")
        logger.warning(
            "lock_lost job_id=%s lock_key=%s; the job will not be acked: %s",
            held.job.id,
            held.job.lock_key,
            cause,
            extra=job_fields(held.job, self.worker_id, outcome="lock_lost"),
        )

    def _abandon(self, held: _Held) -> None:
        """Fail a job past its hard timeout and replace the thread stuck in it."""
        with self._lock:
            if held.state != "running":
                return
            held.state = "abandoned"
            self._held.pop(held.job.id, None)
            self._abandoned += 1
        task = registry.find(held.job.task_name)
        timeout = task.timeout if task else None
        error = TimeoutError(f"the handler ran past its hard timeout of {timeout}s; its thread was abandoned")
        self._failed(
            held, task, error, None, forced_category=retry.TRANSIENT, reason=DeadLetterReason.HARD_TIMEOUT
        )
        # The lock stays with the stuck handler; without renewals its TTL frees it.
        self._slot_freed.set()
        if self._abandoned > MAX_ABANDONED_THREADS:
            logger.error("too_many_abandoned_threads worker_id=%s; stopping for a restart", self.worker_id)
            self.stop()
            return
        self._start_executor(len(self._threads))

    # -- shutdown ----------------------------------------------------------------------

    def _hand_back(self, held: _Held, *, refund: bool) -> None:
        job = held.job
        started = held.state in ("running", "abandoned")
        if store.requeue(self.alias, job.id, job.lease_token, delay=0, error=None, refund_attempt=refund):
            self._count("put_back")
            logger.info(
                "job_handed_back job_id=%s started=%s",
                job.id,
                started,
                extra=job_fields(job, self.worker_id, outcome="handed_back"),
            )
        with self._lock:
            held.state = "handed_back"

    def _cut_connection(self, held: _Held) -> None:
        """Close the database connection of a job's executor thread from this thread (SQLite).

        Its open transaction is rolled back and its handler's next query fails. Django lets
        SQLite connections cross threads (``check_same_thread=False``); interrupting first
        ends a statement in progress.
        """
        raw = getattr(held.connection, "connection", None)
        if raw is None:
            return
        try:
            raw.interrupt()
            raw.close()
        except Exception:  # the connection may be closing already: nothing left to cut
            logger.debug("connection_cut_failed job_id=%s", held.job.id, exc_info=True)
        logger.info(
            "job_connection_closed job_id=%s; its transaction rolled back so it can be handed back",
            held.job.id,
            extra=job_fields(held.job, self.worker_id, outcome="handed_back"),
        )

    def _shutdown(self) -> bool:
        """Hand back what did not start, wait for the rest; True if threads had to be abandoned."""
        self._stopping = True
        for _ in self._threads:
            self._ready.put(None)
        deadline = time.monotonic() + (0 if self._forced else self.shutdown_grace)
        cut = not store.writes_while_busy(self.alias)
        deferred: list[_Held] = []
        while True:
            with self._lock:
                running = [h for h in self._held.values() if h.state == "running"]
                waiting = [h for h in self._held.values() if h.state == "waiting"]
                for h in waiting:
                    h.state = "handing_back"
            if cut and running:
                # SQLite: a running job's transaction would make these hand-backs wait for the
                # write lock (and fail after the busy timeout): hand them back once it is gone.
                deferred += waiting
                waiting = []
            elif deferred:
                waiting, deferred = waiting + deferred, []
            for h in waiting:
                try:
                    self._hand_back(h, refund=True)
                except (DatabaseError, InterfaceError):
                    logger.warning("hand_back_failed job_id=%s; its lease will expire", h.job.id)
                with self._lock:
                    self._held.pop(h.job.id, None)
            if not running:
                break
            if time.monotonic() >= deadline or self._forced:
                for h in running:
                    with self._lock:
                        if h.state != "running":
                            continue
                        h.state = "abandoned"
                    if cut:
                        # SQLite: a running job's open transaction (an atomic task's, or one its
                        # handler opened) holds the database's only write lock, so no hand-back
                        # could commit while it lives. Closing the job's connection rolls that
                        # transaction back (nothing of the attempt is kept, as if the process
                        # had died) and leaves the handler no way to write; then the job is
                        # handed back like on PostgreSQL, instead of waiting for its lease.
                        self._cut_connection(h)
                    try:
                        # The attempt is refunded: the worker stopped it, the job did not fail.
                        self._hand_back(h, refund=True)
                    except (DatabaseError, InterfaceError):
                        logger.warning("hand_back_failed job_id=%s; its lease will expire", h.job.id)
                    if cut:
                        self._release_lock(h)  # its handler can no longer write: free the resource
                    # Otherwise its lock stays with the handler, which runs until the process
                    # exits; the TTL frees it after that.
                for h in deferred:
                    try:
                        self._hand_back(h, refund=True)
                    except (DatabaseError, InterfaceError):
                        logger.warning("hand_back_failed job_id=%s; its lease will expire", h.job.id)
                return True
            self._slot_freed.wait(0.1)
            self._slot_freed.clear()
        for thread in self._threads:
            thread.join(timeout=1)
        return self._abandoned > 0
