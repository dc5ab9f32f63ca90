"""The store contract: what one database's module must provide, as :class:`typing.Protocol` s.

:class:`JobStore` is the operations on jobs and keys; :class:`Dialect` adds what only a
database has (its clock's SQL, for the statements written once in :mod:`.locks`).
:mod:`.postgres`, :mod:`.sqlite` and :mod:`.mysql` are *modules* that implement :class:`Dialect`: the
package assigns them to ``Dialect`` in ``store/__init__.py``, so mypy checks every function
of each module against the signatures below, and a dialect that drifts (a missing
function, a renamed parameter, another return type) fails ``make lint``. A new database
is one more module that mypy checks here and the contract suite in
``tests/store_contract/`` runs against. The in-memory store (:mod:`.memory`) is a
:class:`JobStore`, checked the same way.

What each function must do, on every store:

- Lease times come from the store's one clock (a database's, never the worker's).
- Every write to a job a worker holds matches ``id AND lease_token`` (fencing): with a
  token that is not the current one it changes nothing and reports so (False, or the id
  missing from the result). A claim writes a fresh random token; every path that takes a
  job away from its worker (requeue, mark-dead, the reaper) clears it.
- Claims take due, queued jobs with attempts left, highest ``priority`` first, then
  earliest ``run_after``, then lowest id; two concurrent claims never take the same job.
  (On PostgreSQL a worker's claim may start where its last one stopped: a job that became
  claimable behind that point waits for the worker's next full claim, see ``postgres``.)
- A limited claim (flow control) admits a job only if every limit it counts under has
  room, counted across every process; a job it leaves is not touched (no attempt).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from ..flow import FlowPlan, Throttle
from .common import REAP_BATCH, AttemptError, ClaimedJob, Clock, CounterChange, DurationRow, Inserted

__all__ = ["Dialect", "JobStore"]


class JobStore(Protocol):
    """The operations on jobs and keys: what a database's module, or the in-memory store, provides."""

    #: Whether :meth:`claim` leaves paused queues alone by itself (else the caller reads them first).
    CLAIM_READS_PAUSES: bool
    #: Whether :meth:`complete_many` commits a batch as one unit by itself (one statement, or
    #: a transaction of its own), so acks with no key and no workflow need no transaction around.
    ACKS_COMMIT_ALONE: bool

    # -- the connection ----------------------------------------------------------------------

    def writes_while_busy(self, alias: str) -> bool:
        """Whether another connection can write while a job's transaction is open."""
        ...

    def cursor_lock(self, alias: str) -> threading.RLock | None:
        """A lock this thread's connection holds while a cursor of it is open, or None if not needed."""
        ...

    def database_now(self, alias: str) -> datetime.datetime:
        """The database clock, now (aware)."""
        ...

    # -- enqueue -----------------------------------------------------------------------------

    def insert_jobs(
        self,
        alias: str,
        rows: Sequence[dict[str, Any]],
        run_after: datetime.datetime | datetime.timedelta | None = None,
    ) -> list[Inserted]:
        """Insert queued jobs; ``(id, run_after, enqueued_at)`` each, in the order of ``rows``."""
        ...

    def insert_keyed_job(
        self,
        alias: str,
        row: dict[str, Any],
        run_after: datetime.datetime | datetime.timedelta | None,
        *,
        scope: str,
        fingerprint: str,
        expires_at: datetime.datetime,
    ) -> Inserted | None:
        """Insert a job and its new idempotency key atomically; None, writing nothing, if the key exists."""
        ...

    # -- idempotency keys --------------------------------------------------------------------

    def insert_key(
        self,
        alias: str,
        scope: str,
        key: str,
        digest: str,
        job_id: int | None,
        *,
        expires_at: datetime.datetime,
    ) -> int | None:
        """Insert an in-progress key unless it exists (never raising on a duplicate); its id, or None."""
        ...

    def key_owner(self, alias: str, scope: str, key: str) -> tuple[int | None, str] | None:
        """``(job id, status)`` of the key, or None if there is none."""
        ...

    def record_key_success(
        self, alias: str, scope: str, key: str, job_id: int, result_json: str | None
    ) -> bool:
        """Mark the key succeeded with the JSON result, if ``job_id`` owns it."""
        ...

    # -- leases ------------------------------------------------------------------------------

    def claim(
        self,
        alias: str,
        queues: Sequence[str] | None,
        batch_size: int,
        worker_id: str,
        exclude: Sequence[str],
    ) -> list[ClaimedJob]:
        """Lease up to ``batch_size`` due jobs of ``queues`` (every queue but ``exclude`` if None)."""
        ...

    def claim_limited(
        self,
        alias: str,
        queues: Sequence[str] | None,
        batch_size: int,
        worker_id: str,
        exclude: Sequence[str],
        plan: FlowPlan,
        throttle: Throttle | None = None,
    ) -> list[ClaimedJob]:
        """Lease as :meth:`claim` does, only the jobs every flow-control limit of ``plan`` has room for.

        Never more running jobs under a concurrency key than its limit, counted from the
        running rows, whatever other claims run at once; never more starts of a rate key
        than its rate and burst allow; jobs of full keys do not hold back the others.
        Paused queues are left alone as by :meth:`claim`. ``throttle`` receives when a rate
        that held jobs back next admits a start.
        """
        ...

    def heartbeat(self, alias: str, ids: list[int], tokens: list[str]) -> list[tuple[int, bool]]:
        """Extend the leases still held: ``(id, cancel requested)`` of each one renewed."""
        ...

    def complete(
        self, alias: str, job_id: int, lease_token: str, result_json: str, *, commit: bool = False
    ) -> bool:
        """Mark the job succeeded, fenced; ``commit``: it may also commit the outermost block."""
        ...

    def complete_many(self, alias: str, acks: Sequence[tuple[int, str, str]]) -> list[tuple[int, bool]]:
        """Mark several jobs succeeded, each fenced; ``(id, has_dependants)`` of those whose lease was held.

        ``has_dependants`` is read from the row the fenced write locked, so a dependant added
        while the job ran is seen.
        """
        ...

    def discard_queued(self, alias: str, job_id: int) -> None:
        """Delete the job if it is still queued."""
        ...

    def requeue(
        self,
        alias: str,
        job_id: int,
        lease_token: str,
        *,
        delay: float,
        error: str | None,
        refund_attempt: bool,
        contention: bool,
        attempt_error: AttemptError | None,
    ) -> bool:
        """Give the job back to its queue, due after ``delay`` seconds, fenced."""
        ...

    def mark_dead(
        self, alias: str, job_id: int, lease_token: str, error: str, attempt_error: AttemptError | None
    ) -> bool:
        """Mark the job dead, fenced."""
        ...

    def reap(
        self, alias: str, batch_size: int = REAP_BATCH
    ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        """Requeue expired leases with attempts left; report ``(id, token)`` of the exhausted ones."""
        ...

    # -- reporting ---------------------------------------------------------------------------

    def oldest_due_ages(self, alias: str) -> dict[str, float]:
        """Seconds the oldest due job of each queue has waited."""
        ...

    def observed_durations(self, alias: str, since: float, queue: str | None) -> list[DurationRow]:
        """Claim-to-ack seconds of recent successes per (queue, task), with percentiles."""
        ...


class Dialect(JobStore, Protocol):
    """One database's store: a module whose functions have the signatures of :class:`JobStore`."""

    #: The database clock's SQL (now, now plus some seconds), for the statements written once for all.
    CLOCK: Clock

    def acquire_lock(self, alias: str, key: str, token: str, ttl: float) -> int | None:
        """Take the database lock ``key`` for ``token`` if free or expired; its new fencing token, or None."""
        ...

    def add_workflow_counts(self, alias: str, changes: Sequence[CounterChange]) -> list[tuple[int, int]]:
        """Add ``(pending, succeeded, failed)`` to workflow counter rows, creating missing ones.

        ``changes`` come in (workflow, shard) order, one per row, and the rows are locked in
        that order, so two writers never wait for each other in a circle. Returns
        ``(workflow id, pending)`` of each row after the change; the caller's transaction
        holds the rows until it ends.
        """
        ...
