"""Live locks and who holds them, read from the configured back end's own store.

A worker takes a job's lock with the job's claim as the lock's owner (:func:`job_owner`):
every owner token it writes starts ``job.<job id>.<digest of the claim's lease token>``. The
holder of a lock is therefore read from the lock itself, never guessed from the jobs that
carry its key (a job waiting for the lock carries the same key). The holder is *gone* when
the claim that took the lock cannot release it any more: the job no longer exists, was
settled or claimed again since, its lease ran out, or its worker stopped beating (or never
beat since the claim). A lock whose holder is gone is *stuck*: it blocks every other job of
its key until its TTL runs out, and a Redis lock without a TTL (set by hand) would block
them for ever.

The database back end lists its rows (the admin pages through them); the Redis back end is
read with ``SCAN`` over the lock prefix, a bounded number of keys per page (:func:`redis_page`).
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Sum
from django.utils import timezone

from ..conf import get_settings
from ..exceptions import LockUnavailable
from ..models import Job, JobStatus, Lock, WorkerBeat
from ..store.beats import is_stale
from . import redis as redis_locks
from .base import RESERVED_SUFFIX

__all__ = [
    "PAGE_SIZE",
    "SCAN_CAP",
    "Holder",
    "LiveLock",
    "RedisPage",
    "database_lock",
    "describe",
    "job_owner",
    "live_lock",
    "parse_owner",
    "redis_lock",
    "redis_page",
]

#: Keys one page of the Redis list examines at most (SCAN's COUNT summed over its calls).
SCAN_CAP = 10_000
#: The COUNT hint of each SCAN call.
SCAN_COUNT = 250
#: A page of the Redis list stops once it has found this many locks.
PAGE_SIZE = 100

_OWNER_TAG = "job"


def _claim_digest(lease_token: str) -> str:
    # Names the claim without showing its lease token (which acks the job) on the lock.
    return hashlib.sha256(lease_token.encode()).hexdigest()[:16]


def job_owner(job_id: int, lease_token: str) -> str:
    """The lock owner of job ``job_id``'s claim whose lease token is ``lease_token``."""
    return f"{_OWNER_TAG}.{job_id}.{_claim_digest(lease_token)}"


def parse_owner(token: str | None) -> tuple[int, str] | None:
    """``(job id, claim digest)`` of an owner token a worker wrote; None for any other token."""
    parts = (token or "").split(".")
    if len(parts) != 4 or parts[0] != _OWNER_TAG or not parts[1].isdigit() or len(parts[2]) != 16:
        return None
    return int(parts[1]), parts[2]


@dataclass(frozen=True)
class Holder:
    """The job whose claim holds a lock, and whether that claim can still release it."""

    job_id: int
    #: The worker of the claim; "" when the job was claimed again since (its row names the new one).
    worker_id: str
    #: The job's status now; "" when the job no longer exists.
    status: str
    gone: bool
    #: One sentence for the operator: why the holder is gone, or where it runs.
    why: str


@dataclass(frozen=True)
class LiveLock:
    """One lock as its store holds it now."""

    #: Prefix and key: the database row's key, and the key of the forced-release audit.
    name: str
    #: The resource key (``order:123``); "" when the name lacks the configured prefix.
    key: str
    #: The owner token; "" when free.
    token: str
    held: bool
    #: Seconds left; None when free, or held without a TTL.
    ttl_left: float | None
    fencing_token: int | None
    acquired_at: datetime.datetime | None
    #: The holding claim; None when free or when the token names no job (a lock taken in code).
    holder: Holder | None
    #: Unfinished jobs of the key other than the holder: the jobs it blocks.
    waiting: int
    #: Times those jobs were put back because the lock was taken (their ``lock_contentions``).
    put_backs: int

    @property
    def holder_gone(self) -> bool | None:
        """Held by a claim that can no longer release it; None when free or the holder is unknown."""
        if not self.held or self.holder is None:
            return None
        return self.holder.gone

    @property
    def stuck(self) -> bool:
        """Held, and nobody will release it: its holder is gone, or it has no TTL."""
        return self.held and (bool(self.holder_gone) or self.ttl_left is None)


@dataclass(frozen=True)
class _Raw:
    name: str
    token: str
    held: bool
    ttl_left: float | None
    fencing_token: int | None
    acquired_at: datetime.datetime | None


def _resource(name: str, prefix: str) -> str:
    return name[len(prefix) :] if name.startswith(prefix) else ""


