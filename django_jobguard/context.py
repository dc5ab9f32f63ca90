"""``JobContext``: what a ``takes_context=True`` handler learns about its own run."""

from __future__ import annotations

import dataclasses
import datetime
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from . import store
from ._json import normalize_json
from .encryption.payloads import CHECKPOINTS, PROGRESS, open_json, seal_json, seal_text
from .exceptions import InvalidTaskError, LeaseLost

if TYPE_CHECKING:
    from .task import Task

__all__ = [
    "MAX_PROGRESS_AMOUNT",
    "MAX_PROGRESS_MESSAGE_CHARS",
    "PROGRESS_WRITE_SECONDS",
    "JobContext",
    "ProgressReport",
    "RunSignals",
]

#: Seconds between two writes of one job's reported progress: the worker's heartbeat thread
#: writes the last report at most this often, and once more when the handler returns.
PROGRESS_WRITE_SECONDS = 1.0
#: The largest ``done`` or ``total``: every JSON reader (JavaScript's too) holds it exactly.
MAX_PROGRESS_AMOUNT = 2**53
#: Longest ``message`` :meth:`JobContext.report_progress` takes, in characters.
MAX_PROGRESS_MESSAGE_CHARS = 500


class RunSignals:
    """What the worker learns about a running job and tells its handler (set by the heartbeat).

    Plain booleans one thread sets and others read between steps: nobody waits on them, so
    they need no lock. The defaults are class attributes, so a worker makes one bare object
    per job and no call (it makes one per job, whether the handler reads them or not).
    """

    lease_lost: bool = False
    lock_lost: bool = False
    cancel_requested: bool = False

    def __repr__(self) -> str:
        return (
            f"RunSignals(lease_lost={self.lease_lost}, lock_lost={self.lock_lost}, "
            f"cancel_requested={self.cancel_requested})"
        )


class ProgressReport:
    """What a handler reported through :meth:`JobContext.report_progress`, and what is written.

    The handler's thread only replaces :attr:`value` and counts the report; the worker's
    heartbeat thread writes the last one (about every :data:`PROGRESS_WRITE_SECONDS`), and
    the handler's thread once more after it returns. The two writers take :attr:`lock`
    around a write, so an older value never lands after a newer one.
    """

    __slots__ = ("lock", "reported", "sealed", "value", "written", "written_at")

    def __init__(self, sealed: bool = False) -> None:
        #: The job's data is stored encrypted: the message is stored sealed (the numbers stay clear).
        self.sealed = sealed
        #: ``(done, total, message, time.time() of the report)``, replaced whole by each report.
        self.value: tuple[float, float | None, str, float] = (0, None, "", 0.0)
        #: Reports made, and the count the store holds the value of.
        self.reported = 0
        self.written = 0
        #: When (monotonic) the last write was made.
        self.written_at = -math.inf
        self.lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """Whether a report is not written yet."""
        return self.reported != self.written

    def snapshot(self) -> tuple[int, dict[str, Any]]:
        """The count of reports and the last one as stored: ``{"done", "total", "message", "at"}``.

        The count is read first: the value is at least that recent, so marking that count
        written never hides a newer report.
        """
        count = self.reported
        done, total, message, at = self.value
        when = datetime.datetime.fromtimestamp(at, tz=datetime.UTC).isoformat()
        if self.sealed and message:
            message = seal_text(message, PROGRESS)
        return count, {"done": done, "total": total, "message": message, "at": when}

    def mark_written(self, count: int, now: float) -> None:
        """The store holds the value of report number ``count`` since ``now`` (monotonic)."""
        self.written = count
        self.written_at = now


#: Types whose values the fast path of report_progress() takes without a closer look.
_PLAIN_AMOUNTS = frozenset({int, float})


def _check_amount(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"report_progress(): {name} must be a number (int or float), not {type(value).__name__}"
        )
    if not 0 <= value <= MAX_PROGRESS_AMOUNT:  # NaN compares false, infinity is past the bound
        bits = value.bit_length() if isinstance(value, int) else 0
        shown = f"an integer of {bits} bits" if bits > 64 else repr(value)  # repr() refuses the longest
        raise ValueError(
            f"report_progress(): {name} must be a number from 0 to 2**53 (exact in every JSON reader), "
            f"not {shown}"
        )


def check_progress(done: Any, total: Any, message: Any) -> None:
    """Refuse a report that cannot be stored or read back: a ``ValueError`` naming the argument."""
    _check_amount(done, "done")
    if total is not None:
        _check_amount(total, "total")
        if total < done:
            raise ValueError(f"report_progress(): total ({total!r}) must be at least done ({done!r})")
    if not isinstance(message, str):
        raise ValueError(f"report_progress(): message must be a str, not {type(message).__name__}")
    if len(message) > MAX_PROGRESS_MESSAGE_CHARS:
        raise ValueError(
            f"report_progress(): message is {len(message)} characters long; at most "
            f"{MAX_PROGRESS_MESSAGE_CHARS} are kept. Put details in the job's result or a log line."
        )
    if "\x00" in message:
        # PostgreSQL cannot store NUL in JSON: refused here on every database, not at the write.
        raise ValueError("report_progress(): message holds a NUL character (\\x00), which cannot be stored")
    if not message.isascii():
        try:
            message.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "report_progress(): message holds a lone surrogate, which is not valid Unicode"
            ) from None


