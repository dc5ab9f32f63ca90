"""``run_jobs()`` and ``drain()``: the due jobs, run in the test's own thread by the worker's pipeline.

A :class:`~django_jobguard.worker.Worker` is built but not started: no thread, no signal
handler, no LISTEN. Its claim, pipeline and completer run here, one job at a time, on this
thread's database connection, so a plain ``TestCase`` (one transaction, never committed) sees
every row the jobs write, and the jobs see the test's rows. What a worker does to a job
happens here too: the claim with its flow limits and pauses, the idempotency check, the lock,
the handler (in its transaction when ``atomic``), the fenced ack, retries classified with their
backoff, dead letters, workflows' dependants and callbacks. Inside a ``TestCase`` each job's
``on_commit`` callbacks (a cache invalidation, a job's signals) run when the job's work would
have committed (``captureOnCommitCallbacks(execute=True)`` around each job).

Not here: the heartbeat (a job runs to its end, however long; no lease is extended) and the
hard ``timeout`` watchdog; a real worker process does those (the ``jobguard_worker`` fixture).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import traceback
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.test import TestCase

from .. import store
from ..conf import get_settings
from ..flow import Throttle
from ..maintenance import Reaper, Redriver, SchedulerTick
from ..outcome import Tally
from ..worker import Worker
from ..worker.executor import Executor
from ..worker.held import LOGGER_NAME
from . import _state
from ._stores import load_jobs, memory_store_of
from .errors import InlineThreadError, JobguardTestingError

if TYPE_CHECKING:
    from ..models import Job

__all__ = ["DEFAULT_LIMIT", "RunSummary", "drain", "run_jobs"]

#: Jobs one run_jobs() call runs at most: past it, something enqueues forever.
DEFAULT_LIMIT = 1000


@dataclasses.dataclass
class RunSummary:
    """What one :func:`run_jobs` did: its counts, and the jobs it ran as they are stored after it."""

    #: Every job the run took, in the order it took them (a retried job once per attempt).
    jobs: list[Job]
    succeeded: int = 0
    #: Attempts that failed and were put back to retry after their backoff.
    retried: int = 0
    #: Jobs dead-lettered (a permanent error, attempts exhausted, an unknown task, bad arguments).
    dead: int = 0
    #: Jobs put back without using an attempt (their lock was taken, their key's owner still ran).
    put_back: int = 0

    @property
    def failed(self) -> int:
        """Attempts that failed: retried or dead-lettered."""
        return self.retried + self.dead

    @property
    def ran(self) -> int:
        """Attempts run (each taken job once)."""
        return len(self.jobs)

    def __str__(self) -> str:
        return (
            f"ran={self.ran} succeeded={self.succeeded} retried={self.retried} dead={self.dead} "
            f"put_back={self.put_back}"
        )


def _worker_id() -> str:
    return f"testing:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _testcase_only(alias: str) -> bool:
    """Whether every open atomic block on ``alias`` is a ``TestCase``'s (their commit never comes)."""
    connection = connections[alias]
    blocks = connection.atomic_blocks
    # Django marks the blocks TestCase opens; no public name says so.
    return bool(blocks) and all(vars(block).get("_from_testcase", False) for block in blocks)


@contextlib.contextmanager
def _commit_hooks(alias: str) -> Iterator[None]:
    """Inside a ``TestCase``: run the job's ``on_commit`` callbacks when its work is done."""
    if _testcase_only(alias):
        with TestCase.captureOnCommitCallbacks(using=alias, execute=True):
            yield
    else:
        yield


def _maintenance(alias: str, worker_id: str, *, database: bool, schedules: bool) -> None:
    """The passes a worker runs between claims: expired leases, approved replays, due schedule ticks."""
    Reaper(alias, worker_id).run_once()
    if database:
        Redriver(alias, worker_id).run_once()
        if schedules and (get_settings().schedules or _declared_schedules()):
            SchedulerTick(alias, worker_id).run_once(time.monotonic())


class _CrashWatch(logging.Handler):
    """Keeps what the executor logs instead of raising: a job the pipeline itself failed on.

    A worker logs it (``job_crashed``) and goes on, the job's lease left to expire; a test
    must fail instead, with the traceback.
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.crashes: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith(("job_crashed", "job_db_error")):
            self.crashes.append(record)

    def raise_first(self) -> None:
        if not self.crashes:
            return
        record = self.crashes[0]
        detail = "".join(traceback.format_exception(*record.exc_info)) if record.exc_info else ""
        raise JobguardTestingError(
            f"the worker's pipeline failed on a job ({record.getMessage()}), so it was never settled: "
            f"a worker would log this and leave the job to its lease.\n{detail}"
        )


def _declared_schedules() -> bool:
    from ..registry import registry

    return any(getattr(registry.find(name), "schedule", None) for name in registry.names())


def check_thread(what: str) -> None:
    """In inline mode, only the test's own thread may run jobs."""
    owner = _state.owner()
    if _state.effective_mode() == "inline" and owner is not None and not _state.is_draining():
        import threading

        current = threading.current_thread()
        if current is not owner:
            raise InlineThreadError(
                f"{what} in inline mode on thread {current.name!r}, which the test does not own "
                f"(the test runs on {owner.name!r}): a job run there would use another database "
                "connection, which cannot see the test's rows. Join the thread, then call "
                "run_jobs() on the test's thread (manual mode)."
            )