def _holders(tokens: Iterable[str], using: str) -> dict[str, Holder]:
    """The holder of each job owner token, from one query of jobs and one of worker beats."""
    claims = {token: owner for token in tokens if (owner := parse_owner(token)) is not None}
    if not claims:
        return {}
    jobs = {
        row["pk"]: row
        for row in Job.objects.using(using)
        .filter(pk__in={job_id for job_id, _ in claims.values()})
        .values("pk", "status", "lease_token", "lease_expires_at", "worker_id", "started_at")
    }
    workers = {row["worker_id"] for row in jobs.values() if row["worker_id"]}
    beats = dict(
        WorkerBeat.objects.using(using).filter(worker_id__in=workers).values_list("worker_id", "last_beat_at")
    )
    now = timezone.now()
    found = {}
    for token, (job_id, digest) in claims.items():
        job = jobs.get(job_id)
        found[token] = _holder(job_id, digest, job, beats, now)
    return found


def _holder(
    job_id: int,
    digest: str,
    job: Mapping[str, Any] | None,
    beats: dict[str, datetime.datetime],
    now: datetime.datetime,
) -> Holder:
    if job is None:
        return Holder(job_id, "", "", True, f"Job #{job_id} no longer exists.")
    status, worker = job["status"], job["worker_id"]
    if job["lease_token"] is None or _claim_digest(job["lease_token"]) != digest:
        if status == JobStatus.RUNNING:
            why = (
                f"Job #{job_id} was claimed again since (it now runs on {worker}): the claim that "
                "took this lock lost its lease and can neither finish nor release it."
            )
        else:
            why = f"Job #{job_id} is {status} now: the claim that took this lock is over."
        return Holder(job_id, "", status, True, why)
    expires = job["lease_expires_at"]
    if expires is not None and expires < now:
        return Holder(
            job_id,
            worker,
            status,
            True,
            f"Job #{job_id}'s lease ran out {(now - expires).total_seconds():.0f} s ago: "
            f"its worker {worker} stopped renewing it.",
        )
    last_beat = beats.get(worker)
    started = job["started_at"]
    if last_beat is None and started is not None and is_stale(started, now):
        # A live worker writes its row within one beat interval of starting: this one was
        # killed before its first beat, or its row was pruned a day after its last.
        return Holder(
            job_id,
            worker,
            status,
            True,
            f"Its worker {worker} has written no beat in the {(now - started).total_seconds():.0f} s "
            "since it claimed the job: it is gone.",
        )
    if last_beat is not None and is_stale(last_beat, now):
        return Holder(
            job_id,
            worker,
            status,
            True,
            f"Its worker {worker} has not beaten for {(now - last_beat).total_seconds():.0f} s: it is gone.",
        )
    return Holder(job_id, worker, status, False, f"Job #{job_id} runs on worker {worker}.")


def _contention(keys: Sequence[str], holder_ids: set[int], using: str) -> dict[str, tuple[int, int]]:
    """``{key: (waiting jobs, their put-backs)}`` of the unfinished jobs of ``keys``, holders left out."""
    if not keys:
        return {}
    rows = (
        Job.objects.using(using)
        .filter(lock_key__in=set(keys), status__in=[JobStatus.QUEUED, JobStatus.RUNNING])
        .exclude(lock_key="")  # the partial index on lock_key
        .exclude(pk__in=holder_ids)
        .values("lock_key")
        .annotate(waiting=Count("pk"), put_backs=Sum("lock_contentions"))
    )
    return {row["lock_key"]: (row["waiting"], row["put_backs"] or 0) for row in rows}


def _describe(raws: Sequence[_Raw], using: str | None = None) -> list[LiveLock]:
    alias = using or get_settings().database_alias
    prefix = get_settings().locks.prefix
    holders = _holders((raw.token for raw in raws if raw.held), alias)
    keys = [key for raw in raws if (key := _resource(raw.name, prefix))]
    contention = _contention(keys, {holder.job_id for holder in holders.values()}, alias)
    described = []
    for raw in raws:
        key = _resource(raw.name, prefix)
        waiting, put_backs = contention.get(key, (0, 0))
        described.append(
            LiveLock(
                name=raw.name,
                key=key,
                token=raw.token,
                held=raw.held,
                ttl_left=raw.ttl_left,
                fencing_token=raw.fencing_token,
                acquired_at=raw.acquired_at,
                holder=holders.get(raw.token) if raw.held else None,
                waiting=waiting,
                put_backs=put_backs,
            )
        )
    return described


def _raw_row(row: Lock, now: datetime.datetime) -> _Raw:
    held = bool(row.token) and row.expires_at is not None and row.expires_at > now
    return _Raw(
        name=row.key,
        token=row.token or "",
        held=held,
        ttl_left=(row.expires_at - now).total_seconds() if held and row.expires_at else None,
        fencing_token=row.fencing_token,
        acquired_at=row.acquired_at,
    )


def describe(rows: Sequence[Lock], using: str | None = None) -> list[LiveLock]:
    """The database back end's rows (a page of them) with holders and contention: three queries."""
    now = timezone.now()
    return _describe([_raw_row(row, now) for row in rows], using)


def database_lock(name: str, using: str | None = None) -> LiveLock | None:
    """The database back end's lock ``name`` (prefix and key), or None without a row."""
    alias = using or get_settings().database_alias
    row = Lock.objects.using(alias).filter(key=name).first()
    return None if row is None else describe([row], alias)[0]


