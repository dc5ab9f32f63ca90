"""What became of one claimed job: the values the pipeline returns and the completer settles.

A leaf module (it imports nothing of the package), so every layer may name outcomes and
held-job states without an import circle.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

__all__ = [
    "Dead",
    "Duplicate",
    "HandBack",
    "HeldState",
    "Kind",
    "Outcome",
    "PutBack",
    "PutBackCause",
    "Retry",
    "Stale",
    "Succeeded",
    "Tally",
]


class HeldState(enum.Enum):
    """Where a job this worker holds a lease on stands, from claim to ack or hand-back."""

    WAITING = "waiting"  # claimed, no executor has started it yet
    RUNNING = "running"  # an executor runs it
    DONE = "done"  # its executor finished with it (whatever the outcome)
    HANDING_BACK = "handing_back"  # shutdown took it before it started; being handed back
    HANDED_BACK = "handed_back"  # given back to the queue by this worker
    ABANDONED = "abandoned"  # past its hard timeout or the shutdown grace: its thread is left behind


class Kind(enum.Enum):
    """The outcome of one job, as the pipeline decides it."""

    SUCCEEDED = "succeeded"  # the handler ran and the ack committed
    DUPLICATE = "duplicate"  # its idempotency key succeeded already: acked with the stored result
    RETRY = "retry"  # the attempt failed: back in the queue after a backoff
    PUT_BACK = "put_back"  # back in the queue without using an attempt (lock, key owner, outage)
    HAND_BACK = "hand_back"  # the worker stops: given back at once
    DEAD = "dead"  # dead-lettered
    STALE = "stale"  # the ack was refused (the lease moved on): nothing committed


class Tally(enum.Enum):
    """What ``Worker.summary()`` counts per finished job."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"
    PUT_BACK = "put_back"


class PutBackCause(enum.Enum):
    """Why a job went back without using an attempt: its handler did not run, or its writes rolled back."""

    LOCK_CONTENDED = "lock_contended"
    IDEMPOTENCY_WAIT = "idempotency_wait"
    LOCK_UNAVAILABLE = "lock_unavailable"
    #: A sync task claimed by a worker with no executor threads (``--concurrency 0``).
    NEEDS_THREAD = "needs_thread"
    #: An atomic job's ack met a prepared statement an undeclared pooler had lost: the
    #: transaction rolled back with the handler's writes, so the job runs again at once.
    STATEMENT_LOST = "statement_lost"


@dataclasses.dataclass(frozen=True, slots=True)
class Succeeded:
    """The handler returned. Acked already (inside the job's transaction), unless ``ack_json``
    is set: then the completer writes the ack, batched with others, before reporting it."""

    kind: ClassVar[Kind] = Kind.SUCCEEDED
    result: Any
    duration: float
    #: The JSON result of an ack still to write; None once it is written.
    ack_json: str | None = None
    #: The idempotency scope whose key the ack marks succeeded ("" for a job without a key).
    scope: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Duplicate:
    kind: ClassVar[Kind] = Kind.DUPLICATE
    result: Any
    scope: str


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    kind: ClassVar[Kind] = Kind.RETRY
    error: BaseException
    category: str
    delay: float
    duration: float | None
    error_class: str
    message: str
    traceback: str


@dataclasses.dataclass(frozen=True, slots=True)
class PutBack:
    kind: ClassVar[Kind] = Kind.PUT_BACK
    cause: PutBackCause
    delay: float
    #: Stored as the job's last error (a lock outage says what failed), or None.
    error: str | None = None
    #: The lock store's failure, for the log line.
    detail: BaseException | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class HandBack:
    kind: ClassVar[Kind] = Kind.HAND_BACK
    started: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Dead:
    kind: ClassVar[Kind] = Kind.DEAD
    reason: str
    category: str
    error_class: str
    message: str
    traceback: str = ""
    duration: float | None = None
    #: The task's idempotency scope (None when the task is unknown).
    scope: str | None = None
    #: The exception of a failed attempt; None when the handler never ran (bad payload, unknown task).
    error: BaseException | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Stale:
    kind: ClassVar[Kind] = Kind.STALE
    operation: str = "ack"


Outcome = Succeeded | Duplicate | Retry | PutBack | HandBack | Dead | Stale
