"""``JobContext``: what a ``takes_context=True`` handler learns about its own run."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from . import store
from ._json import normalize_json
from .exceptions import InvalidTaskError, LeaseLost

if TYPE_CHECKING:
    from .task import Task

__all__ = ["Flag", "JobContext", "RunSignals"]


class Flag:
    """A signal one thread raises and others read: ``set()`` and ``is_set()``, as an Event has.

    Nobody waits on it (a handler reads it between its steps), so it needs no lock and no
    condition: a threading.Event allocates both, and a worker makes three per job.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def __repr__(self) -> str:
        return f"Flag({self._set})"


class RunSignals:
    """What the worker learns about a running job and tells its handler (set by the heartbeat)."""

    __slots__ = ("cancel_requested", "lease_lost", "lock_lost")

    def __init__(self) -> None:
        self.lease_lost = Flag()
        self.lock_lost = Flag()
        self.cancel_requested = Flag()


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
        return self.signals.lease_lost.is_set()

    @property
    def cancel_requested(self) -> bool:
        """An operator asked to cancel this running job (delivered by the heartbeat).

        Nothing stops the handler: a long one checks this between steps and returns (or
        raises :class:`~django_jobguard.PermanentError`) where stopping is safe.
        """
        return self.signals.cancel_requested.is_set()

    @property
    def lock_lost(self) -> bool:
        """True once the worker failed to renew this job's lock."""
        return self.signals.lock_lost.is_set()

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def checkpoints(self) -> dict[str, Any]:
        """Recovery points recorded by earlier attempts of this job (name → data)."""
        if self._checkpoints is None:
            self._checkpoints = store.read_checkpoints(self._alias, self.job_id) if self.job_id else {}
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
            if not store.write_checkpoints(self._alias, self.job_id, self._lease_token, current):
                self.signals.lease_lost.set()
                raise LeaseLost(f"job {self.job_id}: lease lost before checkpoint {name!r}")
        self._checkpoints = current
