"""The async executor: ``async def`` tasks as coroutines on one event loop per process.

``jobguard_worker --async-slots N`` starts it. :meth:`Slots.route` sends the claimed jobs of
coroutine tasks here; everything else (sync tasks, unknown names) stays on the executor
threads. Each job becomes one asyncio task on the **loop thread**; up to N run at once.

Database work never happens on the loop (Django forbids it there, and it would stall every
coroutine): it goes to a small pool of **DB threads** (:data:`DB_THREADS`, each with its own
connection) or to the completer's ack thread, so the connections do not grow with the slots:

- claims stay on the main thread, lease renewals on the heartbeat thread (one statement for
  every held job), and the acks of non-atomic tasks on the ack thread, batched;
- the idempotency check and the lock (only for jobs with a key), failures, retries, dead
  letters and hand-backs run on a DB thread;
- an ``atomic=True`` coroutine task is handed to a DB thread whole: its handler runs there
  under ``async_to_sync`` inside the transaction, with the ack as its last statement. At most
  ``DB_THREADS - 1`` of them run at once, so one DB thread is always left for the settles.

A hard ``timeout`` cancels the job's own coroutine (:class:`~.pipeline.HandlerTimedOut`), not a
thread. A coroutine that blocks the loop (``time.sleep``, a sync client, CPU work) stalls all
the others, and no timeout can fire: the watch thread sees the loop miss its tick and logs
``event_loop_blocked`` with the task name, the job id and the line it is stuck on. While the
loop stays blocked, the heartbeat thread (:meth:`AsyncExecutor.overdue`, :meth:`~AsyncExecutor.stuck`)

- fails the blocking job once it is past its own ``timeout`` (the watchdog abandons it, as it
  does a thread: what the coroutine returns later is refused);
- stops renewing the leases of the jobs waiting behind it once the stall outlasts their
  ``timeout`` (their visibility timeout if they have none): they expire, the reaper puts them
  back, other workers run them; one not started yet is handed back when the loop runs again,
  not started;

and a stall longer than the longest ``timeout`` of the async tasks plus
:data:`WEDGED_MARGIN_SECONDS` stops the worker, with an ERROR ``event_loop_wedged``, for its
supervisor to restart (:meth:`AsyncExecutor.watch`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import async_to_sync, sync_to_async
from django.db import DatabaseError, InterfaceError, connections

from .. import _dispatch, _faults, signals, store
from ..conf import get_settings
from ..context import JobContext
from ..exceptions import LeaseLost
from ..log import job_fields, log_job_exception
from ..outcome import HeldState, Outcome, PutBack, PutBackCause, Succeeded
from ..registry import registry
from ..task import Task
from . import pipeline
from .executor import hand_back
from .held import LOGGER_NAME, Held, close_connection
from .leases import write_last_progress

if TYPE_CHECKING:
    from .completer import Completer
    from .slots import Slots

logger = logging.getLogger(LOGGER_NAME)

__all__ = [
    "BLOCKED_AFTER_SECONDS",
    "DB_THREADS",
    "LAG_SAMPLE_SECONDS",
    "WEDGED_MARGIN_SECONDS",
    "AsyncExecutor",
    "is_coroutine_task",
]

#: Threads (each with one database connection) doing the database work of the coroutines.
DB_THREADS = 3
#: How often the loop measures its lag: a sleep of this long that wakes late, by the lag.
LAG_SAMPLE_SECONDS = 0.1
#: A loop that has not ticked for this long is blocked by the coroutine running on it.
BLOCKED_AFTER_SECONDS = 0.5
#: A sync task refused by a worker without threads goes back for this long, for another worker.
REFUSED_DELAY_SECONDS = 5.0
#: The least time between two ``event_loop_busy`` records of one worker.
BUSY_LOG_SECONDS = 60.0
#: How long the exit waits for the cancelled coroutines to unwind.
STOP_WAIT_SECONDS = 5.0
#: A loop blocked this much longer than the longest ``timeout`` of the async tasks stops the worker.
WEDGED_MARGIN_SECONDS = 10.0

_T = TypeVar("_T")


def is_coroutine_task(task: Task[Any, Any] | None) -> bool:
    """Whether ``task``'s handler is an ``async def`` (run on the loop in async mode)."""
    return task is not None and inspect.iscoroutinefunction(task.func)