@dataclasses.dataclass(eq=False)
class JobContext:
    """Passed as the first argument to handlers of ``takes_context=True`` tasks.

    ``idempotency_key`` is the job's key, to hand on to external services (for example
    as a payment provider's idempotency key). ``checkpoint()`` records how far a
    non-atomic handler got, so a retry can resume after the last finished phase.
    ``lease_lost`` / ``lock_lost`` turn true when the heartbeat finds the job's lease or
    lock gone: a long handler should check them between steps and stop. ``using`` is the
    database alias of the job's transaction.
    """

    task: Task[Any, Any]
    job_id: int | None
    attempt: int
    max_attempts: int
    queue_name: str
    idempotency_key: str | None = None
    lock_key: str = ""
    fencing_token: int | None = None
    worker_id: str = ""
    _lease_token: str | None = dataclasses.field(default=None, repr=False)
    _alias: str = dataclasses.field(default="default", repr=False)
    _checkpoints: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    #: Set by the worker while the handler runs; read through the properties below.
    signals: RunSignals = dataclasses.field(default_factory=RunSignals, repr=False)
    #: Made by the first report_progress(): a job that never reports costs nothing.
    _progress: ProgressReport | None = dataclasses.field(default=None, repr=False)
    #: The job's data is stored encrypted (its task's ``encrypt``): checkpoints and progress too.
    _sealed: bool = dataclasses.field(default=False, repr=False)

    @classmethod
    def detached(cls, task: Task[Any, Any]) -> JobContext:
        """A context for ``Task.call()``: no job, checkpoints kept in memory."""
        return cls(task=task, job_id=None, attempt=1, max_attempts=1, queue_name="", _checkpoints={})

    @property
    def using(self) -> str:
        """The database alias the worker's claim, ack and (for ``atomic=True``) transaction use.

        Pass it on where a call needs the alias of the job's transaction, for example
        ``invalidate(key, using=context.using)`` when ``JOBGUARD["DATABASE_ALIAS"]`` is not
        Django's default.
        """
        return self._alias

    @property
    def lease_lost(self) -> bool:
        """True once the worker learnt that this job's lease expired and moved on."""
        return self.signals.lease_lost

    @property
    def cancel_requested(self) -> bool:
        """An operator asked to cancel this running job (delivered by the heartbeat).

        Nothing stops the handler: a long one checks this between steps and returns (or
        raises :class:`~django_jobguard.PermanentError`) where stopping is safe.
        """
        return self.signals.cancel_requested

    @property
    def lock_lost(self) -> bool:
        """True once the worker failed to renew this job's lock."""
        return self.signals.lock_lost

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def checkpoints(self) -> dict[str, Any]:
        """Recovery points recorded by earlier attempts of this job (name → data)."""
        if self._checkpoints is None:
            stored = store.read_checkpoints(self._alias, self.job_id) if self.job_id else {}
            # Opened whatever the task says now: an earlier attempt may have sealed them.
            self._checkpoints = dict(open_json(stored, CHECKPOINTS, "job.checkpoints"))
        return dict(self._checkpoints)

    def get_checkpoint(self, name: str, default: Any = None) -> Any:
        """The data recorded under ``name`` by this or an earlier attempt, or ``default``."""
        return self.checkpoints.get(name, default)

    def checkpoint(self, name: str, data: Any = True) -> None:
        """Record that phase ``name`` finished, with JSON ``data``; fenced by the lease.

        Raises :class:`LeaseLost` if the lease moved on, so the handler stops there. Inside
        the handler's own ``transaction.atomic()`` block the checkpoint commits with that
        block's writes. Not for ``atomic=True`` tasks, whose checkpoints would roll back with
        every failed attempt.
        """
        if self.task.atomic and self.job_id is not None:
            raise InvalidTaskError(
                f"{self.task.name} is atomic=True: a checkpoint would roll back with the failed "
                "attempt it should survive. Checkpoints are for non-atomic tasks."
            )
        data = normalize_json(data, f"checkpoint {name!r}")
        current = self.checkpoints
        current[name] = data
        if self.job_id is not None:
            stored = seal_json(current, CHECKPOINTS) if self._sealed else current
            if not store.write_checkpoints(self._alias, self.job_id, self._lease_token, stored):
                self.signals.lease_lost = True
                raise LeaseLost(f"job {self.job_id}: lease lost before checkpoint {name!r}")
        self._checkpoints = current

    def report_progress(self, done: float, total: float | None = None, message: str = "") -> None:
        """Say how far the handler got: ``done`` of ``total`` (if known), with a short ``message``.

        Cheap enough for a tight loop: the call only keeps the values in memory. The worker
        writes the last report to the job's ``progress`` about every
        :data:`PROGRESS_WRITE_SECONDS` (from its heartbeat thread, fenced by the lease like
        every write of a running job) and once more when the handler returns, so
        ``job.progress``, ``job.watch()``, the console and the API show it. ``done`` and
        ``total`` are numbers of at least 0 (``total`` at least ``done``); ``message`` at most
        :data:`MAX_PROGRESS_MESSAGE_CHARS` characters. Anything else raises ``ValueError``
        naming the argument.
        """
        # The common case in a few comparisons (a tight loop calls this); anything else, and
        # every refusal with its message, goes through check_progress().
        if not (
            type(done) in _PLAIN_AMOUNTS
            and 0 <= done <= MAX_PROGRESS_AMOUNT
            and (total is None or (type(total) in _PLAIN_AMOUNTS and done <= total <= MAX_PROGRESS_AMOUNT))
            and type(message) is str
            and (
                not message
                or (
                    len(message) <= MAX_PROGRESS_MESSAGE_CHARS and message.isascii() and "\x00" not in message
                )
            )
        ):
            check_progress(done, total, message)
        progress = self._progress
        if progress is None:
            progress = self._progress = ProgressReport(self._sealed)
        progress.value = (done, total, message, time.time())
        progress.reported += 1

    @property
    def reported_progress(self) -> ProgressReport | None:
        """What :meth:`report_progress` recorded (for the worker, which writes it); None before."""
        return self._progress
