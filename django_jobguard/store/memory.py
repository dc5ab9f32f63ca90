"""An in-memory store: the job and key operations of the store contract, with no database.

For tests with no database: ``JOBGUARD["STORE"] = "memory"`` serves the settings' alias from
one :class:`MemoryStore` per process (:func:`~django_jobguard.store.memory_store` returns it),
and ``store.substitute(alias, MemoryStore())`` serves an alias from a store of the test's own.
Refused outside tests (:func:`allowed`; check ``jobguard.E059``). Documented in
docs/reference/memory-store.md.

It keeps the contract's rules: claims in ``priority``, ``run_after``, id order, never a paused
queue or a job out of attempts; every write to a held job fenced by its lease token; leases
timed by one clock (the store's ``now``, which a test may move). Beside the jobs and keys it
keeps what the enqueue-to-ack path writes elsewhere on a database: the writes to key rows after
their insert (``store/key_rows.py``), checkpoints, dead letters, the database lock back end's
rows (``store/locks.py``), and transactions of its own (:meth:`MemoryStore.transaction`, which
restore its records when the block raises). It is not a database: nothing is durable or shared
between processes, it is not part of the caller's database transaction, one lock serialises
every call (as SQLite's one writer does), and breakers, retry budgets and workflows are not
here. mypy checks it against :class:`~.dialect.JobStore`, and ``tests/store_contract/`` runs
each contract test it can serve on it beside the database: where the two disagree, this module
is wrong.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import itertools
import json
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..flow import stored_flow_keys
from .common import (
    INSERT_FIELDS,
    LEASE_EXPIRED_ERROR,
    LEASE_EXPIRED_MESSAGE,
    PERCENTILES,
    REAP_BATCH,
    AttemptError,
    ClaimedJob,
    DurationRow,
    Inserted,
)
from .flow_sql import mark_unreadable

if TYPE_CHECKING:
    from ..flow import FlowPlan, Throttle
    from ..models import DeadLetter, IdempotencyKey, Job
    from .dialect import JobStore

__all__ = ["MemoryStore", "StoredJob", "StoredKey", "StoredLock", "allowed"]


def allowed() -> bool:
    """Whether ``JOBGUARD["STORE"] = "memory"`` may serve jobs in this process.

    Only under Django's test environment (``setup_test_environment()``, which Django's test
    runner and pytest-django call before any test) or with ``DEBUG`` on: a production process
    would accept jobs that no worker ever sees and that vanish when it exits.
    """
    from django.conf import settings
    from django.test import utils  # only when the memory store is asked for

    return bool(settings.DEBUG) or hasattr(utils._TestState, "saved_data")  # noqa: SLF001


@dataclasses.dataclass
class StoredJob:
    """One job row, as the store keeps it."""

    id: int
    fields: dict[str, Any]
    run_after: datetime.datetime
    enqueued_at: datetime.datetime
    status: str = "queued"
    attempts: int = 0
    lease_token: str | None = None
    lease_expires_at: datetime.datetime | None = None
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None
    worker_id: str = ""
    last_error: str = ""
    first_failed_at: datetime.datetime | None = None
    reappearances: int = 0
    lock_contentions: int = 0
    cancel_requested: bool = False
    result: Any = None
    attempt_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    checkpoints: dict[str, Any] = dataclasses.field(default_factory=dict)
    progress: dict[str, Any] | None = None

    @property
    def queue_name(self) -> str:
        return str(self.fields["queue_name"])

    def claimed(self) -> ClaimedJob:
        f = self.fields
        return ClaimedJob(
            id=self.id,
            task_name=f["task_name"],
            queue_name=f["queue_name"],
            args=list(f["args"]),
            kwargs=dict(f["kwargs"]),
            priority=f["priority"],
            attempts=self.attempts,
            max_attempts=f["max_attempts"],
            lease_token=self.lease_token or "",
            visibility_timeout=float(f["visibility_timeout"]),
            idempotency_key=f["idempotency_key"],
            lock_key=f["lock_key"] or "",
            handler_version=f["handler_version"] or "",
        )


@dataclasses.dataclass
class StoredKey:
    """One idempotency key row."""

    id: int
    fingerprint: str
    expires_at: datetime.datetime
    job_id: int | None
    status: str = "in_progress"
    result: Any = None
    duplicates: int = 0
    created_at: datetime.datetime | None = None
    updated_at: datetime.datetime | None = None


@dataclasses.dataclass
class StoredLock:
    """One row of the database lock back end (see :mod:`.locks`)."""

    fencing_token: int
    token: str | None = None
    expires_at: datetime.datetime | None = None
    acquired_at: datetime.datetime | None = None


class MemoryStore:
    """The store contract in memory: one instance is one database."""

    CLAIM_READS_PAUSES = True  # it reads :attr:`paused` itself
    ACKS_COMMIT_ALONE = True  # under its lock

    def __init__(self, now: Callable[[], datetime.datetime] = timezone.now) -> None:
        #: The store's clock: what leases and due times are measured by.
        self.now = now
        self.jobs: dict[int, StoredJob] = {}
        self.keys: dict[tuple[str, str], StoredKey] = {}
        #: Flow-control rate keys: their theoretical arrival times (seconds since the epoch).
        self.arrivals: dict[str, float] = {}
        #: Names of the paused queues.
        self.paused: set[str] = set()
        #: The database lock back end's rows, by key.
        self.locks: dict[str, StoredLock] = {}
        #: Dead letters written for its jobs (unsaved ``DeadLetter`` instances, ids given here).
        self.dead_letters: list[DeadLetter] = []
        self._ids = itertools.count(1)
        self._key_ids = itertools.count(1)
        self._letter_ids = itertools.count(1)
        self._lock = threading.RLock()
        #: Open :meth:`transaction` blocks of the thread holding the lock, and what runs after
        #: the outermost one commits.
        self._depth = 0
        self._after_commit: list[Callable[[], None]] = []

    def clear(self) -> None:
        """Forget every job, key, lock row, dead letter, rate and pause (between tests)."""
        with self._lock:
            self.jobs.clear()
            self.keys.clear()
            self.arrivals.clear()
            self.paused.clear()
            self.locks.clear()
            self.dead_letters.clear()

    # -- transactions ------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A block whose writes all stay or all go: the state is restored if it raises.

        It holds the store's lock throughout (one writer at a time, as on SQLite). What
        :meth:`on_commit` was given runs after the outermost block ends without an error.
        """
        with self._lock:
            saved = copy.deepcopy((self.jobs, self.keys, self.arrivals, self.locks, self.dead_letters))
            pending = len(self._after_commit)
            self._depth += 1
            try:
                yield
            except BaseException:
                self.jobs, self.keys, self.arrivals, self.locks, self.dead_letters = saved
                del self._after_commit[pending:]  # what this block asked for goes with it
                raise
            finally:
                self._depth -= 1
            if self._depth:
                return
            callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            callback()

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the outermost open :meth:`transaction` commits (now if none)."""
        with self._lock:
            if self._depth:
                self._after_commit.append(callback)
                return
        callback()

    # -- the connection ----------------------------------------------------------------------

    def writes_while_busy(self, alias: str) -> bool:
        return True

    def cursor_lock(self, alias: str) -> threading.RLock | None:
        return None

    def database_now(self, alias: str) -> datetime.datetime:
        return self.now()

    # -- enqueue -----------------------------------------------------------------------------

    def insert_jobs(
        self,
        alias: str,
        rows: Sequence[dict[str, Any]],
        run_after: datetime.datetime | datetime.timedelta | None = None,
    ) -> list[Inserted]:
        with self._lock:
            now = self.now()
            due = (
                now
                if run_after is None
                else run_after
                if isinstance(run_after, datetime.datetime)
                else now + run_after
            )
            inserted: list[Inserted] = []
            for row in rows:
                fields = {name: row.get(name) for name in INSERT_FIELDS}
                fields["args"] = json.loads(json.dumps(fields["args"]))
                fields["kwargs"] = json.loads(json.dumps(fields["kwargs"]))
                job = StoredJob(id=next(self._ids), fields=fields, run_after=due, enqueued_at=now)
                self.jobs[job.id] = job
                inserted.append((job.id, due, now))
            return inserted

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
        with self._lock:
            if (
                self.insert_key(
                    alias, scope, row["idempotency_key"], fingerprint, None, expires_at=expires_at
                )
                is None
            ):
                return None
            (inserted,) = self.insert_jobs(alias, [row], run_after)
            self.keys[(scope, row["idempotency_key"])].job_id = inserted[0]
            return inserted

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
        with self._lock:
            if (scope, key) in self.keys:
                return None
            now = self.now()
            row = StoredKey(
                id=next(self._key_ids),
                fingerprint=digest,
                expires_at=expires_at,
                job_id=job_id,
                created_at=now,
                updated_at=now,
            )
            self.keys[(scope, key)] = row
            return row.id

    def key_owner(self, alias: str, scope: str, key: str) -> tuple[int | None, str] | None:
        row = self.keys.get((scope, key))
        return None if row is None else (row.job_id, row.status)

    def record_key_success(
        self, alias: str, scope: str, key: str, job_id: int, result_json: str | None
    ) -> bool:
        with self._lock:
            row = self.keys.get((scope, key))
            if row is None or row.job_id != job_id:
                return False
            row.status = "succeeded"
            row.result = None if result_json is None else json.loads(result_json)
            return True

    # -- leases ------------------------------------------------------------------------------

    def claim(
        self,
        alias: str,
        queues: Sequence[str] | None,
        batch_size: int,
        worker_id: str,
        exclude: Sequence[str],
    ) -> list[ClaimedJob]:
        with self._lock:
            return self._lease(self._due(queues, exclude)[:batch_size], worker_id)

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
        # One lock serialises every call, so the counting and the leasing are one step, as
        # the databases' limited claims are one turn (see store/flow_sql.py).
        with self._lock:
            now = self.now().timestamp()
            running: Counter[str] = Counter()
            for job in self.jobs.values():
                if job.status == "running":
                    stored = stored_flow_keys(job.fields.get("flow_keys", []))
                    for key in plan.keys_of(job.fields["task_name"], job.queue_name, stored or []):
                        running[key] += 1

            def room(key: str) -> bool:
                capacity = plan.capacity(key)
                if capacity is not None and running[key] >= capacity:
                    return False
                rate = plan.rate(key)
                return rate is None or max(self.arrivals.get(key, now), now) - now <= rate.tolerance + 1e-6

            admitted = []
            # Stored flow keys that are not a list of strings: counted under none, leased, and
            # dead-lettered by the worker (as the databases' limited claims do).
            unreadable: dict[int, Any] = {}
            for job in self._due(queues, exclude):
                stored = stored_flow_keys(job.fields.get("flow_keys", []))
                keys = plan.keys_of(job.fields["task_name"], job.queue_name, stored or [])
                if not all(room(key) for key in keys):
                    continue
                admitted.append(job)
                if stored is None:
                    unreadable[job.id] = json.dumps(job.fields.get("flow_keys"), default=repr)
                for key in keys:
                    running[key] += 1
                    rate = plan.rate(key)
                    if rate is not None:
                        self.arrivals[key] = max(self.arrivals.get(key, now), now) + rate.interval
                if len(admitted) >= batch_size:
                    break
            if throttle is not None:
                waits = [
                    arrival - now - rate.tolerance
                    for key, arrival in self.arrivals.items()
                    if (rate := plan.rate(key)) is not None and arrival - now > rate.tolerance + 1e-6
                ]
                throttle.retry_after = min(waits) if waits else None
            return mark_unreadable(self._lease(admitted, worker_id), unreadable)

    def _due(self, queues: Sequence[str] | None, exclude: Sequence[str]) -> list[StoredJob]:
        """The due jobs of ``queues`` (all but ``exclude`` if None) in claim order."""
        now = self.now()
        due = [
            job
            for job in self.jobs.values()
            if job.status == "queued"
            and job.run_after <= now
            and job.attempts < job.fields["max_attempts"]
            and job.queue_name not in self.paused
            and (job.queue_name in queues if queues else job.queue_name not in exclude)
        ]
        due.sort(key=lambda job: (-job.fields["priority"], job.run_after, job.id))
        return due

    def _lease(self, jobs: Sequence[StoredJob], worker_id: str) -> list[ClaimedJob]:
        now = self.now()
        claimed = []
        for job in jobs:
            job.status = "running"
            job.attempts += 1
            job.lease_token = secrets.token_hex(16)
            job.lease_expires_at = now + datetime.timedelta(seconds=job.fields["visibility_timeout"])
            job.started_at = now
            job.worker_id = worker_id
            job.attempt_history.append({"worker_id": worker_id, "started_at": now.isoformat()})
            claimed.append(job.claimed())
        return claimed

    def _held(self, job_id: int, lease_token: str) -> StoredJob | None:
        job = self.jobs.get(job_id)
        return (
            job
            if job is not None and job.lease_token is not None and job.lease_token == lease_token
            else None
        )

    def heartbeat(self, alias: str, ids: list[int], tokens: list[str]) -> list[tuple[int, bool]]:
        with self._lock:
            now = self.now()
            renewed = []
            for job_id in ids:
                job = self.jobs.get(job_id)
                if job is None or job.lease_token not in tokens:
                    continue
                job.lease_expires_at = now + datetime.timedelta(seconds=job.fields["visibility_timeout"])
                renewed.append((job_id, job.cancel_requested))
            return renewed

    def complete(
        self, alias: str, job_id: int, lease_token: str, result_json: str, *, commit: bool = False
    ) -> bool:
        with self._lock:
            job = self._held(job_id, lease_token)
            if job is None:
                return False
            job.status, job.finished_at, job.result = "succeeded", self.now(), json.loads(result_json)
            job.lease_token = job.lease_expires_at = None
            return True

    def complete_many(self, alias: str, acks: Sequence[tuple[int, str, str]]) -> list[tuple[int, bool]]:
        with self._lock:
            # It keeps no dependencies: nothing waits for any of its jobs.
            return [
                (job_id, False)
                for job_id, token, result in acks
                if self.complete(alias, job_id, token, result)
            ]

    def discard_queued(self, alias: str, job_id: int) -> None:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is not None and job.status == "queued":
                del self.jobs[job_id]

    def _failed(self, job: StoredJob, now: datetime.datetime, attempt_error: AttemptError) -> None:
        if job.attempt_history:
            error_class, error, traceback = attempt_error
            job.attempt_history[-1].update(
                finished_at=now.isoformat(), error_class=error_class, error=error, traceback=traceback
            )

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
        with self._lock:
            job = self._held(job_id, lease_token)
            if job is None:
                return False
            now = self.now()
            job.status, job.lease_token, job.lease_expires_at, job.worker_id = "queued", None, None, ""
            job.run_after = now + datetime.timedelta(seconds=delay)
            job.attempts -= 1 if refund_attempt else 0
            job.lock_contentions += 1 if contention else 0
            if error is not None:
                job.last_error = error
                job.first_failed_at = job.first_failed_at or now
            if refund_attempt:
                # The refunded claim's start goes with its entry (as the SQL stores do).
                previous = job.attempt_history[-2]["started_at"] if len(job.attempt_history) > 1 else None
                job.started_at = datetime.datetime.fromisoformat(previous) if previous else None
                del job.attempt_history[-1:]
            elif attempt_error is not None:
                self._failed(job, now, attempt_error)
            return True

    def mark_dead(
        self, alias: str, job_id: int, lease_token: str, error: str, attempt_error: AttemptError | None
    ) -> bool:
        with self._lock:
            job = self._held(job_id, lease_token)
            if job is None:
                return False
            now = self.now()
            job.status, job.finished_at, job.lease_token, job.lease_expires_at = "dead", now, None, None
            job.last_error = error
            job.first_failed_at = job.first_failed_at or now
            if attempt_error is not None:
                self._failed(job, now, attempt_error)
            return True

    def reap(
        self, alias: str, batch_size: int = REAP_BATCH
    ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        with self._lock:
            now = self.now()
            expired = sorted(
                (
                    job
                    for job in self.jobs.values()
                    if job.status == "running"
                    and job.lease_expires_at is not None
                    and job.lease_expires_at < now
                ),
                key=lambda job: (job.lease_expires_at, job.id),
            )
            requeued: list[tuple[int, str]] = []
            exhausted: list[tuple[int, str]] = []
            for job in expired:
                if job.attempts >= job.fields["max_attempts"]:
                    if len(exhausted) < batch_size:
                        exhausted.append((job.id, job.lease_token or ""))
                elif len(requeued) < batch_size:
                    job.status, job.lease_token, job.lease_expires_at, job.worker_id = (
                        "queued",
                        None,
                        None,
                        "",
                    )
                    job.run_after, job.reappearances = now, job.reappearances + 1
                    job.first_failed_at = job.first_failed_at or now
                    job.last_error = LEASE_EXPIRED_MESSAGE
                    self._failed(job, now, LEASE_EXPIRED_ERROR)
                    requeued.append((job.id, job.queue_name))
            return requeued, exhausted

    # -- checkpoints -------------------------------------------------------------------------

    def read_checkpoints(self, job_id: int) -> dict[str, Any]:
        with self._lock:
            job = self.jobs.get(job_id)
            return {} if job is None else copy.deepcopy(job.checkpoints)

    def write_checkpoints(self, job_id: int, lease_token: str | None, checkpoints: dict[str, Any]) -> bool:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None or job.lease_token is None or job.lease_token != lease_token:
                return False
            job.checkpoints = json.loads(json.dumps(checkpoints))
            return True

    def write_progress(self, reports: Sequence[tuple[int, str, dict[str, Any]]]) -> int:
        """Store each job's reported progress, ``(id, lease token, progress)``, fenced; rows written."""
        written = 0
        with self._lock:
            for job_id, lease_token, progress in reports:
                job = self.jobs.get(job_id)
                if job is not None and job.lease_token is not None and job.lease_token == lease_token:
                    job.progress = json.loads(json.dumps(progress))
                    written += 1
        return written

    # -- the rows as models ------------------------------------------------------------------

    def job_model(self, alias: str, job_id: int) -> Job:
        """The job as a ``Job`` instance (not saved anywhere: reading it is all it is for)."""
        from ..models import Job  # app registry: as in store/common.py

        with self._lock:
            job = self.jobs[job_id]
            columns = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name != "fields"}
            values = {**copy.deepcopy(job.fields), **copy.deepcopy(columns)}
        names = [field.attname for field in Job._meta.concrete_fields]
        defaults = {field.attname: field.get_default() for field in Job._meta.concrete_fields}
        return Job.from_db(alias, names, [values.get(name, defaults[name]) for name in names])

    def key_model(self, alias: str, scope: str, key: str) -> IdempotencyKey | None:
        """The key as an ``IdempotencyKey`` with its ``job`` (None if the job is gone)."""
        from ..models import IdempotencyKey  # app registry: as in store/common.py

        with self._lock:
            row = self.keys.get((scope, key))
            if row is None:
                return None
            model = IdempotencyKey(
                id=row.id,
                key=key,
                scope=scope,
                fingerprint=row.fingerprint,
                status=row.status,
                result=copy.deepcopy(row.result),
                job_id=row.job_id,
                duplicates=row.duplicates,
                created_at=row.created_at or self.now(),
                updated_at=row.updated_at or self.now(),
                expires_at=row.expires_at,
            )
            model.job = None if row.job_id not in self.jobs else self.job_model(alias, row.job_id)
        model._state.adding = False
        model._state.db = alias
        return model

    # -- idempotency key rows after their insert (store/key_rows.py) -------------------------

    def _key_by_id(self, key_id: int) -> StoredKey | None:
        return next((row for row in self.keys.values() if row.id == key_id), None)

    def update_key(self, key_id: int, **changes: Any) -> None:
        """Set fields of the key row ``key_id``, as key_rows' ORM updates do.

        A value ``"now"`` is the store's clock, as ``Now()`` is the database's; ``duplicates="+1"``
        adds one, as ``F("duplicates") + 1`` does.
        """
        with self._lock:
            row = self._key_by_id(key_id)
            if row is not None:
                self._change_key(row, changes)

    def update_keys(
        self,
        *,
        scope: str | None = None,
        key: str | None = None,
        job_ids: Collection[int] = (),
        **changes: Any,
    ) -> None:
        """Set fields of the key rows matching ``scope``/``key`` or owned by one of ``job_ids``."""
        with self._lock:
            for (row_scope, row_key), row in self.keys.items():
                if (scope is None or row_scope == scope) and (key is None or row_key == key):
                    if not job_ids or row.job_id in job_ids:
                        self._change_key(row, changes)

    def _change_key(self, row: StoredKey, changes: dict[str, Any]) -> None:
        now = self.now()
        for name, value in changes.items():
            if name == "duplicates" and value == "+1":
                row.duplicates += 1
                continue
            setattr(row, name, now if value == "now" else value)

    # -- dead letters ------------------------------------------------------------------------

    def save_dead_letter(self, letter: DeadLetter) -> DeadLetter:
        """Keep ``letter`` (an unsaved ``DeadLetter``) as its job's dead letter, with an id."""
        with self._lock:
            letter.id = next(self._letter_ids)
            letter.created_at = self.now()
            letter._state.adding = False
            self.dead_letters.append(letter)
            return letter

    # -- the database lock back end's rows (store/locks.py) ----------------------------------

    def acquire_lock(self, key: str, token: str, ttl: float) -> int | None:
        with self._lock:
            now = self.now()
            row = self.locks.get(key)
            if row is None:
                row = self.locks[key] = StoredLock(fencing_token=int(now.timestamp() * 1_000_000) - 1)
            elif row.token is not None and row.expires_at is not None and row.expires_at > now:
                return None
            row.fencing_token += 1
            row.token, row.expires_at, row.acquired_at = token, now + datetime.timedelta(seconds=ttl), now
            return row.fencing_token

    def release_lock(self, key: str, token: str) -> bool:
        with self._lock:
            row = self._held_lock(key, token)
            if row is None:
                return False
            row.token = row.expires_at = None
            return True

    def extend_lock(self, key: str, token: str, ttl: float) -> bool:
        with self._lock:
            row = self._held_lock(key, token)
            if row is None:
                return False
            row.expires_at = self.now() + datetime.timedelta(seconds=ttl)
            return True

    def lock_held(self, key: str) -> bool:
        with self._lock:
            row = self.locks.get(key)
            return row is not None and row.token is not None and self._live(row)

    def prune_locks(self, older_than: float, *, dry_run: bool = False) -> int:
        with self._lock:
            before = self.now() - datetime.timedelta(seconds=older_than)
            old = [
                key
                for key, row in self.locks.items()
                if (row.token is None and row.acquired_at is not None and row.acquired_at < before)
                or (row.token is not None and row.expires_at is not None and row.expires_at < before)
            ]
            if not dry_run:
                for key in old:
                    del self.locks[key]
            return len(old)

    def _live(self, row: StoredLock) -> bool:
        return row.expires_at is not None and row.expires_at > self.now()

    def _held_lock(self, key: str, token: str) -> StoredLock | None:
        row = self.locks.get(key)
        return row if row is not None and row.token == token and self._live(row) else None

    # -- reporting ---------------------------------------------------------------------------

    def oldest_due_ages(self, alias: str) -> dict[str, float]:
        with self._lock:
            now = self.now()
            ages: dict[str, float] = {}
            for job in self.jobs.values():
                if job.status == "queued" and job.run_after <= now:
                    age = (now - job.run_after).total_seconds()
                    ages[job.queue_name] = max(ages.get(job.queue_name, 0.0), age)
            return ages

    def observed_durations(self, alias: str, since: float, queue: str | None) -> list[DurationRow]:
        with self._lock:
            start = self.now() - datetime.timedelta(seconds=since)
            runs: dict[tuple[str, str], list[float]] = {}
            for job in self.jobs.values():
                if job.status != "succeeded" or job.started_at is None or job.finished_at is None:
                    continue
                if job.finished_at < start or (queue is not None and job.queue_name != queue):
                    continue
                key = (job.queue_name, job.fields["task_name"])
                runs.setdefault(key, []).append((job.finished_at - job.started_at).total_seconds())
            return [
                (q, t, len(d), [_percentile(sorted(d), f) for f in PERCENTILES], max(d))
                for (q, t), d in sorted(runs.items())
            ]


def _percentile(values: list[float], fraction: float) -> float:
    """``percentile_cont``: linear interpolation between the two nearest ranks."""
    position = fraction * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (position - low) * (values[high] - values[low])


if TYPE_CHECKING:
    # mypy checks the class against the contract here.
    _CONFORMS: type[JobStore] = MemoryStore
