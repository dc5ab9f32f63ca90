"""Wait for a job to settle and return its result, or raise the error it settled with.

The row is the truth: a waiter reads it when it may have settled and maps what it finds to a
return value or an exception (:func:`_outcome`). What tells it when to read differs:

- PostgreSQL (not behind a transaction pooler, or with ``LISTEN_DATABASE``): the process's
  :class:`~django_jobguard.store.settled.SettleListener` calls the waiter back when the job's
  settlement is notified. Order: subscribe, LISTEN active, flag the row ``waited``, read. The
  row is also read again every :data:`RECHECK_SECONDS`, a backstop that costs one read.
- Elsewhere (SQLite, MariaDB/MySQL, a pooled PostgreSQL): a poll of the row, every
  :data:`POLL_FIRST_SECONDS` at first, growing to :data:`POLL_MAX_SECONDS`.

The async waiter does the same on an event loop: its reads go through ``sync_to_async`` on the
one thread Django keeps for thread-sensitive work (one database connection, however many
coroutines wait), and its wake-up is an :class:`asyncio.Event` set from the listener's thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import itertools
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections
from django.db.models.functions import Now
from django.db.transaction import TransactionManagementError

from ..conf import get_settings
from ..encryption.payloads import ERROR, RESULT, open_json, open_text
from ..exceptions import (
    InvalidArgumentsError,
    JobCancelled,
    JobFailed,
    JobNotFound,
    ResultExpired,
    ResultNotStored,
    WaitTimeout,
)
from ..models import DeadLetter, Job, JobStatus
from ..registry import registry
from ..store.settled import mark_many_waited, mark_waited, settle_listener

if TYPE_CHECKING:
    from ..store.settled import SettleListener

__all__ = ["await_result", "result_retention", "wait"]

#: Seconds between the first two reads of a polled row; each wait after is longer by
#: :data:`POLL_GROWTH`, up to :data:`POLL_MAX_SECONDS` (where no notification wakes waiters).
POLL_FIRST_SECONDS = 0.005
POLL_GROWTH = 1.5
POLL_MAX_SECONDS = 0.25
#: Seconds between two reads of a row whose settlement is notified: a backstop only.
RECHECK_SECONDS = 5.0
#: Seconds a waiter gives the process's LISTEN connection to open before it polls instead.
LISTEN_TIMEOUT_SECONDS = 2.0

_TERMINAL = frozenset({JobStatus.SUCCEEDED.value, JobStatus.DEAD.value, JobStatus.CANCELLED.value})
_COLUMNS = ("status", "result", "finished_at", "task_name", "last_error", "db_now")
_PENDING = object()


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidArgumentsError(
            f"timeout must be a number of seconds (or None to wait without a limit), not {timeout!r}."
        )
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(
            f"timeout must be 0 or more seconds (or None to wait without a limit), not {timeout!r}."
        )
    return float(timeout)


def _identify(job: Job) -> tuple[int, str, bool]:
    """The job's id, its database alias, and whether this instance was read from the database."""
    if not isinstance(job, Job):
        raise InvalidArgumentsError(f"wait() takes a Job, not {type(job).__name__} {job!r}.")
    if job.pk is None:
        raise JobNotFound("This Job was never saved: it has no id to wait on.", job_id=None)
    alias = job._state.db or get_settings().database_alias
    return int(job.pk), alias, not job._state.adding


def result_retention(task_name: str) -> float | None:
    """Seconds a result of task ``task_name`` can be waited for after it finished: the task's
    ``result_retention``, else ``JOBGUARD["RETENTION"]["RESULTS"]``; None: while its row is kept."""
    task = registry.find(task_name)
    if task is None:
        try:
            task = registry.resolve(task_name)
        except Exception:  # a resolver that cannot import it: the global setting applies
            task = None
    if task is not None and task.result_retention is not None:
        return task.result_retention
    return get_settings().retention.results


def _refuse_unstored(task_name: str, job_id: int) -> None:
    if task_name and result_retention(task_name) == 0:
        raise ResultNotStored(
            f"Job {job_id} runs {task_name}, which keeps no result to wait for "
            "(@task(result_retention=0)); read the effect it has instead, or give it a retention.",
            job_id=job_id,
        )


def _read(alias: str, job_id: int) -> dict[str, Any] | None:
    row: dict[str, Any] | None = (
        Job.objects.using(alias).filter(pk=job_id).annotate(db_now=Now()).values(*_COLUMNS).first()
    )
    return row


