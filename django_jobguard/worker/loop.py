"""The worker process loop: claim with capacity, wake-ups, maintenance passes, OS signals, shutdown.

One process runs:

- the **main thread**, which claims batches of due jobs (never more than it has room
  for), runs the maintenance passes (:mod:`django_jobguard.maintenance`) on their
  intervals, and sleeps on LISTEN/NOTIFY (PostgreSQL) or a poll timer when there is
  nothing to do;
- ``concurrency`` **executor threads** (:mod:`.executor`), each with its own database
  connection, running one job at a time through :mod:`.pipeline`;
- a **heartbeat thread** (:mod:`.heartbeat_thread`) that extends the leases (and renews the locks)
  of held jobs every third of their visibility timeout, and fails jobs past their hard
  ``timeout`` (:mod:`.watchdog`);
- with ``--async-slots``, an **event loop thread** running the ``async def`` tasks as
  coroutines, its few DB threads and a watch thread (:mod:`.aio`);
- unless ``--burst`` (or with ``RETENTION["INTERVAL"]`` 0), a **retention thread**
  (:mod:`django_jobguard.maintenance.job_pruner`) that deletes finished jobs past their
  retention while this worker is the one elected to;
- unless ``--burst`` (or with ``OUTBOX["RELAY"]`` off, or no destination declared), the
  **outbox relay** (:mod:`django_jobguard.outbox.relay`): a thread that claims keys with
  messages to deliver and ``OUTBOX["RELAY_CONCURRENCY"]`` threads that deliver them;
- with ``ACK_WINDOW`` above 0, an **ack thread** that writes the acks of non-atomic tasks
  in batches (:meth:`.completer.Completer.run_acks`), and writes what is left before the exit.

SIGTERM / SIGINT stop the claiming; jobs not started are handed back at once, running
ones get ``SHUTDOWN_GRACE`` seconds, and what is still running then is handed back (it
will run again: handlers must be idempotent). On SQLite the running jobs' connections are
closed first, rolling their transactions back, since an open one blocks every write. A
second signal skips the grace period. An internal thread that dies stops the worker with
a CRITICAL record and exit code :data:`EXIT_THREAD_DIED`.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from .. import _faults, breakers, events, store
from ..conf import WORKER_ID_MAX_LENGTH, get_settings
from ..flow import Throttle
from ..maintenance import Maintenance
from ..monitoring import beats
from ..outbox import relay as outbox_relay
from ..outcome import Tally
from ..registry import registry
from ..store import schema
from .aio import BLOCKED_AFTER_SECONDS, AsyncExecutor
from .completer import Completer
from .executor import Executor
from .heartbeat_thread import Heartbeat
from .held import LOGGER_NAME, close_connection
from .leases import LeaseKeeper
from .outage import DatabaseOutage, backoff_delay
from .pipeline import Runtime
from .shutdown import Shutdown
from .slots import Slots
from .watchdog import Watchdog

logger = logging.getLogger(LOGGER_NAME)

__all__ = [
    "EXIT_LOOP_WEDGED",
    "EXIT_NOT_MIGRATED",
    "EXIT_THREAD_DIED",
    "OUTCOMES",
    "Worker",
    "claim_size",
    "default_worker_id",
    "finishes_to_wait",
]

#: Back-off after a database error in the loop (the connection is reopened), doubling to the max,
#: jittered (:func:`.outage.backoff_delay`).
DB_ERROR_BACKOFF_SECONDS = 0.5
#: Shortest wait for a rate's next start, in seconds: a fast rate is claimed in batches of its
#: burst, not one claim per start.
RATE_WAIT_MIN_SECONDS = 0.005
DB_ERROR_BACKOFF_MAX_SECONDS = 5.0
#: Past this mean handler time (seconds) a worker stops holding more jobs than it can start.
PREFETCH_MAX_RUN_SECONDS = 1.0
#: Handler time (seconds) a worker holds per executor thread once it knows its jobs are short:
#: the longest a held job waits for its thread, and what decides how rarely it claims.
PREFETCH_TARGET_SECONDS = 0.02
#: The most jobs that adaptive prefetch holds (unless twice the concurrency is more).
PREFETCH_MAX_JOBS = 128
#: Weight of the newest run in the mean handler time.
RUN_TIME_SMOOTHING = 0.1
#: With async slots, the claimer refills once this many slots are free, or a tenth of them if
#: more (never more than half). Refilling only at half of 500 slots starts 250 coroutines at
#: once, which holds the loop up for tens of milliseconds, and leaves a quarter of the slots
#: empty on average (measured in benchmarks/bench_slow_calls.py).
ASYNC_REFILL_MIN_JOBS = 50
#: What summary() counts: acked (a duplicate acked with the stored result included), put
#: back to retry after a failed attempt, dead-lettered, put back without using an attempt
#: (lock contention, another job owning the key, shutdown hand-back).
OUTCOMES = tuple(tally.value for tally in Tally)
#: The exit code of a worker stopped because one of its threads died.
EXIT_THREAD_DIED = 1
#: The exit code of a worker stopped because a coroutine blocked its event loop for too long.
EXIT_LOOP_WEDGED = 3
#: The exit code of a worker whose database lacks django_jobguard's tables or columns: the
#: migrations have not run (a supervisor restarts it; once ``migrate`` ran, it starts).
EXIT_NOT_MIGRATED = 4


#: How often the worker looks for paused queues it serves, to log a pause or resume it sees.
PAUSED_LOOK_SECONDS = 5.0
#: How long the exit waits for the ack thread to write what it holds.
ACK_FLUSH_TIMEOUT_SECONDS = 30.0


def _run_acks(completer: Completer) -> None:
    try:
        completer.run_acks()
    finally:
        connections.close_all()


def default_worker_id() -> str:
    """``host:pid:random``: unique across hosts, and across restarts that reuse a pid (containers)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"[:WORKER_ID_MAX_LENGTH]