async def _bounded(func: Callable[..., Any], args: Any, kwargs: dict[str, Any], timeout: float | None) -> Any:
    """Await the handler, cancelled past ``timeout`` seconds (a :class:`~.pipeline.HandlerTimedOut`)."""
    if not timeout:
        return await func(*args, **kwargs)
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            result = await func(*args, **kwargs)
    except TimeoutError:
        if scope.expired():
            raise pipeline.HandlerTimedOut(
                f"the handler ran past its hard timeout of {timeout}s; its coroutine was cancelled"
            ) from None
        raise  # the handler's own TimeoutError
    deadline = scope.when()
    if deadline is not None and asyncio.get_running_loop().time() >= deadline:
        # Blocking code held the loop past the deadline, so the cancel never ran: the result
        # came too late all the same.
        raise pipeline.HandlerTimedOut(
            f"the handler ran past its hard timeout of {timeout}s, blocking its event loop"
        )
    return result


def _invoke_blocking(task: Task[Any, Any], context: JobContext | None, job: store.ClaimedJob) -> Any:
    """Run a coroutine handler to completion in this DB thread (an atomic task's hand-off)."""
    args = (context, *job.args) if context is not None else job.args
    return async_to_sync(_bounded)(task.func, args, job.kwargs, task.timeout)