def _outcome(alias: str, job_id: int, row: dict[str, Any] | None, loaded: bool) -> Any:
    """The result of a settled job, :data:`_PENDING` for one not settled; or the error."""
    if row is None:
        if loaded:
            raise ResultExpired(
                f"Job {job_id} is gone: its row was deleted (pruned after its retention, "
                'JOBGUARD["RETENTION"], or by hand), and its result with it.',
                job_id=job_id,
            )
        raise JobNotFound(
            f"No job {job_id}: never enqueued, enqueued in a transaction that has not committed, or deleted.",
            job_id=job_id,
        )
    status = row["status"]
    if status not in _TERMINAL:
        return _PENDING
    _refuse_unstored(row["task_name"], job_id)
    if status == JobStatus.SUCCEEDED:
        retention = result_retention(row["task_name"])
        finished: datetime.datetime | None = row["finished_at"]
        if retention is not None and finished is not None:
            age = (row["db_now"] - finished).total_seconds()
            if age > retention:
                raise ResultExpired(
                    f"Job {job_id}'s result expired: it finished {age:.0f} s ago and results of "
                    f"{row['task_name']} are kept {retention:g} s (@task(result_retention=...), "
                    'JOBGUARD["RETENTION"]["RESULTS"]).',
                    job_id=job_id,
                )
        return open_json(row["result"], RESULT, "job.result")
    if status == JobStatus.DEAD:
        letter = (
            DeadLetter.objects.using(alias)
            .filter(job_id=job_id)
            .values("id", "error_class", "error_message", "reason", "replay_job_id")
            .first()
        )
        if letter is None:  # pruned, or a row settled by hand: the job's own last error
            raise JobFailed(
                job_id, error_class="", error_message=open_text(row["last_error"], ERROR, "job.last_error")
            )
        raise JobFailed(
            job_id,
            error_class=letter["error_class"],
            error_message=open_text(letter["error_message"], ERROR, "dead_letter.error_message"),
            reason=letter["reason"],
            dead_letter_id=letter["id"],
            replay_job_id=letter["replay_job_id"],
        )
    why = open_text(row["last_error"], ERROR, "job.last_error") or "cancelled"
    raise JobCancelled(f"Job {job_id} was cancelled, so it has no result ({why}).", job_id=job_id)


def _settled(alias: str, job_id: int, loaded: bool) -> Any:
    """Read the row once: the outcome, or :data:`_PENDING`."""
    return _outcome(alias, job_id, _read(alias, job_id), loaded)


def _refuse_in_transaction(alias: str, job_id: int, loaded: bool) -> Any:
    """In an atomic block, a settled job's outcome; otherwise a clear error: waiting there
    would hold the transaction's snapshot (MariaDB's repeatable read never sees the job
    settle) and a row lock the job's worker needs."""
    outcome = _settled(alias, job_id, loaded)
    if outcome is _PENDING:
        raise TransactionManagementError(
            f"Job {job_id} has not settled, and wait() cannot wait inside a transaction "
            "(atomic block): the job may not even be committed yet. Wait after the commit "
            "(outside atomic, or from transaction.on_commit)."
        )
    return outcome


def _timed_out(job_id: int, timeout: float | None) -> WaitTimeout:
    return WaitTimeout(
        f"Job {job_id} did not settle within {timeout:g} s; it may still run (wait again, or cancel it).",
        job_id=job_id,
    )