def run_jobs(
    *,
    queue: str | None = None,
    queues: Sequence[str] | None = None,
    exclude_queues: Sequence[str] = (),
    limit: int = DEFAULT_LIMIT,
    maintenance: bool = True,
    schedules: bool = False,
    using: str | None = None,
) -> RunSummary:
    """Run the jobs that are due, here, until none is; what ran.

    ``queue`` / ``queues`` restrict the run to those queues, ``exclude_queues`` leaves some
    out. A job its handler enqueues runs in the same call if it is due; a retry waits for its
    backoff (move a :func:`~django_jobguard.testing.frozen_time` clock to make it due).
    ``maintenance`` first runs the passes a worker runs between claims: the reaper (expired
    leases) and approved replays; ``schedules=True`` also enqueues the schedules' due ticks
    (off by default, as in a burst worker: a schedule's ticks follow the wall clock, so they
    would come and go with the test's speed). More than ``limit`` jobs is an error: some job
    enqueues another each time it runs. A job the pipeline itself fails on (a worker would log
    ``job_crashed`` and leave it to its lease) raises :class:`JobguardTestingError` with the
    traceback.
    """
    _state.raise_problems()
    check_thread("run_jobs()")
    if queue is not None and queues is not None:
        raise JobguardTestingError("run_jobs() takes queue= or queues=, not both")
    if isinstance(queues, str):
        raise JobguardTestingError(f"queues= takes a list of queue names, not the string {queues!r}")
    if limit < 1:
        raise JobguardTestingError(f"limit must be at least 1, not {limit!r}")
    names = [queue] if queue is not None else (list(queues) if queues is not None else None)
    conf = get_settings()
    alias = using or conf.database_alias
    worker = Worker(
        queues=names,
        exclude_queues=exclude_queues,
        concurrency=1,
        batch_size=1,
        worker_id=_worker_id(),
        database_alias=alias,
        install_signal_handlers=False,
    )
    executor = Executor(worker.slots, worker.completer, worker.runtime)
    throttle = Throttle()
    taken: list[int] = []
    watch = _CrashWatch()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(watch)
    try:
        _drain(
            alias,
            worker,
            executor,
            throttle,
            taken,
            limit=limit,
            maintenance=maintenance,
            schedules=schedules,
        )
    finally:
        logger.removeHandler(watch)
    watch.raise_first()
    outcomes = worker.completer.outcomes
    return RunSummary(
        jobs=_load(alias, taken),
        succeeded=outcomes[Tally.SUCCEEDED.value],
        retried=outcomes[Tally.RETRIED.value],
        dead=outcomes[Tally.DEAD_LETTERED.value],
        put_back=outcomes[Tally.PUT_BACK.value],
    )


def _drain(
    alias: str,
    worker: Worker,
    executor: Executor,
    throttle: Throttle,
    taken: list[int],
    *,
    limit: int,
    maintenance: bool,
    schedules: bool,
) -> None:
    database = memory_store_of(alias) is None
    with _state.draining():
        if maintenance:
            _maintenance(alias, worker.worker_id, database=database, schedules=schedules)
        while True:
            # One at a time, in claim order: what a job enqueues or releases is claimed after it.
            jobs = store.claim(
                alias, worker.queues, 1, worker.worker_id, worker.exclude_queues, worker.flow, throttle
            )
            if not jobs:
                break
            if len(taken) >= limit:
                for job in jobs:  # hand it back untouched: it was never started
                    store.requeue(alias, job.id, job.lease_token, delay=0, error=None, refund_attempt=True)
                raise JobguardTestingError(
                    f"run_jobs() ran {limit} jobs and more are still due (the last: {jobs[0].task_name}): "
                    "does a job enqueue another each time it runs? Pass limit= for a longer run."
                )
            worker.slots.add(jobs, time.monotonic())
            for _ in jobs:
                held = worker.slots.next()
                if held is None:  # pragma: no cover - nothing closes these slots
                    break
                taken.append(held.job.id)
                with _commit_hooks(alias):
                    executor.run_one(held)
                    # Batched acks (ACK_WINDOW) are written now, on this thread: no ack thread here.
                    worker.completer.close_acks(None, timeout=0)


def _load(alias: str, ids: list[int]) -> list[Job]:
    if not ids:
        return []
    if memory_store_of(alias) is not None:
        return load_jobs(alias, ids)
    from ..models import Job

    found: dict[int, Any] = Job.objects.using(alias).in_bulk(set(ids))
    return [found[job_id] for job_id in ids if job_id in found]


def drain(queue: str, **options: Any) -> RunSummary:
    """Run the due jobs of one queue (Oban's ``drain_queue``); see :func:`run_jobs`."""
    return run_jobs(queue=queue, **options)
