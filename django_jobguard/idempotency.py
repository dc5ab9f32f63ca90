"""Idempotency keys: argument fingerprints, dedupe at enqueue and at execution, pruning.

A key names a business action (``charge:order:123``), not a message. The unique
constraint on ``(scope, key)`` is the final guard: whoever inserts the row first owns the
action; everyone else gets the existing job back, or :class:`IdempotencyConflict` when
the arguments differ.

Each key row has one owner, the job that runs the action (``IdempotencyKey.job``). At
execution a job runs only if it owns the key, or can take it over (the key's action failed,
its job is gone, or the key expired); a job whose key already succeeded is acked with the
stored result instead, and one whose key is owned by another queued or running job waits.

Every write of a key is an ``INSERT ... ON CONFLICT DO NOTHING`` (no error, so no aborted
transaction) or follows a read under ``SELECT ... FOR UPDATE``, inside a transaction (the
caller's, when one is open), so two writers never both win: on PostgreSQL the second
waits on the first's row, on SQLite writers are serialised. Execution decides from a plain
read when the job already owns its key, the usual case.
"""

from __future__ import annotations

import dataclasses
import datetime
import hmac
import json
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections
from django.utils import timezone
from django.utils.crypto import salted_hmac

from . import events, store
from ._json import normalize_json
from .conf import get_settings
from .encryption.indexes import blinds_keys, pick
from .exceptions import IdempotencyConflict, IdempotencyScheduleConflict, InvalidArgumentsError
from .models import DeadLetter, IdempotencyKey, IdempotencyStatus, Job, JobStatus
from .store import key_rows

if TYPE_CHECKING:
    from .task import Task

logger = logging.getLogger("django_jobguard.idempotency")

__all__ = [
    "CONFLICT",
    "DUPLICATE",
    "FINGERPRINT_SALT",
    "RUN",
    "WAIT",
    "Decision",
    "begin_execution",
    "claim_for_replay",
    "enqueue_once",
    "fingerprint",
    "hand_to_replay",
    "record_failure",
    "record_success",
    "same_call",
    "scope_of",
    "stored_result",
]

#: Rounds a decision is retried when the key row vanished under it (pruned meanwhile).
MAX_ROUNDS = 5

#: What the worker does with a keyed job (see :func:`begin_execution`).
RUN = "run"
DUPLICATE = "duplicate"
WAIT = "wait"
CONFLICT = "conflict"


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """Whether a keyed job runs: ``action`` is RUN, DUPLICATE (with ``result``), WAIT or CONFLICT."""

    action: str
    result: Any = None
    message: str = ""


def scope_of(task: Task[Any, Any]) -> str:
    """Where the task's keys are unique: ``idempotency_scope`` or the task name."""
    return task.idempotency_scope or task.name


def _canonical(value: Any) -> Any:
    # A JSON column may hand 1e20 back as 100000000000000000000 and 2.0 as 2: a float with
    # an integral value is fingerprinted as the integer, so the worker's digest of the
    # stored arguments equals the producer's digest of the arguments it passed.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    return value


#: The salt of the keyed fingerprint (with Django's SECRET_KEY): a stored fingerprint tells
#: nothing about the arguments to someone without the secret, however few values they could be.
FINGERPRINT_SALT = "django_jobguard.idempotency.fingerprint"


def fingerprint(task: Task[Any, Any], args: Any, kwargs: Any) -> str:
    """HMAC-SHA256 (keyed with ``SECRET_KEY``) of the task name and the call's arguments by name.

    ``f(1)``, ``f(a=1)`` and ``f(1, b=0)`` (where ``b`` defaults to 0) agree. The task name
    is part of it, so two tasks sharing an ``idempotency_scope`` cannot pass one key
    between them unnoticed. Keyed, because a plain hash of a low-entropy argument (an
    amount, an order number) is reversed by trying every value.
    """
    return _keyed(_canonical_call(task, args, kwargs))


def same_call(stored: str, digest: str, task: Task[Any, Any], args: Any, kwargs: Any) -> bool:
    """Whether a key's stored fingerprint is this call's.

    A key written under a former ``SECRET_KEY`` matches only while that key is in
    ``SECRET_KEY_FALLBACKS``.
    """
    if hmac.compare_digest(stored, digest):
        return True
    canonical = _canonical_call(task, args, kwargs)
    return any(
        hmac.compare_digest(stored, _keyed(canonical, secret)) for secret in settings.SECRET_KEY_FALLBACKS
    )