def wait(job: Job, timeout: float | None = None) -> Any:
    """Block until ``job`` settles; its result. See :meth:`django_jobguard.models.Job.wait`."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no event loop on this thread: blocking is fine
    else:
        raise SynchronousOnlyOperation(
            "Job.wait() blocks, and this thread runs an event loop: use await job.await_result() in "
            "async code."
        )
    limit = _check_timeout(timeout)
    job_id, alias, loaded = _identify(job)
    _refuse_unstored(job.task_name, job_id)
    if connections[alias].in_atomic_block:
        return _refuse_in_transaction(alias, job_id, loaded)
    deadline = None if limit is None else time.monotonic() + limit
    listener = settle_listener(alias)
    if listener is not None:
        outcome = _wait_woken(listener, alias, job_id, loaded, deadline, limit)
    else:
        outcome = _wait_polling(alias, job_id, loaded, deadline, limit)
    _settle_instance(job, outcome)
    return outcome


def _remaining(deadline: float | None) -> float:
    return math.inf if deadline is None else deadline - time.monotonic()


def _wait_woken(
    listener: SettleListener,
    alias: str,
    job_id: int,
    loaded: bool,
    deadline: float | None,
    limit: float | None,
) -> Any:
    woken = threading.Event()
    listener.subscribe(job_id, woken.set)
    try:
        if not listener.listening(min(LISTEN_TIMEOUT_SECONDS, max(_remaining(deadline), 0.0))):
            return _wait_polling(alias, job_id, loaded, deadline, limit)
        # Flagged: the row was not settled, and its settlement will notify. Not flagged: it
        # settled already (or does not exist): the read below says which.
        skip_read = mark_waited(alias, job_id)
        while True:
            if not skip_read:
                woken.clear()
                outcome = _settled(alias, job_id, loaded)
                if outcome is not _PENDING:
                    return outcome
            skip_read = False
            remaining = _remaining(deadline)
            if remaining <= 0:
                raise _timed_out(job_id, limit)
            woken.wait(min(remaining, RECHECK_SECONDS))
    finally:
        listener.unsubscribe(job_id, woken.set)


def _wait_polling(alias: str, job_id: int, loaded: bool, deadline: float | None, limit: float | None) -> Any:
    delay = POLL_FIRST_SECONDS
    while True:
        outcome = _settled(alias, job_id, loaded)
        if outcome is not _PENDING:
            return outcome
        remaining = _remaining(deadline)
        if remaining <= 0:
            raise _timed_out(job_id, limit)
        time.sleep(min(delay, remaining))
        delay = min(delay * POLL_GROWTH, POLL_MAX_SECONDS)


def _settle_instance(job: Job, result: Any) -> None:
    """The instance says what the row says once the result is known (no query)."""
    job.status = JobStatus.SUCCEEDED
    job.result = result


# -- async -------------------------------------------------------------------------------------


async def await_result(job: Job, timeout: float | None = None) -> Any:
    """:func:`wait` without blocking the event loop. See :meth:`django_jobguard.models.Job.await_result`."""
    limit = _check_timeout(timeout)
    job_id, alias, loaded = _identify(job)
    _refuse_unstored(job.task_name, job_id)
    deadline = None if limit is None else time.monotonic() + limit
    batcher = _batcher(alias)
    listener = settle_listener(alias)
    if listener is not None:
        outcome = await _await_woken(listener, batcher, job_id, loaded, deadline, limit)
    else:
        outcome = await _await_polling(batcher, job_id, loaded, deadline, limit)
    _settle_instance(job, outcome)
    return outcome


def _db(function: Any) -> Any:
    """``function`` run on Django's one thread for thread-sensitive work: one connection for
    every coroutine that waits."""
    return sync_to_async(function, thread_sensitive=True)


#: Rows one statement of the batcher flags at most.
BATCH_ROWS = 1000
#: Rows the batcher reads per round trip at most. The waiters of one chunk take their rows
#: (and drop them) before the next chunk is read: 10,000 jobs settling at once never hold
#: 10,000 rows and results in memory together.
READ_ROWS = 500

_batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Batcher]] = (
    weakref.WeakKeyDictionary()
)


def _batcher(alias: str) -> _Batcher:
    loop = asyncio.get_running_loop()
    by_alias = _batchers.setdefault(loop, {})
    batcher = by_alias.get(alias)
    if batcher is None:
        batcher = by_alias[alias] = _Batcher(alias, loop)
    return batcher


class _Batcher:
    """The flags and reads of one event loop's waiters, gathered into one statement each per
    turn of the loop: 10,000 coroutines waiting cost a few dozen statements, not 20,000, and
    one database connection (sync_to_async's thread-sensitive thread)."""

    def __init__(self, alias: str, loop: asyncio.AbstractEventLoop) -> None:
        self.alias = alias
        self.loop = loop
        self._marks: dict[int, list[asyncio.Future[Any]]] = {}
        self._reads: dict[int, list[asyncio.Future[Any]]] = {}
        self._flusher: asyncio.Task[None] | None = None

    def mark(self, job_id: int) -> asyncio.Future[Any]:
        """True once the job is flagged (not settled); False if it settled or does not exist."""
        return self._ask(self._marks, job_id)

    def read(self, job_id: int) -> asyncio.Future[Any]:
        """The job's row (the columns :func:`_outcome` reads), or None."""
        return self._ask(self._reads, job_id)

    def _ask(self, pending: dict[int, list[asyncio.Future[Any]]], job_id: int) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        pending.setdefault(job_id, []).append(future)
        if self._flusher is None or self._flusher.done():
            # In a context of its own, not the first waiter's: under ASGI that is a request's,
            # whose thread-sensitive thread ends with it; this one runs on Django's shared one.
            self._flusher = self.loop.create_task(self._flush(), context=contextvars.Context())
        return future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the other waiters of this turn join the batch
        while self._marks or self._reads:
            marks, self._marks = self._marks, {}
            reads = self._take_reads()
            try:
                flagged, rows = await _db(self._run)(list(marks), list(reads))
            except Exception as exc:
                for futures in (*marks.values(), *reads.values()):
                    for future in futures:
                        if not future.done():
                            future.set_exception(exc)
                continue
            for job_id, futures in marks.items():
                for future in futures:
                    if not future.done():
                        future.set_result(job_id in flagged)
            for job_id, futures in reads.items():
                for future in futures:
                    if not future.done():
                        future.set_result(rows.get(job_id))

    def _take_reads(self) -> dict[int, list[asyncio.Future[Any]]]:
        """The next :data:`READ_ROWS` reads asked for; the rest wait for the next round trip."""
        if len(self._reads) <= READ_ROWS:
            reads, self._reads = self._reads, {}
            return reads
        return {job_id: self._reads.pop(job_id) for job_id in list(itertools.islice(self._reads, READ_ROWS))}

    def _run(self, marks: list[int], reads: list[int]) -> tuple[set[int], dict[int, dict[str, Any]]]:
        if connections[self.alias].in_atomic_block:
            raise TransactionManagementError(
                "await_result() cannot wait inside a transaction (atomic block): wait after the commit."
            )
        flagged: set[int] = set()
        for start in range(0, len(marks), BATCH_ROWS):
            flagged |= mark_many_waited(self.alias, marks[start : start + BATCH_ROWS])
        rows: dict[int, dict[str, Any]] = {}
        if reads:  # at most READ_ROWS (_take_reads)
            query = Job.objects.using(self.alias).filter(pk__in=reads).annotate(db_now=Now())
            rows.update((row["id"], row) for row in query.values("id", *_COLUMNS))
        return flagged, rows


async def _check(batcher: _Batcher, job_id: int, loaded: bool) -> Any:
    """Read the row once (batched): the outcome, or :data:`_PENDING`."""
    row = await batcher.read(job_id)
    if row is not None and row["status"] == JobStatus.DEAD:
        return await _db(_outcome)(batcher.alias, job_id, row, loaded)  # reads its dead letter
    return _outcome(batcher.alias, job_id, row, loaded)  # no query


async def _await_woken(
    listener: SettleListener,
    batcher: _Batcher,
    job_id: int,
    loaded: bool,
    deadline: float | None,
    limit: float | None,
) -> Any:
    loop = asyncio.get_running_loop()
    wake = _Wakeup(loop)
    listener.subscribe(job_id, wake)
    try:
        if not listener.listening():
            wait_for = min(LISTEN_TIMEOUT_SECONDS, max(_remaining(deadline), 0.0))
            if not await loop.run_in_executor(None, listener.listening, wait_for):
                return await _await_polling(batcher, job_id, loaded, deadline, limit)
        flagged = await batcher.mark(job_id)
        outcome = _PENDING if flagged else await _check(batcher, job_id, loaded)
        while outcome is _PENDING:
            remaining = _remaining(deadline)
            if remaining <= 0:
                raise _timed_out(job_id, limit)
            await wake.wait(min(remaining, RECHECK_SECONDS))
            wake.woken = False
            outcome = await _check(batcher, job_id, loaded)
        return outcome
    finally:
        listener.unsubscribe(job_id, wake)


class _Wakeup:
    """One coroutine's wake-up, called on the listener's thread: a flag and, while the coroutine
    sleeps, the future it awaits. Lighter than an ``asyncio.Event`` (no deque), which counts
    at 10,000 waiters."""

    __slots__ = ("future", "loop", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.woken = False
        self.future: asyncio.Future[None] | None = None

    def __call__(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._set)
        except RuntimeError:  # the loop closed: nobody waits any more
            pass

    def _set(self) -> None:
        self.woken = True
        if self.future is not None and not self.future.done():
            self.future.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until woken (or woken already), or ``timeout`` seconds."""
        if self.woken:
            return
        self.future = self.loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                await self.future
        except TimeoutError:
            pass
        finally:
            self.future = None


async def _await_polling(
    batcher: _Batcher, job_id: int, loaded: bool, deadline: float | None, limit: float | None
) -> Any:
    delay = POLL_FIRST_SECONDS
    while True:
        outcome = await _check(batcher, job_id, loaded)
        if outcome is not _PENDING:
            return outcome
        remaining = _remaining(deadline)
        if remaining <= 0:
            raise _timed_out(job_id, limit)
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * POLL_GROWTH, POLL_MAX_SECONDS)