class _DBThreads(concurrent.futures.Executor):
    """A fixed set of threads for the coroutines' database work; each closes its connection on exit.

    (A ThreadPoolExecutor would leave its threads' connections open after shutdown.)
    """

    def __init__(self, count: int, alias: str) -> None:
        self.alias = alias
        self._local = threading.local()
        self._work: queue.SimpleQueue[tuple[concurrent.futures.Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._serve, name=f"jobguard-aio-db-{index}", daemon=True)
            for index in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._work.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let each thread exit once its work is done; wait up to STOP_WAIT_SECONDS for the idle ones.

        A thread still inside an abandoned atomic handler is not waited for: it dies with the process.
        """
        for _ in self._threads:
            self._work.put(None)
        if wait:
            deadline = time.monotonic() + STOP_WAIT_SECONDS
            for thread in self._threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def cursor_lock(self) -> threading.RLock | None:
        """This DB thread's cursor lock (SQLite: shutdown may cut its connection under it)."""
        lock: threading.RLock | None = getattr(self._local, "cursor_lock", None)
        return lock

    def _serve(self) -> None:
        self._local.cursor_lock = store.cursor_lock(self.alias)
        try:
            while (item := self._work.get()) is not None:
                future, call = item
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(call())
                except BaseException as exc:  # handed to the awaiting coroutine
                    future.set_exception(exc)
        finally:
            connections.close_all()


class AsyncExecutor:
    """Runs the coroutine jobs of one worker on an event loop thread, ``size`` at most at once."""

    def __init__(
        self,
        slots: Slots,
        completer: Completer,
        runtime: pipeline.Runtime,
        *,
        size: int,
        db_threads: int = DB_THREADS,
        threads: bool = True,
    ) -> None:
        if size < 1:
            raise ValueError("async slots must be at least 1")
        self.slots = slots
        self.completer = completer
        self.runtime = runtime
        self.size = size
        #: Whether the worker has executor threads for sync tasks; without, this runs every job
        #: and refuses the sync ones (:data:`~django_jobguard.outcome.PutBackCause.NEEDS_THREAD`).
        self.threads = threads
        self.alias = runtime.alias
        self.worker_id = runtime.worker_id
        #: The runtime of the pipeline steps run on a DB thread (an atomic handler runs there).
        self._thread_runtime = pipeline.Runtime(
            runtime.alias, runtime.worker_id, completer, runtime.valid_shapes, invoke=_invoke_blocking
        )
        self._db_threads = db_threads
        self._db: _DBThreads | None = None  # started with the loop
        self._handoffs = max(1, db_threads - 1)
        #: Replaced as the loop starts (a semaphore belongs to the loop it is first used on).
        self._handoff_semaphore = asyncio.Semaphore(self._handoffs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._started = threading.Event()
        self._stopped = threading.Event()
        self._stop: asyncio.Event | None = None
        self._jobs: set[asyncio.Task[None]] = set()
        self._is_async: dict[str, bool] = {}
        #: Coroutines inside their pipeline now (the slots in use).
        self.running = 0
        #: The loop's last measured lag, and the most since :meth:`sample`, in seconds.
        self.lag = 0.0
        self._max_lag = 0.0
        self._last_tick = time.monotonic()
        #: The job whose coroutine holds the blocked loop, as the watch thread found it.
        self.blocked_by: Held | None = None
        self._wedged_after: float | None = None
        #: Runs and settles a job in its trace's spans; None (and no OpenTelemetry import)
        #: unless JOBGUARD["OPENTELEMETRY"] is on.
        self._traced: Callable[[Held], Awaitable[None]] | None = None
        if get_settings().opentelemetry:
            from . import tracing  # an optional extra: imported only when enabled

            self._traced = functools.partial(
                tracing.run_async,
                runtime=runtime,
                run_pipeline=self._counted,
                settle=self._settle,
                in_thread=self._in_thread,
            )

    # -- wiring ---------------------------------------------------------------------------

    def routes(self, job: store.ClaimedJob) -> bool:
        """Whether a claimed job comes here: its task is a coroutine function, or there are no threads."""
        return not self.threads or self._coroutine(job.task_name)

    def _coroutine(self, name: str) -> bool:
        known = self._is_async.get(name)
        if known is None:
            known = self._is_async[name] = is_coroutine_task(pipeline.resolve_task(name))
        return known

    def submit(self, helds: list[Held]) -> None:
        """Start coroutines for freshly claimed jobs (called by the claimer's thread)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the async executor's loop is not running")
        loop.call_soon_threadsafe(self._start_all, helds)

    def sample(self) -> tuple[int, float]:
        """Coroutines running now, and the worst lag (seconds) since the last sample (the beat row)."""
        worst, self._max_lag = max(self._max_lag, self.lag), self.lag
        return self.running, worst

    # -- a blocked loop (asked by the heartbeat thread) ----------------------------------

    def stalled(self, now: float) -> float:
        """Seconds since the loop last ticked (0 before it started)."""
        return max(0.0, now - self._last_tick) if self._loop is not None else 0.0

    def overdue(self, now: float) -> Held | None:
        """The job blocking the loop once it is past its own ``timeout`` (no timeout can cancel it)."""
        held = self.blocked_by
        if held is None or held.state is not HeldState.RUNNING or self.stalled(now) < BLOCKED_AFTER_SECONDS:
            return None
        task = pipeline.resolve_task(held.job.task_name)
        timeout = task.timeout if task is not None else None
        return held if timeout and now - held.started_at >= timeout else None

    def stuck(self, active: list[Held], now: float) -> list[Held]:
        """The jobs on the loop that waited behind a stall longer than their own bound.

        The bound is the task's ``timeout``, or the job's visibility timeout without one. The
        job blocking the loop is not among them, nor an atomic one on a DB thread (it runs).
        """
        stalled = self.stalled(now)
        if stalled < BLOCKED_AFTER_SECONDS:
            return []
        blocking = {id(self.blocked_by), id(self._blocking_job()[0])}
        return [
            h
            for h in active
            if h.on_loop
            and not h.lease_lost
            and h.connection is None
            and id(h) not in blocking
            and stalled >= max(self._bound(h), BLOCKED_AFTER_SECONDS)
        ]

    @staticmethod
    def _bound(held: Held) -> float:
        task = pipeline.resolve_task(held.job.task_name)
        return (task.timeout if task is not None else None) or held.job.visibility_timeout

    def wedged_after(self) -> float | None:
        """Seconds of stall that stop the worker: the longest async task ``timeout`` plus the margin.

        None when no async task has a ``timeout``: then nothing says how long one may hold the loop.
        """
        if self._wedged_after is None:
            timeouts = [
                task.timeout
                for name in registry.names()
                if (task := registry.find(name)) is not None and is_coroutine_task(task) and task.timeout
            ]
            self._wedged_after = max(timeouts) + WEDGED_MARGIN_SECONDS if timeouts else 0.0
        return self._wedged_after or None

    # -- the loop thread -----------------------------------------------------------------

    def run(self) -> None:
        """The loop thread: run coroutines until :meth:`stop`."""
        self._db = _DBThreads(self._db_threads, self.alias)
        try:
            asyncio.run(self._main())
        finally:
            self._started.set()
            self._stopped.set()

    def wait_started(self, timeout: float = 10.0) -> None:
        if not self._started.wait(timeout) or self._loop is None:
            raise RuntimeError("the async executor's loop did not start")

    def stop(self, timeout: float = STOP_WAIT_SECONDS) -> None:
        """Cancel what still runs (shutdown handed those jobs back already) and end the loop."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not self._stopped.is_set():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
            self._stopped.wait(timeout)
        if self._db is not None:
            self._db.shutdown()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stop = asyncio.Event()
        self._handoff_semaphore = asyncio.Semaphore(self._handoffs)
        self._last_tick = time.monotonic()
        lag = asyncio.create_task(self._measure_lag())
        self._started.set()
        await self._stop.wait()
        lag.cancel()
        for job in list(self._jobs):
            job.cancel()
        if self._jobs:
            await asyncio.wait(list(self._jobs), timeout=STOP_WAIT_SECONDS)
        # Handlers reach the ORM through Django's sync_to_async (its one shared thread): close
        # the connection that thread opened for them.
        await sync_to_async(connections.close_all)()

    async def _measure_lag(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(LAG_SAMPLE_SECONDS)
            now = self._last_tick = time.monotonic()
            self.lag = max(0.0, now - before - LAG_SAMPLE_SECONDS)
            self._max_lag = max(self._max_lag, self.lag)

    def _start_all(self, helds: list[Held]) -> None:
        for held in helds:
            job = asyncio.create_task(self._run(held), name=f"jobguard-job-{held.job.id}")
            self._jobs.add(job)
            job.add_done_callback(self._jobs.discard)

    # -- one job -------------------------------------------------------------------------

    async def _run(self, held: Held) -> None:
        """Run (or hand back) one held job and settle it; the slot is freed whatever happens."""
        try:
            if held.lease_lost and held.state is HeldState.WAITING:
                # Its lease was given up while it waited (a blocked loop, a failed renewal): the
                # job may be running elsewhere by now, so it goes back (if still ours), unstarted.
                await self._settle(held, hand_back(held))
            elif self.slots.start(held, None):
                if self._traced is None:
                    await self._settle(held, await self._counted(held))
                else:
                    await self._traced(held)
            elif held.state is HeldState.WAITING:
                await self._settle(held, hand_back(held))
        except asyncio.CancelledError:
            pass  # the worker stops past its grace period: shutdown handed the job back
        except (DatabaseError, InterfaceError):
            # The DB thread closed its connection already (see _in_thread): the job keeps its
            # lease until it expires, and the reaper gives it back.
            log_job_exception(
                logger,
                logging.WARNING,
                "job_db_error job_id=%s; connection reset",
                held.job.id,
                job=held.job,
                worker_id=self.worker_id,
                outcome="db_error",
            )
        except Exception:
            log_job_exception(
                logger,
                logging.ERROR,
                "job_crashed job_id=%s",
                held.job.id,
                job=held.job,
                worker_id=self.worker_id,
                outcome="crashed",
            )
        finally:
            self.slots.finish(held)

    async def _counted(self, held: Held) -> Outcome:
        """The job's pipeline, counted among the slots in use while it runs."""
        self.running += 1
        try:
            return await self._pipeline(held)
        finally:
            self.running -= 1

    async def _pipeline(self, held: Held) -> Outcome:
        job = held.job
        if not self.threads and not self._coroutine(job.task_name) and pipeline.resolve_task(job.task_name):
            return PutBack(
                PutBackCause.NEEDS_THREAD,
                REFUSED_DELAY_SECONDS,
                f"refused by worker {self.worker_id}: {job.task_name} is not an async def task, and this "
                f"worker runs only those (--concurrency 0); serve queue {job.queue_name!r} with a worker "
                "that has threads",
            )
        if job.idempotency_key or job.lock_key:
            step = await self._in_thread(pipeline.prepare, held, self._thread_runtime)
        else:
            step = pipeline.prepare(held, self.runtime)  # no I/O without a key
        if not isinstance(step, tuple):
            return step
        task, scope = step
        if task.atomic:
            async with self._handoff_semaphore:
                return await self._in_thread(self._run_atomic, held, task, scope)
        return await self._run_handler(held, task, scope)

    def _run_atomic(self, held: Held, task: Task[Any, Any], scope: str) -> Outcome:
        """On a DB thread: the handler and its ack in one transaction on this thread's connection."""
        # Shutdown may cut this connection past the grace period (SQLite, see shutdown.py).
        held.connection = connections[self.alias]
        held.cursor_lock = self._db.cursor_lock() if self._db is not None else None
        return pipeline.run_handler(self._thread_runtime, held, task, scope)

    async def _run_handler(self, held: Held, task: Task[Any, Any], scope: str) -> Outcome:
        """The handler on the loop, then its ack (batched) or what its failure makes of it."""
        rt, job = self.runtime, held.job
        context = pipeline.make_context(rt, held, task) if task.takes_context else None
        _dispatch.send(signals.job_started, job_id=job.id, task_name=job.task_name, attempt=job.attempts)
        args = (context, *job.args) if context is not None else job.args
        began = time.perf_counter()
        try:
            try:
                result = await _bounded(task.func, args, job.kwargs, task.timeout)
                if context is not None and context.reported_progress is not None:
                    await self._in_thread(write_last_progress, self.alias, held)
                if _faults.ENABLED:
                    _faults.maybe_crash("after_effect")
                if held.lock is None and self.completer.batches_acks:
                    result, ack_json = pipeline.after_handler(rt, held, scope, result)  # no I/O
                else:
                    result, ack_json = await self._in_thread(pipeline.after_handler, rt, held, scope, result)
            finally:
                if held.lock is not None:
                    await self._in_thread(pipeline.release_lock, held, self.worker_id)
        except (KeyboardInterrupt, GeneratorExit, asyncio.CancelledError):
            raise
        except BaseException as exc:
            # Taken over: the watchdog failed it as it blocked the loop past its timeout.
            error: BaseException = exc
            if self.slots.taken_over(held):
                error = LeaseLost(f"job {job.id}: abandoned past its hard timeout")
            return pipeline.handler_outcome(job, task, error, time.perf_counter() - began)
        return Succeeded(result, time.perf_counter() - began, ack_json, scope)

    async def _settle(self, held: Held, outcome: Outcome) -> None:
        if type(outcome) is Succeeded and outcome.ack_json is not None:
            self.completer.settle(held, outcome)  # a hand-over to the ack thread: no I/O
        else:
            await self._in_thread(self.completer.settle_run, held, outcome)

    async def _in_thread(self, func: Callable[..., _T], *args: Any) -> _T:
        """``func(*args)`` on a DB thread; a database error closes that thread's connection."""
        loop = asyncio.get_running_loop()
        # In the job's context (as asyncio.to_thread does): its current span, when traced.
        call = functools.partial(contextvars.copy_context().run, self._guarded, func, *args)
        return await loop.run_in_executor(self._db, call)

    def _guarded(self, func: Callable[..., _T], *args: Any) -> _T:
        try:
            return func(*args)
        except (DatabaseError, InterfaceError):
            close_connection(self.alias)  # the next query on this thread reconnects
            raise

    # -- the watch thread ----------------------------------------------------------------

    def watch(self, stopping: Callable[[], bool], on_wedged: Callable[[], None] | None = None) -> None:
        """Log a loop that misses its ticks, and the job blocking it; until ``stopping()``.

        A stall is blamed on a job only when every look during it found that job's coroutine
        on the loop thread: one coroutine holding the loop. A loop that is
        merely busy (more ready coroutines than one core runs) shows a different job, or none,
        at each look: that is logged as ``event_loop_busy``, at most once a minute. A stall
        past :meth:`wedged_after` is logged at ERROR and ``on_wedged()`` called (once).
        """
        looks: list[tuple[Held | None, str]] = []
        reported = wedged = False
        busy_logged_at = -BUSY_LOG_SECONDS
        while not self._stopped.wait(LAG_SAMPLE_SECONDS):
            if stopping() and self.running == 0:
                return
            stalled = time.monotonic() - self._last_tick
            if stalled < 2 * LAG_SAMPLE_SECONDS:
                if reported:
                    logger.info(
                        "event_loop_unblocked worker_id=%s blocked_for=%.2fs",
                        self.worker_id,
                        self.lag,
                        extra={"worker_id": self.worker_id},
                    )
                looks, reported, self.blocked_by = [], False, None
                continue
            looks.append(self._blocking_job())
            limit = self.wedged_after()
            if not wedged and limit is not None and stalled >= limit:
                wedged = True
                self._report_wedged(looks[-1], stalled, limit)
                if on_wedged is not None:
                    on_wedged()
            if reported or stalled < BLOCKED_AFTER_SECONDS:
                continue
            self.lag = max(self.lag, stalled)
            self._max_lag = max(self._max_lag, stalled)
            held, where = looks[0]
            # The same job at every look (its line may move: a CPU loop), not one of many.
            if held is not None and all(look[0] is held for look in looks):
                self._report_blocked(held, where, stalled)
                self.blocked_by = held
                reported = True
            elif time.monotonic() - busy_logged_at >= BUSY_LOG_SECONDS:
                busy_logged_at = time.monotonic()
                reported = True
                logger.warning(
                    "event_loop_busy worker_id=%s lag=%.2fs running=%d; more coroutines are ready than "
                    "this process's core runs: fewer --async-slots or more processes",
                    self.worker_id,
                    stalled,
                    self.running,
                    extra={"worker_id": self.worker_id},
                )

    def _report_blocked(self, held: Held, where: str, stalled: float) -> None:
        logger.warning(
            "event_loop_blocked worker_id=%s task=%s job_id=%s blocked_for=%.2fs at=%s; the coroutine runs "
            "blocking code (time.sleep, a sync client, CPU work) and every other coroutine waits",
            self.worker_id,
            held.job.task_name,
            held.job.id,
            stalled,
            where,
            extra=job_fields(held.job, self.worker_id, outcome="loop_blocked"),
        )

    def _report_wedged(self, look: tuple[Held | None, str], stalled: float, limit: float) -> None:
        held, where = self.blocked_by or look[0], look[1]
        job = held.job if held is not None else None
        logger.error(
            "event_loop_wedged worker_id=%s task=%s job_id=%s blocked_for=%.2fs at=%s; longer than the "
            "longest async task timeout plus %.0fs (%.1fs): stopping the worker for its supervisor to "
            "restart it, the jobs it holds go back to the queue",
            self.worker_id,
            job.task_name if job is not None else "?",
            job.id if job is not None else "?",
            stalled,
            where,
            WEDGED_MARGIN_SECONDS,
            limit,
            extra=job_fields(job, self.worker_id, outcome="loop_wedged")
            if job is not None
            else {"worker_id": self.worker_id},
        )

    def _blocking_job(self) -> tuple[Held | None, str]:
        """The job whose coroutine runs on the loop thread now, and the line it is on."""
        ident = self._loop_thread
        frames = sys._current_frames()  # noqa: SLF001 (the documented way to see another thread's stack)
        frame = frames.get(ident) if ident is not None else None
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        code = AsyncExecutor._run.__code__
        while frame is not None:
            if frame.f_code is code:
                held = frame.f_locals.get("held")
                return (held if isinstance(held, Held) else None), where
            frame = frame.f_back
        return None, where