def _keyed(canonical: str, secret: str | bytes | None = None) -> str:
    return salted_hmac(FINGERPRINT_SALT, canonical, secret=secret, algorithm="sha256").hexdigest()


def _canonical_call(task: Task[Any, Any], args: Any, kwargs: Any) -> str:
    bound = task.bind(args, kwargs)
    given = set(bound.arguments)
    bound.apply_defaults()
    arguments: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        try:
            arguments[name] = normalize_json(value, name)
        except InvalidArgumentsError:
            if name in given:
                raise
            # A default that is not JSON (a sentinel object) cannot come from a payload.
    payload = {"task": task.name, "arguments": _canonical(arguments)}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def blind_key(value: str, scope: str, alias: str) -> str:
    """Idempotency key ``value`` as a task with encrypt=True stores it: its blind index under
    the current key, or under an older one whose key row of ``scope`` exists (a rotation)."""

    def in_use(older: Sequence[str]) -> str | None:
        memory = store.memory_store(alias)
        if memory is not None:
            return next((key for key in older if memory.key_model(alias, scope, key) is not None), None)
        rows = IdempotencyKey.objects.using(alias).filter(scope=scope, key__in=older)
        return rows.values_list("key", flat=True).first()

    return pick(value, in_use)


def _expiry() -> datetime.datetime:
    return timezone.now() + datetime.timedelta(seconds=get_settings().idempotency.ttl)


def insert_key(alias: str, scope: str, key: str, digest: str, job_id: int | None = None) -> int | None:
    """Insert the key (expiring after the TTL) unless it exists; the new row's id, or None if it existed."""
    return store.insert_key(alias, scope, key, digest, job_id, expires_at=_expiry())


def _locked_key(alias: str, scope: str, key: str) -> IdempotencyKey | None:
    """The key row with its job, locked until the transaction ends (PostgreSQL, MariaDB/MySQL)."""
    memory = store.memory_store(alias)
    if memory is not None:  # its transaction holds the store's one lock
        return memory.key_model(alias, scope, key)
    keys = IdempotencyKey.objects.using(alias).filter(scope=scope, key=key)
    if not connections[alias].features.has_select_for_update_of:
        # MariaDB has no FOR UPDATE OF: a join would lock the job row too, in an order a
        # worker's ack (job, then key) could deadlock against. Lock the key alone; the job
        # is read when used.
        return keys.select_for_update().first()
    return keys.select_for_update(of=("self",)).select_related("job").first()


def _key_row(alias: str, scope: str, key: str) -> IdempotencyKey | None:
    """The key row with its job (a plain read)."""
    memory = store.memory_store(alias)
    if memory is not None:
        return memory.key_model(alias, scope, key)
    return IdempotencyKey.objects.using(alias).select_related("job").filter(scope=scope, key=key).first()


def _is_replay(alias: str, job_id: int) -> bool:
    """Whether job ``job_id`` is the replay of a dead letter (the memory store keeps no replays)."""
    if store.memory_store(alias) is not None:
        return False
    return DeadLetter.objects.using(alias).filter(replay_job_id=job_id).exists()


def _is_active(job: Job | None) -> bool:
    return job is not None and job.status in (JobStatus.QUEUED, JobStatus.RUNNING)


def _conflict(task: Task[Any, Any], existing: IdempotencyKey, key: str, scope: str) -> IdempotencyConflict:
    other = existing.job.task_name if existing.job is not None else None
    if other is not None and other != task.name:
        return IdempotencyConflict(key, scope, f"by task {other!r}")
    return IdempotencyConflict(key, scope)


# -- enqueue -------------------------------------------------------------------------------