def _some(names: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` of ``names``, and how many more: for a log line that stays short."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def claim_size(capacity: int, free: int, *, holding: bool) -> int:
    """How many jobs to claim now, with room for ``free`` of the ``capacity`` to hold.

    Refills in batches: one claim per half a capacity of room, not one per freed slot
    (measured: a third less CPU per job, in the worker and in PostgreSQL). A worker that
    holds nothing claims whatever room it has.
    """
    return free if free >= max(1, capacity // 2) or (free > 0 and not holding) else 0


def finishes_to_wait(capacity: int, held: int) -> int | None:
    """How many finishes can change the claimer's mind, with ``held`` of ``capacity`` jobs held.

    Waking on every finish cost short jobs about half a loop round per job (issue 57), while a
    claim waits for half the capacity (:func:`claim_size`). None: the room is there already and
    what holds the claim back is acks awaited (their write wakes the claimer) or ``max_jobs``:
    only the finish that leaves nothing held matters (an empty worker claims whatever it can).
    """
    short = max(1, capacity // 2) - (capacity - held)
    return short if short > 0 else None


class Worker:
    """Runs jobs of some queues until stopped. ``manage.py jobguard_worker`` builds one."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        exclude_queues: Sequence[str] = (),
        concurrency: int = 1,
        async_slots: int | None = None,
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
        if async_slots is not None and async_slots < 1:
            raise ValueError("async_slots must be at least 1")
        if concurrency < (0 if async_slots else 1):
            raise ValueError("concurrency must be at least 1 (0 only with async_slots: an async-only worker)")
        #: Coroutines run at once on the event loop (None: async tasks run on the threads).
        self.async_slots = async_slots
        self.queues = list(queues) if queues else None
        #: Queues never claimed from (django-tasks-db's --exclude-queues).
        self.exclude_queues = list(exclude_queues)
        self.concurrency = concurrency
        self.capacity = batch_size or conf.batch_size or max(1, concurrency * 2)
        self._explicit_batch = bool(batch_size or conf.batch_size)
        self._mean_run_seconds = 0.0
        self._runs_noted = 0
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = worker_id or conf.worker_id or default_worker_id()
        if len(self.worker_id) > WORKER_ID_MAX_LENGTH:
            # Every claim writes it into the job rows: refused here, not by each claim (which
            # the loop would read as the database being unreachable, and retry forever).
            raise ValueError(
                f"worker_id must be at most {WORKER_ID_MAX_LENGTH} characters (the width of the "
                f"worker_id column), not {len(self.worker_id)}: {self.worker_id[:40]!r}..."
            )
        self.alias = database_alias or conf.database_alias
        #: The flow-control limits the claims enforce (None: none declared, the plain claim).
        self.flow = registry.flow_plan()
        #: When a rate that held jobs back next admits a start (written by each limited claim).
        self._throttle = Throttle()
        self.poll_interval = poll_interval if poll_interval is not None else conf.poll_interval
        self.reaper_interval = reaper_interval if reaper_interval is not None else conf.reaper_interval
        self.shutdown_grace = shutdown_grace if shutdown_grace is not None else conf.shutdown_grace
        self.install_signal_handlers = install_signal_handlers
        # A burst worker drains and exits: it leaves schedules to the long-running workers.
        self.run_scheduler = run_scheduler and not burst
        self._setup_runtime()

    def _setup_runtime(self) -> None:
        #: The jobs this worker holds; every change of their state goes through it.
        self.slots = Slots()
        self._wake = threading.Event()
        self._stopping = False
        self._forced = False
        self._signalled = False
        self._threads: list[threading.Thread] = []
        self._listener: store.Listener | None = None
        self.exit_code = 0
        self.claimed = 0
        self._paused_seen: set[str] = set()
        self._paused_looked_at = -PAUSED_LOOK_SECONDS
        conf = get_settings()
        self.completer = Completer(
            self.alias,
            self.worker_id,
            slots=self.slots,
            note_run_time=self.note_run_time,
            ack_window=conf.ack_window,
            ack_batch_size=conf.ack_batch_size,
            on_acks_written=self.slots.freed,
        )
        self._acker: threading.Thread | None = None
        #: Outcomes of the jobs this worker finished, for the summary on exit (see summary()).
        self.outcomes: dict[str, int] = self.completer.outcomes
        if self.flow is not None:
            limits = get_settings().limits
            for task_name, name in self.flow.guarded_tasks.items():
                breaker = limits[name].breaker if name in limits else None
                if breaker is not None:
                    self.completer.breakers[task_name] = (name, breaker)
        self.runtime = Runtime(self.alias, self.worker_id, self.completer)
        #: The event loop of the ``async def`` tasks (``--async-slots``); None: they run on threads.
        self.aio: AsyncExecutor | None = None
        if self.async_slots:
            self.aio = AsyncExecutor(
                self.slots, self.completer, self.runtime, size=self.async_slots, threads=self.concurrency > 0
            )
            self.slots.route(self.aio.routes, self.aio.submit)
        self.lease_keeper = LeaseKeeper(self.alias, self.worker_id)
        #: Whether the database answers; one log line per interval while it does not.
        self.outage = DatabaseOutage(self.worker_id)
        self.watchdog = Watchdog(
            self.slots,
            self.completer,
            self.worker_id,
            replace_executor=lambda: self._start_executor(len(self._threads)),
            stop_worker=self.stop,
        )
        self.maintenance = Maintenance(
            self.alias, self.worker_id, reaper_interval=self.reaper_interval, run_scheduler=self.run_scheduler
        )
        self._started_at: float | None = None
        beat = beats.Beat(
            worker_id=self.worker_id,
            alias=self.alias,
            queues=self.queues,
            concurrency=self.concurrency,
            pid=os.getpid(),
            async_slots=self.async_slots or 0,
        )
        self.heartbeat = Heartbeat(self.slots, self.lease_keeper, self.watchdog, beat, self.outage, self.aio)
        self._shutdown = Shutdown(self.slots, self.completer, self.alias, self.worker_id)

    @property
    def processed(self) -> int:
        """Jobs this worker's executors finished (run, or handed back before starting)."""
        return self.slots.finished

    # -- public ------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, with ``burst``, until nothing is due). Returns the exit code."""
        self._started_at = time.monotonic()
        if not self.schema_present():
            return self.exit_code
        if self.install_signal_handlers:
            self._install_signal_handlers()
        listener = self._listener = store.Listener(
            get_settings().listen_alias(self.alias), self.queues, wakeup=store.wakeup_source(self.alias)
        )
        if not self.burst:
            # LISTEN before announcing readiness, so no enqueue after "worker_started" is missed.
            listener.start()
        logger.info(
            "worker_started worker_id=%s queues=%s concurrency=%d batch=%d%s",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.capacity,
            f" async_slots={self.async_slots}" if self.async_slots else "",
            extra={"worker_id": self.worker_id},
        )
        if self.completer.batches_acks:
            completer = self.completer
            self._acker = self._spawn(lambda: _run_acks(completer), "jobguard-acker")
        aio = self.aio
        if aio is not None:
            self._spawn(aio.run, "jobguard-aio")
            aio.wait_started()
            self._spawn(lambda: aio.watch(lambda: self._stopping, self._loop_wedged), "jobguard-aio-watch")
        for index in range(self.concurrency):
            self._start_executor(index)
        heartbeat = self._spawn(self.heartbeat.run, "jobguard-heartbeat")
        relay = None
        if not self.burst:
            self.maintenance.start_pruning(self._spawn)  # finished jobs past their retention
            # Published messages, read where they are written (the application's database when the
            # jobs have their own).
            relay = outbox_relay.start(self._spawn, get_settings().outbox_alias, self.worker_id)
        try:
            self._loop(listener)
        finally:
            listener.close()
            if relay is not None:
                relay.stop()  # each delivery thread finishes its send, records it, gives its key back
            self.maintenance.resign()
            if relay is not None:
                relay.join()
            self._stopping = True
            abandoned = self._shutdown.run(self._threads, self.shutdown_grace, lambda: self._forced)
            if aio is not None:
                aio.stop()  # cancels the coroutines still running: shutdown handed their jobs back
            # Every ack handed over is written before the worker exits.
            self.completer.close_acks(self._acker, timeout=ACK_FLUSH_TIMEOUT_SECONDS)
            self.heartbeat.stop()
            heartbeat.join(timeout=5)
            if self.exit_code == 0:
                self.heartbeat.beat.leave()  # stopped cleanly: off the workers list, not "not beating"
            connections.close_all()
            if self._signalled:
                # Python puts the default handlers back as the interpreter exits, so a repeated
                # Ctrl-C (or a supervisor's second SIGTERM) landing then would turn this clean
                # exit into death by signal. The process is leaving: ignore further stop signals.
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            if get_settings().opentelemetry:
                # Spans of the last jobs sit in the provider's batch: export them before exit.
                from . import tracing  # an optional extra: imported only when enabled

                tracing.flush()
        logger.info(
            "worker_stopped worker_id=%s processed=%d",
            self.worker_id,
            self.processed,
            extra={"worker_id": self.worker_id},
        )
        if abandoned:
            # Threads still inside handlers cannot be joined; leave without waiting for them.
            logging.shutdown()
            os._exit(self.exit_code)
        return self.exit_code

    def summary(self) -> str:
        """One line on what this worker did: jobs run, succeeded, retried, dead-lettered, elapsed.

        ``key=value`` like the log lines, so scripts can read it: ``jobs=3 succeeded=1
        retried=1 dead_lettered=1 put_back=0 elapsed=0.42s``.
        """
        elapsed = time.monotonic() - self._started_at if self._started_at is not None else 0.0
        counts = " ".join(f"{outcome}={self.outcomes[outcome]}" for outcome in OUTCOMES)
        return f"jobs={self.processed} {counts} elapsed={elapsed:.2f}s"

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and shut down (what SIGTERM does); ``force`` skips the grace period."""
        self._forced = self._forced or force or self._stopping
        self._stopping = True
        self.slots.close()
        self._wake_waiters()

    def _loop_wedged(self) -> None:
        """A coroutine blocks the event loop past every async task's timeout: stop for a restart.

        No grace period: the coroutines it would wait for cannot run. Their jobs are handed back.
        """
        self.exit_code = EXIT_LOOP_WEDGED
        self.stop(force=True)

    def capacity_now(self) -> int:
        """Jobs to hold: more for short jobs, only what executors can start now for long ones.

        Jobs held beyond the free executors wait in this process while other workers may be
        idle, which only pays off when jobs are short. A new worker holds twice its
        concurrency; once it has seen that many runs, it holds about PREFETCH_TARGET_SECONDS
        of work per thread (at most PREFETCH_MAX_JOBS), and claims that much less often. An
        explicit batch size is kept as given.
        """
        if self._explicit_batch:
            return self.capacity
        mean = self._mean_run_seconds
        if mean > PREFETCH_MAX_RUN_SECONDS:
            return self.concurrency
        if self._runs_noted < self.capacity:
            return self.capacity
        per_thread = int(PREFETCH_TARGET_SECONDS / mean) if mean > 0 else PREFETCH_MAX_JOBS
        return max(self.capacity, min(PREFETCH_MAX_JOBS, self.concurrency * per_thread))

    def _room(self) -> tuple[int, int]:
        """The jobs to hold (half of it is the least room worth a claim), and the room left.

        Jobs done but not acked yet are still "running" in the database: they count, so a
        completer that falls behind holds the claimer back (a crash re-runs at most the
        capacity). With async slots the coroutines' room is what is claimed; sync jobs that
        come with them run on the threads, and while those have their fill waiting, nothing
        more is claimed. Async slots refill in steps of a tenth of them (ASYNC_REFILL_MIN_JOBS
        at least), not of half.
        """
        capacity = self.capacity_now()
        if self.async_slots is None:
            return capacity, capacity - len(self.slots) - self.completer.awaiting_acks
        if self.concurrency and self.slots.on_threads >= capacity:
            return self.async_slots, 0
        if self.aio is not None and self.aio.stalled(time.monotonic()) >= BLOCKED_AFTER_SECONDS:
            return self.async_slots, 0  # a blocked loop starts nothing: leave the jobs to others
        refill = max(ASYNC_REFILL_MIN_JOBS, self.async_slots // 10)
        free = self.async_slots - self.slots.on_loop - self.completer.awaiting_acks
        return min(self.async_slots, 2 * refill), free

    def _acks_hold_room(self, capacity: int, free: int) -> bool:
        """Whether the jobs awaiting their batched ack are all that keeps a claim from going out.

        Short jobs finish within the ack window: the executors sit idle until it closes, and
        then the claimer takes a sliver. Asking the ack thread to write at once keeps them fed.
        """
        awaiting = self.completer.awaiting_acks
        return awaiting > 0 and claim_size(capacity, free + awaiting, holding=bool(self.slots)) > 0

    def note_run_time(self, seconds: float) -> None:
        """Fold one handler run time into the mean that decides how much to prefetch."""
        # Plain numbers updated by several threads: a lost update only nudges an estimate.
        if self._runs_noted == 0:
            self._mean_run_seconds = seconds
        else:
            self._mean_run_seconds += RUN_TIME_SMOOTHING * (seconds - self._mean_run_seconds)
        self._runs_noted += 1

    # -- threads -----------------------------------------------------------------------

    def _wake_waiters(self) -> None:
        self._wake.set()
        self.slots.freed()
        if self._listener is not None:
            self._listener.wake()

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        """Start an internal thread; if it dies of an exception, the whole worker stops, loudly."""

        def guarded() -> None:
            try:
                target()
            except BaseException:
                logger.critical(
                    "worker_thread_died worker_id=%s thread=%s; stopping the worker",
                    self.worker_id,
                    name,
                    exc_info=True,
                    extra={"worker_id": self.worker_id},
                )
                self.exit_code = EXIT_THREAD_DIED
                if self._stopping:
                    self._wake_waiters()  # already shutting down: no reason to skip the grace period
                else:
                    self.stop()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        return thread

    def _start_executor(self, index: int) -> None:
        executor = Executor(self.slots, self.completer, self.runtime)
        self._threads.append(self._spawn(executor.run, f"jobguard-exec-{index}"))

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: Any) -> None:
            # This runs in the main thread between two bytecodes, possibly while that thread
            # holds an Event's internal lock (inside Event.clear() or wait()): setting the
            # Events from here could deadlock. Flags and the listener's pipe are safe; a
            # short-lived thread sets the Events.
            self._forced = self._forced or self._stopping
            self._stopping = True
            self._signalled = True
            self.slots.close()
            logger.info("worker_stopping worker_id=%s signal=%s", self.worker_id, signal.Signals(signum).name)
            if self._listener is not None:
                self._listener.wake()
            threading.Thread(target=self._wake_waiters, name="jobguard-stop", daemon=True).start()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- main loop ---------------------------------------------------------------------

    def _loop(self, listener: store.Listener) -> None:
        failures = 0
        wait = self.poll_interval
        while not self._stopping:
            self.slots.clear_freed()
            # Read before the room: a finish in between counts twice, which only wakes us early.
            held = len(self.slots)
            try:
                if not self.outage.healthy:
                    # A full worker asks for nothing, so it would never learn that the
                    # database is back: ask it directly.
                    store.database_now(self.alias)
                self.maintenance.run_due(time.monotonic())
                self._look_for_paused_queues()
                capacity, free = self._room()
                if self.max_jobs is not None:
                    # Done once it claimed them all: no room (acks awaited) is not the end.
                    if self.claimed >= self.max_jobs and not self.slots:
                        return
                    free = min(free, self.max_jobs - self.claimed)
                asked = claim_size(capacity, free, holding=bool(self.slots))
                if not asked and self._acks_hold_room(capacity, free):
                    self.completer.flush()  # its write frees the slots; wait_freed wakes on it
                claimed = self._claim(asked) if asked else 0
                failures = 0
                self.outage.recovered()
            except (DatabaseError, InterfaceError) as exc:
                if schema.is_missing_relation(exc) and not self.schema_present(exc):
                    return
                failures += 1
                self.outage.failed("claim", exc)
                close_connection(self.alias)
                self._wake.wait(
                    backoff_delay(failures, DB_ERROR_BACKOFF_SECONDS, DB_ERROR_BACKOFF_MAX_SECONDS)
                )
                continue
            # Not when there was no room to ask (acks still being written): that is not "drained".
            if self.burst and asked and claimed == 0 and not self.slots:
                return
            if not asked or claimed == asked or self.burst:
                # Full (or draining in burst mode): wait for executors to free room worth a claim.
                # Async slots' room is not what the threads hold, and a burst worker that found
                # nothing due looks again at each finish: those wake on every finish, as before.
                sync = self.async_slots is None and (claimed == asked or not self.burst)
                self.slots.wait_freed(wait, finishes_to_wait(capacity, held + claimed) if sync else 1)
            else:
                # Nothing more is due: sleep until a NOTIFY, the next maintenance pass or a poll,
                # or until a rate that held jobs back admits the next start.
                until = self.maintenance.next_at - time.monotonic()
                if self._throttle.retry_after is not None:
                    until = min(until, max(RATE_WAIT_MIN_SECONDS, self._throttle.retry_after))
                listener.wait(max(0.0, min(wait, until)))

    def schema_present(self, error: BaseException | None = None, *, migrations: bool = False) -> bool:
        """False, with the exit code set and one ERROR line, when the database lacks our schema.

        :meth:`run` asks at the start (are the tables there: one catalogue query), and when a
        statement of its loop failed for a missing table or column (``error``): waiting will not
        create them, so the worker exits then too, saying what is missing (tables, migrations
        not applied, or the error itself). ``migrations``: also whether an upgrade's migrations
        are waiting (``jobguard_worker`` asks once per process; it reads the migration files).
        An unreachable database is not a missing schema: the loop's back-off deals with it.
        """
        if store.memory_store(self.alias) is not None:
            return True  # the in-memory store (tests) has no tables to miss
        try:
            missing = schema.missing_tables(self.alias)
            what = f"lacks django_jobguard's tables {_some(missing)}" if missing else ""
            if (error is not None or migrations) and not missing:
                unapplied = schema.unapplied_migrations(self.alias, upgrades_only=error is None)
                if unapplied:
                    what = f"has not applied the migrations {_some(unapplied)}"
                elif error is not None:
                    what = f"does not match django_jobguard's models ({str(error).strip()})"
        except (DatabaseError, InterfaceError):
            close_connection(self.alias)
            return True
        if not what:
            return True
        self.exit_code = EXIT_NOT_MIGRATED
        logger.error(
            "schema_missing worker_id=%s database=%s %s: run `python manage.py migrate` (with "
            "these settings), then start the worker again; exiting with status %d",
            self.worker_id,
            self.alias,
            what,
            EXIT_NOT_MIGRATED,
            extra={"worker_id": self.worker_id},
        )
        return False

    def _look_for_paused_queues(self) -> None:
        """Log the queues this worker serves that were paused or resumed since it last looked.

        The claim skips paused queues without a word (on PostgreSQL inside its statement), so
        an operator reading this worker's log learns here why a queue it serves sits still.
        """
        now = time.monotonic()
        if now - self._paused_looked_at < PAUSED_LOOK_SECONDS:
            return
        self._paused_looked_at = now
        paused = {
            name
            for name in store.paused_queue_names(self.alias)
            if (self.queues is None or name in self.queues) and name not in self.exclude_queues
        }
        for name in sorted(paused - self._paused_seen):
            logger.info(
                "queue_paused_skipped worker_id=%s queue=%s; no job of it is claimed until it is resumed",
                self.worker_id,
                name,
                extra={"worker_id": self.worker_id, "queue": name},
            )
        for name in sorted(self._paused_seen - paused):
            logger.info(
                "queue_resumed_seen worker_id=%s queue=%s; its jobs are claimed again",
                self.worker_id,
                name,
                extra={"worker_id": self.worker_id, "queue": name},
            )
        self._paused_seen = paused

    def _report_throttle(self, short: bool) -> None:
        """Count a limited claim held back by a limit, and report the breakers it half-opened."""
        throttle = self._throttle
        if throttle.breaker_states:
            # What the completer counts at once (a probe's answer) and what it may gather.
            self.completer.breaker_states = dict(throttle.breaker_states)
        for name, before, after in throttle.breaker_changes:
            breakers.report_change(name, before, after, "system", "open time over: probing the dependency")
        if short:
            for reason in sorted(throttle.held_back):
                events.emit(events.ClaimThrottled(reason))

    def _claim(self, batch_size: int) -> int:
        # Every claim leaves the paused queues alone, so a pause reaches us within one poll.
        jobs = store.claim(
            self.alias,
            self.queues,
            batch_size,
            self.worker_id,
            self.exclude_queues,
            self.flow,
            self._throttle,
        )
        if self.flow is not None:
            self._report_throttle(len(jobs) < batch_size)
        if not jobs:
            return 0
        if _faults.ENABLED:
            _faults.maybe_crash("after_claim")
        added = self.slots.add(jobs, time.monotonic())
        self.claimed += added
        return added