# -- Redis ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedisPage:
    """A page of the Redis locks, in the order SCAN found them (stuck ones first)."""

    locks: list[LiveLock]
    #: The SCAN cursor of the next page; 0 when the scan is complete.
    next_cursor: int
    #: Keys this page examined (the COUNT hints summed: Redis's own measure is approximate).
    examined: int
    #: Whether the page stopped at :data:`SCAN_CAP` keys before finding a full page.
    capped: bool


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)


def _read_redis(client: Any, names: Sequence[str], prefix: str) -> list[_Raw]:
    pipe = client.pipeline(transaction=False)
    for redis_name in names:
        pipe.get(redis_name)
        pipe.pttl(redis_name)
        pipe.get(f"{redis_name}{RESERVED_SUFFIX}")
    values = pipe.execute()
    raws = []
    for index, redis_name in enumerate(names):
        token, pttl, fencing = values[3 * index : 3 * index + 3]
        if token is None:
            continue  # released or expired since the SCAN
        key = redis_name[len(prefix) + 1 : -1]
        raws.append(
            _Raw(
                name=f"{prefix}{key}",
                token=token.decode(errors="replace"),
                held=True,
                ttl_left=pttl / 1000 if pttl is not None and pttl >= 0 else None,
                fencing_token=int(fencing) if fencing is not None and fencing.isdigit() else None,
                acquired_at=None,
            )
        )
    return raws


def redis_page(
    cursor: int = 0, *, cache_alias: str | None = None, cap: int | None = None, page_size: int = PAGE_SIZE
) -> RedisPage:
    """The held Redis locks from SCAN ``cursor`` on: at most ``cap`` keys examined (:data:`SCAN_CAP`).

    Raises :class:`~django_jobguard.LockUnavailable` when Redis does not answer.
    """
    from redis.exceptions import RedisError

    cap = SCAN_CAP if cap is None else cap
    conf = get_settings().locks
    client = redis_locks.client(cache_alias or conf.cache_alias)
    # Lock keys end with the closing brace of their hash tag; fencing counters do not.
    pattern = f"{_glob_escape(conf.prefix)}{{*}}"
    names: list[str] = []
    examined = 0
    try:
        while True:
            cursor, batch = client.scan(cursor, match=pattern, count=SCAN_COUNT)
            examined += SCAN_COUNT
            names.extend(name.decode(errors="replace") for name in batch)
            if int(cursor) == 0 or examined >= cap or len(names) >= page_size:
                break
        raws = _read_redis(client, names, conf.prefix)
    except RedisError as exc:
        raise LockUnavailable(f"the Redis locks could not be read: Redis did not answer ({exc})") from exc
    locks = sorted(_describe(raws), key=lambda lock: (not lock.stuck, lock.waiting == 0, lock.name))
    cursor = int(cursor)
    capped = cursor != 0 and examined >= cap and len(names) < page_size
    return RedisPage(locks, cursor, examined, capped)


def redis_lock(name: str, *, cache_alias: str | None = None) -> LiveLock | None:
    """The Redis lock ``name`` (prefix and key) if held, else None."""
    from redis.exceptions import RedisError

    conf = get_settings().locks
    key = _resource(name, conf.prefix)
    if not key:
        return None
    client = redis_locks.client(cache_alias or conf.cache_alias)
    try:
        raws = _read_redis(client, [redis_locks.redis_key(conf.prefix, key)], conf.prefix)
    except RedisError as exc:
        raise LockUnavailable(f"lock {name!r}: Redis did not answer ({exc})") from exc
    return _describe(raws)[0] if raws else None


def held_locks(keys: Sequence[str], using: str | None = None) -> dict[str, LiveLock]:
    """The held locks of the resource keys ``keys``, by key, from the configured back end.

    Four queries on the database back end; one Redis round trip and three queries on Redis
    (:class:`.LockUnavailable` when Redis does not answer).
    """
    conf = get_settings().locks
    if not keys:
        return {}
    if conf.backend == "redis":
        from redis.exceptions import RedisError

        client = redis_locks.client(conf.cache_alias)
        try:
            raws = _read_redis(client, [redis_locks.redis_key(conf.prefix, key) for key in keys], conf.prefix)
        except RedisError as exc:
            raise LockUnavailable(f"locks: Redis did not answer ({exc})") from exc
        described = _describe(raws, using)
    else:
        alias = using or get_settings().database_alias
        rows = list(Lock.objects.using(alias).filter(key__in=[conf.prefix + key for key in keys]))
        described = describe(rows, alias)
    return {lock.key: lock for lock in described if lock.held}


def live_lock(name: str) -> LiveLock | None:
    """Lock ``name`` (prefix and key) from the configured back end."""
    if get_settings().locks.backend == "redis":
        return redis_lock(name)
    return database_lock(name)