def enqueue_once(
    task: Task[Any, Any], fields: dict[str, Any], alias: str, create_job: Callable[[], Job]
) -> tuple[Job, bool]:
    """Create the job for a keyed call, or return the job that already owns the key.

    Returns ``(job, created)``. ``create_job`` inserts ``fields`` as a job and returns it.
    Joins the caller's transaction (or opens one), without a savepoint: nothing is written
    before a conflict is known, so a conflict writes nothing and leaves the caller's
    transaction usable.
    """
    scope = scope_of(task)
    if blinds_keys(task.encrypt):
        # Stored as its blind index: the job, its key row and its dead letter never show it.
        fields["idempotency_key"] = blind_key(fields["idempotency_key"], scope, alias)
    key = fields["idempotency_key"]
    digest = fingerprint(task, fields["args"], fields["kwargs"])
    # The usual case, a key never seen: the key and its job inserted together (in one
    # statement on PostgreSQL).
    inserted = store.insert_keyed_job(
        alias, fields, task.run_after, scope=scope, fingerprint=digest, expires_at=_expiry()
    )
    if inserted is not None:
        return store.build_job(alias, fields, inserted), True
    events.emit(events.KeyConflict(task.name, "enqueue"))
    for _ in range(MAX_ROUNDS):
        # The key row, the job and the link between them commit together: in autocommit a
        # key committed before its job would look orphaned to a concurrent enqueue.
        with store.atomic(alias, savepoint=False):
            outcome = _enqueue_round(task, fields, alias, scope, key, digest, create_job)
        if isinstance(outcome, IdempotencyConflict):
            raise outcome  # raised out here, so the caller's transaction is not marked for rollback
        if outcome is not None:
            if not outcome[1]:
                # Counted when the duplicate count on the row commits, so both agree.
                duplicate = events.DuplicatePrevented(task.name, "enqueue")
                store.on_commit(alias, partial(events.emit, duplicate))
            return outcome
    raise RuntimeError(f"idempotency key {key!r} (scope {scope!r}) kept vanishing during enqueue")


def _due_later_than_asked(job: Job, asked: datetime.datetime | datetime.timedelta | None) -> float | None:
    """Seconds by which ``job``, not run yet, is due after the time a repeat asks for (``asked``:
    its ``run_after``, None for now), when that is more than ``SCHEDULE_TOLERANCE``; else None.

    Only a job before its first attempt is compared: its ``run_after`` is still the one it was
    enqueued with, while a retry's is the backoff's, which a repeat has no say in.
    """
    if job.status != JobStatus.QUEUED or job.attempts != 0:
        return None
    now = timezone.now()
    if asked is None:
        wanted = now
    elif isinstance(asked, datetime.timedelta):
        wanted = now + asked
    else:
        wanted = asked
    late = (job.run_after - wanted).total_seconds()
    return late if late > get_settings().idempotency.schedule_tolerance else None


def _schedule_conflict(key: str, scope: str, late: float) -> IdempotencyScheduleConflict:
    return IdempotencyScheduleConflict(
        key,
        scope,
        f"for a job that has not run and is due {late:.0f}s later than this enqueue asks "
        f"(more than JOBGUARD['IDEMPOTENCY']['SCHEDULE_TOLERANCE'] = "
        f"{get_settings().idempotency.schedule_tolerance:g}s), so it cannot stand for this one",
    )


def _enqueue_round(
    task: Task[Any, Any],
    fields: dict[str, Any],
    alias: str,
    scope: str,
    key: str,
    digest: str,
    create_job: Callable[[], Job],
) -> tuple[Job, bool] | IdempotencyConflict | None:
    """One try: the new job, the key's job, a conflict, or None if the key vanished meanwhile."""
    key_id = insert_key(alias, scope, key, digest)
    if key_id is not None:
        job = create_job()
        key_rows.adopt(alias, key_id, job.pk)
        return job, True

    existing = _locked_key(alias, scope, key)
    if existing is None:
        return None  # pruned since our insert met it: try again
    live = existing.expires_at > timezone.now()
    if live or _is_active(existing.job):
        if not same_call(existing.fingerprint, digest, task, fields["args"], fields["kwargs"]):
            return _conflict(task, existing, key, scope)
        if existing.job is None:
            # The key is live but its job row was deleted (by hand): a new job carries it,
            # keeping the key's state, so a succeeded action is acked with its stored result.
            job = create_job()
            key_rows.adopt(alias, existing.pk, job.pk, touched=True)
            return job, True
        late = _due_later_than_asked(existing.job, task.run_after)
        if late is not None:
            return _schedule_conflict(key, scope, late)
        key_rows.count_duplicate(alias, key_id=existing.pk)
        logger.debug(
            "idempotency_duplicate where=enqueue scope=%s key=%r job_id=%s", scope, key, existing.job.pk
        )
        return existing.job, False

    # Expired and its job finished (or gone): the key is forgotten and starts afresh.
    job = create_job()
    key_rows.restart(alias, existing.pk, job_id=job.pk, fingerprint=digest, expires_at=_expiry())
    return job, True


# -- execution -----------------------------------------------------------------------------


def begin_execution(
    alias: str, task: Task[Any, Any], job_id: int, key: str, args: Any, kwargs: Any
) -> Decision:
    """Decide whether job ``job_id`` runs its action, and make it the key's owner if so.

    - RUN: the job owns the key (or just took it over: the key was missing, expired, its
      action failed or its job is gone).
    - DUPLICATE: the key's action succeeded (live key, same arguments): ack with ``result``.
    - WAIT: another job that is queued or running owns the key: try again later.
    - CONFLICT: the key succeeded for other arguments or another task.
    """
    scope = scope_of(task)
    # Most jobs own their key since enqueue: a plain read decides, with no write
    # transaction (which on SQLite would wait for every other writer). Ownership cannot
    # change under a RUN, DUPLICATE or WAIT decision: nobody takes over a key whose
    # owner is queued or running, and only the owner's ack marks it succeeded.
    row = store.key_owner(alias, scope, key)
    if row is not None and row[0] == job_id and row[1] != IdempotencyStatus.SUCCEEDED:
        return Decision(RUN)  # the usual case, decided without building a model
    digest = fingerprint(task, args, kwargs)
    existing = _key_row(alias, scope, key)
    if existing is not None:
        decision = _decide(alias, task, existing, job_id, digest, key, scope, (args, kwargs))
        if decision is not None:
            return decision
    for _ in range(MAX_ROUNDS):
        with store.atomic(alias):
            if existing is None:
                # Write first: on SQLite a transaction that reads before it writes may fail
                # to upgrade its lock when another writer got in between.
                if insert_key(alias, scope, key, digest, job_id) is not None:
                    return Decision(RUN)
                events.emit(events.KeyConflict(task.name, "execution"))  # another job inserted it
            existing = _locked_key(alias, scope, key)
            if existing is None:
                continue  # pruned meanwhile
            decision = _decide(alias, task, existing, job_id, digest, key, scope, (args, kwargs))
            if decision is not None:
                return decision
            _take_over(alias, existing, job_id, digest, existing.expires_at > timezone.now())
            return Decision(RUN)
    raise RuntimeError(f"idempotency key {key!r} (scope {scope!r}) kept vanishing before job {job_id} ran")


def _decide(
    alias: str,
    task: Task[Any, Any],
    existing: IdempotencyKey,
    job_id: int,
    digest: str,
    key: str,
    scope: str,
    call: tuple[Any, Any],
) -> Decision | None:
    """The decision for a job given its key's row; None when the job should take the key over."""
    if existing.job_id == job_id and existing.status != IdempotencyStatus.SUCCEEDED:
        return Decision(RUN)
    if existing.status == IdempotencyStatus.SUCCEEDED and existing.expires_at > timezone.now():
        # An approved replay stands for its dead letter's action, perhaps with a corrected
        # payload: if that action succeeded meanwhile, the replay is a duplicate. Any other
        # job with other arguments under a succeeded key is a mistake worth a dead letter.
        if not same_call(existing.fingerprint, digest, task, *call) and not _is_replay(alias, job_id):
            return Decision(CONFLICT, message=str(_conflict(task, existing, key, scope)))
        return Decision(DUPLICATE, result=existing.result)
    if existing.job_id != job_id and _is_active(existing.job):
        return Decision(WAIT)
    return None


def _take_over(alias: str, existing: IdempotencyKey, job_id: int, digest: str, live: bool) -> None:
    """Make ``job_id`` the owner of a key whose action failed, whose job is gone, or that expired."""
    key_rows.take_over(
        alias, existing.pk, job_id=job_id, fingerprint=digest, expires_at=None if live else _expiry()
    )


# -- replays --------------------------------------------------------------------------------

#: What :func:`claim_for_replay` found (recorded in the "replayed" event of the dead letter).
REPLAY_ADOPTED = "adopted"
REPLAY_ALREADY_SUCCEEDED = "already_succeeded"
REPLAY_BUSY = "busy"


def claim_for_replay(
    alias: str, scope: str, key: str, digest: str, origin_job_id: int | None
) -> tuple[IdempotencyKey | None, str]:
    """Lock the key a replay of dead job ``origin_job_id`` runs under; the row and what became of it.

    ``adopted``: the row is the replay's to take (call :func:`hand_to_replay` once the job
    exists). ``already_succeeded``: the action succeeded through another job, so the replay
    is acked as a duplicate without running. ``busy``: another queued or running job owns
    the action now: try again later. A pruned key is recreated (with ``digest``), so the
    action stays deduplicated. Call inside the replay's transaction.
    """
    insert_key(alias, scope, key, digest)
    row = _locked_key(alias, scope, key)
    if row is None:
        return None, REPLAY_BUSY  # pruned between the insert and the read: the next pass retries
    if row.status == IdempotencyStatus.SUCCEEDED:
        return None, REPLAY_ALREADY_SUCCEEDED
    if row.job_id is not None and row.job_id != origin_job_id and _is_active(row.job):
        return None, REPLAY_BUSY
    return row, REPLAY_ADOPTED


def hand_to_replay(alias: str, row: IdempotencyKey, job_id: int, digest: str) -> None:
    """Make the replay job the key's owner, under the fingerprint of the arguments it runs.

    A corrected payload replaces the key's fingerprint: the key's action is now the
    corrected call, so an enqueue with the original arguments is an
    :class:`IdempotencyConflict`, not a duplicate silently answered with the corrected job
    (see the dead-letter runbook).
    """
    key_rows.hand_to_replay(
        alias, row.pk, job_id=job_id, fingerprint=digest, expires_at=max(row.expires_at, _expiry())
    )


def stored_result(alias: str, scope: str, key: str) -> Any:
    """The stored result if the key's action already succeeded, else :data:`MISSING`."""
    memory = store.memory_store(alias)
    if memory is not None:
        found = memory.key_model(alias, scope, key)
        return found.result if found is not None and found.status == IdempotencyStatus.SUCCEEDED else MISSING
    row = (
        IdempotencyKey.objects.using(alias)
        .filter(scope=scope, key=key)
        .values_list("status", "result")
        .first()
    )
    if row is None or row[0] != IdempotencyStatus.SUCCEEDED:
        return MISSING
    return row[1]


def record_success(alias: str, scope: str, key: str, job_id: int, result: Any) -> bool:
    """Mark the key succeeded with ``result`` if ``job_id`` owns it; call inside the ack's transaction."""
    return store.record_key_success(alias, scope, key, job_id, result)


def record_duplicate(alias: str, scope: str, key: str) -> None:
    """Count a job acked with the key's stored result; call inside that ack's transaction."""
    key_rows.count_duplicate(alias, scope=scope, key=key)


def record_failure(alias: str, scope: str | None, key: str, job_id: int) -> None:
    """Mark the key failed (its job was dead-lettered); the job of a replay takes it over.

    The owner job identifies the row, so ``scope`` is not needed: the reaper, which
    dead-letters jobs without loading their task, cannot know a custom scope.
    """
    key_rows.mark_failed(alias, key, job_id)


# -- helpers for code that knows a task only by name (dead letters, the reaper) -------------

#: Recorded in a dead letter's "replayed" event when the dead letter has no idempotency key.
REPLAY_NO_KEY = "none"


def scope_of_name(task_name: str) -> str:
    """The scope of the task registered as ``task_name`` (see :func:`scope_of`); the name if none is."""
    from .registry import registry

    task = registry.find(task_name)
    return scope_of(task) if task is not None else task_name


def replay_fingerprint(task: Task[Any, Any] | None, task_name: str, args: Any, kwargs: Any) -> str:
    """The :func:`fingerprint` of a replay's call, or a digest of its raw payload.

    The raw digest stands in when the task is not registered here or the payload no longer
    binds to its handler (the handler changed since approval: the worker dead-letters the
    replay, saying so), so the key still names one action.
    """
    from .exceptions import InvalidArgumentsError

    if task is not None:
        try:
            return fingerprint(task, args, kwargs)
        except InvalidArgumentsError:
            pass
    canonical = json.dumps(
        {"task": task_name, "args": args, "kwargs": kwargs}, sort_keys=True, separators=(",", ":")
    )
    return _keyed(canonical)
