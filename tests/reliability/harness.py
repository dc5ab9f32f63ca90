"""The reliability harness: chaos worker pools, the history, the checker, the invariants.

History has three sources, merged by the checker:

- the test process (``History.record``): enqueue ok / enqueue fail, kills, pauses, signals;
- the database: a trigger on ``jobguard_job`` appends every committed status or lease-token
  change to ``testapp_jobtransition`` (claim, complete, retry, reaper return, dead-letter,
  hand-back), so it holds exactly what committed;
- the worker processes: each appends its attempt starts, dead letters and job log records
  (acks, stale acks, stale retries, lease losses...) to its own JSON-lines file.
"""

from __future__ import annotations

import collections
import dataclasses
import http.server
import json
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psycopg
from django.db import connection

from tests.conftest import ROOT, WorkerProcesses
from tests.testapp import tasks_faults

LEASE = tasks_faults.LEASE_SECONDS
QUEUE = tasks_faults.QUEUE
#: Worker timings of the suite: reaper every second, idle poll every half second.
REAPER_INTERVAL = 1.0
POLL_INTERVAL = 0.5
#: The recovery bound the issue sets: lease + reaper + poll + 1 s of slack.
RECOVERY_BOUND = LEASE + REAPER_INTERVAL + POLL_INTERVAL + 1.0
#: Every fault point of ``django_jobguard._faults``, for specs like "all at p".
FAULT_POINTS = (
    "after_claim",
    "mid_task",
    "after_effect",
    "in_complete",
    "after_complete",
    "in_heartbeat",
    "in_retry",
    "in_dead_letter",
)
ARTIFACTS = ROOT / "artifacts" / "reliability"

_TRIGGER_SQL = """
CREATE OR REPLACE FUNCTION testapp_record_job_transition() RETURNS trigger AS $$
BEGIN
  INSERT INTO testapp_jobtransition
    (job_id, old_status, new_status, old_token, new_token, attempts, worker_id, run_after, at)
  VALUES (
    NEW.id,
    CASE WHEN TG_OP = 'INSERT' THEN '' ELSE OLD.status END,
    NEW.status,
    CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.lease_token END,
    NEW.lease_token,
    NEW.attempts,
    NEW.worker_id,
    NEW.run_after,
    clock_timestamp()
  );
  RETURN NULL;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS testapp_job_insert ON jobguard_job;
DROP TRIGGER IF EXISTS testapp_job_update ON jobguard_job;
CREATE TRIGGER testapp_job_insert AFTER INSERT ON jobguard_job
  FOR EACH ROW EXECUTE FUNCTION testapp_record_job_transition();
CREATE TRIGGER testapp_job_update AFTER UPDATE OF status, lease_token ON jobguard_job
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                     OR OLD.lease_token IS DISTINCT FROM NEW.lease_token)
  EXECUTE FUNCTION testapp_record_job_transition();
"""
_DROP_TRIGGER_SQL = """
DROP TRIGGER IF EXISTS testapp_job_insert ON jobguard_job;
DROP TRIGGER IF EXISTS testapp_job_update ON jobguard_job;
DROP FUNCTION IF EXISTS testapp_record_job_transition();
"""


def install_transition_trigger() -> None:
    with connection.cursor() as cursor:
        cursor.execute(_TRIGGER_SQL)


def drop_transition_trigger() -> None:
    with connection.cursor() as cursor:
        cursor.execute(_DROP_TRIGGER_SQL)


def django_backend_pid() -> int:
    """The PostgreSQL backend pid of the test's own Django connection (to spare it from kills)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def observer_connection() -> psycopg.Connection[Any]:
    """A connection of its own (autocommit) for watching the database while workers run."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    return psycopg.connect(**params, autocommit=True)


# -- history -----------------------------------------------------------------------------


class History:
    """The append-only history of one scenario (test-process events plus worker files)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "harness.jsonl"
        self._lock = threading.Lock()

    def record(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "t": time.time(), "source": "harness", **fields}, default=str)
        with self._lock, self.path.open("a") as out:
            out.write(line + "\n")

    def worker_file(self, worker_id: str) -> Path:
        return self.directory / f"worker-{worker_id}.jsonl"

    def events(self) -> list[dict[str, Any]]:
        """Every event of every source, in time order (worker clocks may be skewed on purpose)."""
        out: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            source = path.stem.removeprefix("worker-")
            for line in path.read_text(errors="replace").splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut by a SIGKILL mid-write
                event.setdefault("source", source)
                out.append(event)
        out.sort(key=lambda e: e.get("t", 0))
        return out

    def count(self, event: str, source: str | None = None) -> int:
        return sum(
            1 for e in self.events() if e["event"] == event and (source is None or e["source"] == source)
        )


def enqueue_probes(
    history: History,
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
    *,
    task: Any = None,
    rng: random.Random | None = None,
    fail_ratio: float = 0.0,
    chunk: int = 500,
) -> list[int]:
    """Enqueue in chunks; a ``fail_ratio`` of chunks is rolled back on purpose (enqueue fail).

    Returns the ids that committed. The ids of rolled-back chunks are recorded as
    ``enqueue_fail`` so the checker can prove none of them ever ran.
    """
    from django.db import transaction

    task = task or tasks_faults.probe
    committed: list[int] = []
    chunks = range(0, len(calls), chunk)
    # At least one rolled-back chunk whenever a ratio is asked for, placed at random.
    doomed_chunks = set()
    if rng is not None and fail_ratio > 0:
        doomed_chunks = {i for i in range(len(chunks)) if rng.random() < fail_ratio}
        doomed_chunks = doomed_chunks or {rng.randrange(len(chunks))}
    for index, start in enumerate(chunks):
        part = calls[start : start + chunk]
        doomed = index in doomed_chunks
        if doomed:
            ids: list[int] = []
            try:
                with transaction.atomic():
                    ids = [job.pk for job in task.bulk_enqueue(part)]
                    raise _Rollback
            except _Rollback:
                pass
            history.record("enqueue_fail", job_ids=ids, count=len(ids))
            # What the caller meant to run is enqueued again, as a producer would retry.
        jobs = task.bulk_enqueue(part)
        ids = [job.pk for job in jobs]
        committed += ids
        history.record("enqueue_ok", job_ids=ids, count=len(ids))
    return committed


class _Rollback(Exception):
    """Raised to roll back an enqueue on purpose."""


# -- worker pools --------------------------------------------------------------------------


@dataclasses.dataclass
class Slot:
    index: int
    generation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    worker_id: str = ""
    paused: bool = False


@dataclasses.dataclass
class Death:
    """A worker process that died, and the jobs it held (their lease tokens) when it did."""

    worker_id: str
    at: float
    cause: str  # "harness" (our SIGKILL) or "self" (a fault point or a poison job)
    returncode: int | None
    orphans: list[tuple[int, str]]
    log_tail: str = ""  # the end of the worker's output, when it died by itself

    def describe(self) -> str:
        return f"{self.worker_id} ({self.cause}, exit {self.returncode}): ...{self.log_tail[-600:]}"


class Pool:
    """Worker processes of one scenario, with SIGKILL, SIGSTOP and respawn."""

    def __init__(
        self,
        procs: WorkerProcesses,
        history: History,
        observer: psycopg.Connection[Any],
        *,
        size: int,
        concurrency: int = 2,
        extra_args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        faults: str = "",
        seed: str = "0",
        respawn: bool = True,
        name: str = "w",
    ) -> None:
        self.procs = procs
        self.history = history
        self.observer = observer
        self.concurrency = concurrency
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.faults = faults
        self.seed = seed
        self.respawn = respawn
        self.name = name
        self.slots = [Slot(index=i) for i in range(size)]
        self.deaths: list[Death] = []
        self.started: list[str] = []

    def start(self) -> Pool:
        for slot in self.slots:
            self._spawn(slot)
        return self

    def _spawn(self, slot: Slot, *, faults: str | None = None) -> None:
        slot.worker_id = f"{self.name}{slot.index}g{slot.generation}"
        slot.generation += 1
        slot.paused = False
        env = {
            **self.env,
            "JOBGUARD_TEST_HISTORY": str(self.history.worker_file(slot.worker_id)),
            "JOBGUARD_TEST_FAULTS": self.faults if faults is None else faults,
            "JOBGUARD_TEST_FAULTS_SEED": f"{self.seed}:{slot.worker_id}",
        }
        slot.proc = self.procs.start(
            "--worker-id",
            slot.worker_id,
            "--queue",
            QUEUE,
            "--concurrency",
            str(self.concurrency),
            "--reaper-interval",
            str(REAPER_INTERVAL),
            "--poll-interval",
            str(POLL_INTERVAL),
            *self.extra_args,
            env=env,
        )
        self.started.append(slot.worker_id)
        self.history.record("worker_spawned", worker_id=slot.worker_id, pid=slot.proc.pid)

    def wait_started(self, timeout: float = 60) -> None:
        from tests.conftest import wait_for

        for slot in self.slots:
            assert slot.proc is not None
            proc = slot.proc
            wait_for(
                lambda proc=proc: "worker_started" in self.procs.log(proc),
                timeout,
                message=f"worker {slot.worker_id} to start",
            )

    def live(self) -> list[Slot]:
        return [s for s in self.slots if s.proc is not None and s.proc.poll() is None]

    def held_by(self, worker_id: str) -> list[tuple[int, str]]:
        rows = self.observer.execute(
            "SELECT id, lease_token FROM jobguard_job WHERE status = 'running' AND worker_id = %s",
            [worker_id],
        ).fetchall()
        return [(row[0], row[1]) for row in rows]

    def kill(self, slot: Slot, *, respawn: bool | None = None) -> Death:
        """SIGKILL one worker, note what it held, and (by default) start a replacement."""
        assert slot.proc is not None
        at = time.time()
        slot.proc.send_signal(signal.SIGKILL)
        slot.proc.wait(timeout=30)
        return self._died(slot, at, "harness", respawn)

    def _died(self, slot: Slot, at: float, cause: str, respawn: bool | None) -> Death:
        assert slot.proc is not None
        death = Death(
            worker_id=slot.worker_id,
            at=at,
            cause=cause,
            returncode=slot.proc.returncode,
            orphans=self.held_by(slot.worker_id),
            log_tail=self.procs.log(slot.proc)[-2000:] if cause == "self" else "",
        )
        self.deaths.append(death)
        self.history.record(
            "worker_died",
            worker_id=slot.worker_id,
            cause=cause,
            returncode=slot.proc.returncode,
            orphans=[job_id for job_id, _ in death.orphans],
        )
        if self.respawn if respawn is None else respawn:
            self._spawn(slot)
        else:
            slot.proc = None
        return death

    def reap_exits(self) -> list[Death]:
        """Notice workers that died by themselves (fault points, poison) and replace them."""
        found = []
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is not None:
                found.append(self._died(slot, time.time(), "self", None))
        return found

    def pause(self, slot: Slot) -> float:
        assert slot.proc is not None
        at = time.time()
        slot.proc.send_signal(signal.SIGSTOP)
        slot.paused = True
        self.history.record("worker_paused", worker_id=slot.worker_id)
        return at

    def resume(self, slot: Slot) -> None:
        assert slot.proc is not None
        slot.proc.send_signal(signal.SIGCONT)
        slot.paused = False
        self.history.record("worker_resumed", worker_id=slot.worker_id)

    def stop(self, timeout: float = 60) -> dict[str, int | None]:
        """SIGTERM every live worker and wait; the exit code of each."""
        from tests.conftest import wait_for

        codes: dict[str, int | None] = {}
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                if slot.paused:
                    self.resume(slot)
                # A replacement spawned moments ago may not have its SIGTERM handler yet (it is
                # installed before "worker_started"): the default action would kill it, -15.
                proc = slot.proc
                wait_for(
                    lambda proc=proc: proc.poll() is not None or "worker_started" in self.procs.log(proc),
                    timeout,
                    message=f"worker {slot.worker_id} to start before it is stopped",
                )
                slot.proc.send_signal(signal.SIGTERM)
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                codes[slot.worker_id] = slot.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                codes[slot.worker_id] = None
        return codes

    def logs(self) -> str:
        return "\n".join(self.procs.log(p) for p in self.procs.procs)


# -- the loopback provider stub ------------------------------------------------------------


class ProviderStub:
    """A fake payment provider on loopback that dedupes by ``Idempotency-Key``.

    It counts every request per key, and applies (counts as a charge) the first request
    of each key only; later requests with that key get the stored answer back. Charges
    are also counted per business marker, so a worker that sent a different key on a
    redelivery would show up as a duplicate effect.
    """

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.applied: collections.Counter[str] = collections.Counter()
        self.keyless = 0
        self._answers: dict[str, int] = {}
        self._lock = threading.Lock()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                key = self.headers.get("Idempotency-Key", "")
                answer = stub.charge(key, body.get("marker", ""))
                payload = json.dumps({"charge": answer}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/charges"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def charge(self, key: str, marker: str) -> int:
        with self._lock:
            if not key:
                self.keyless += 1
                self.applied[marker] += 1
                return self.applied[marker]
            self.requests[key] += 1
            if key not in self._answers:
                self.applied[marker] += 1
                self._answers[key] = len(self._answers) + 1
            return self._answers[key]

    def __enter__(self) -> ProviderStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def figures(self) -> dict[str, int]:
        return {
            "requests": sum(self.requests.values()),
            "keys": len(self.requests),
            "requests_beyond_one_per_key": sum(n - 1 for n in self.requests.values()),
            "keyless_requests": self.keyless,
            "effects_applied": sum(self.applied.values()),
            "duplicate_effects": sum(n - 1 for n in self.applied.values() if n > 1),
        }


# -- waiting -------------------------------------------------------------------------------


def open_jobs(observer: psycopg.Connection[Any], ids: list[int] | None = None) -> int:
    if ids is None:
        sql = "SELECT count(*) FROM jobguard_job WHERE status IN ('queued', 'running')"
        row = observer.execute(sql).fetchone()
    else:
        sql = "SELECT count(*) FROM jobguard_job WHERE status IN ('queued', 'running') AND id = ANY(%s)"
        row = observer.execute(sql, [ids]).fetchone()
    assert row is not None
    return int(row[0])


def run_until(
    done: Callable[[], bool],
    timeout: float,
    *,
    tick: Callable[[], None] | None = None,
    interval: float = 0.05,
) -> bool:
    """Call ``tick`` every ``interval`` until ``done()`` or ``timeout``; whether it got done."""
    deadline = time.monotonic() + timeout
    next_check = 0.0
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        now = time.monotonic()
        if now >= next_check:
            if done():
                return True
            next_check = now + 0.25
        time.sleep(interval)
    return done()


# -- the checker -----------------------------------------------------------------------------

TERMINAL = ("succeeded", "dead", "cancelled")


def check(history: History, *, deaths: Iterable[Death] = ()) -> dict[str, Any]:
    """Lost, unexpected, duplicated executions, duplicate effects, recovered, and friends.

    Reads the database (the jobs, the committed transitions, executions, ledger, dead
    letters) and the history, and returns the figures. It asserts nothing itself.
    """
    from django_jobguard.models import DeadLetter, Job
    from tests.testapp.models import Execution, JobTransition, LedgerEntry

    events = history.events()
    enqueued: set[int] = set()
    failed_enqueues: set[int] = set()
    for e in events:
        if e["event"] == "enqueue_ok":
            enqueued.update(e["job_ids"])
        elif e["event"] == "enqueue_fail":
            failed_enqueues.update(e["job_ids"])

    jobs = {
        row["id"]: row
        for row in Job.objects.values(
            "id", "task_name", "status", "attempts", "max_attempts", "reappearances", "kwargs"
        )
    }
    transitions = collections.defaultdict(list)
    for t in JobTransition.objects.order_by("at", "id").values():
        transitions[t["job_id"]].append(t)

    lost = sorted(j for j in enqueued if j not in jobs or jobs[j]["status"] not in TERMINAL)
    unexpected = sorted(
        {j for j in jobs if j not in enqueued}
        | (failed_enqueues & set(jobs))
        | {
            e["job_id"]
            for e in events
            if e["event"] in ("job_succeeded", "dead_letter", "start") and e.get("job_id") not in enqueued
        }
    )

    probe_markers = {
        j["kwargs"]["marker"] for j in jobs.values() if j["task_name"] == tasks_faults.probe.name
    }
    # Raw executions that committed, per business marker, of the atomic probe.
    executions = collections.Counter(
        Execution.objects.filter(marker__in=probe_markers).values_list("marker", flat=True)
    )
    duplicated_executions = sum(n - 1 for n in executions.values() if n > 1)
    ledger = collections.Counter(LedgerEntry.objects.values_list("effect_key", flat=True))
    duplicate_effects = sum(n - 1 for n in ledger.values() if n > 1)
    constraint_hits = sum(
        1
        for e in events
        if e["event"] in ("job_retry", "job_dead_lettered") and "IntegrityError" in e.get("message", "")
    )
    succeeded_probes = {
        j["kwargs"]["marker"]: j["id"]
        for j in jobs.values()
        if j["task_name"] == tasks_faults.probe.name and j["status"] == "succeeded"
    }
    missing_effects = sorted(m for m in succeeded_probes if ledger.get(m, 0) != 1)
    orphan_effects = sorted(m for m in ledger if m in probe_markers and m not in succeeded_probes)

    starts = collections.Counter(e["job_id"] for e in events if e["event"] == "start")
    stale = collections.Counter(
        e["event"]
        for e in events
        if e["event"] in ("ack_rejected", "retry_rejected", "dead_letter_rejected", "lease_lost")
    )
    claims = {
        job_id: sum(1 for t in ts if t["new_status"] == "running") for job_id, ts in transitions.items()
    }
    statuses = collections.Counter(j["status"] for j in jobs.values())
    dead_reasons = collections.Counter(DeadLetter.objects.values_list("reason", flat=True))

    recovery = recovery_times(deaths, transitions)
    for slow in recovery["slowest"]:
        slow["ready_workers_after_lease"] = ready_workers(events, slow["at"] - slow["seconds"] + LEASE)
    return {
        "enqueued": len(enqueued),
        "enqueue_failed": len(failed_enqueues),
        "statuses": dict(statuses),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "unexpected": len(unexpected),
        "unexpected_ids": unexpected[:20],
        "duplicated_executions": duplicated_executions,
        "duplicate_effects": duplicate_effects + constraint_hits,
        "duplicate_effects_caught_by_unique_key": constraint_hits,
        "missing_effects": len(missing_effects),
        "orphan_effects": len(orphan_effects),
        "recovered": sum(
            1
            for j in jobs.values()
            if j["status"] == "succeeded" and (j["attempts"] > 1 or j["reappearances"])
        ),
        "attempts_started": sum(starts.values()),
        "jobs_started_more_than_once": sum(1 for n in starts.values() if n > 1),
        "claims": sum(claims.values()),
        "reappearances": sum(j["reappearances"] for j in jobs.values()),
        "stale_rejected": dict(stale),
        "dead_letter_reasons": dict(dead_reasons),
        "dead_letter_samples": [
            {
                "job_id": d["job_id"],
                "task": d["task_name"].rsplit(".", 1)[-1],
                "reason": d["reason"],
                "attempts": d["attempts"],
                "error": f"{d['error_class']}: {d['error_message']}"[:300],
            }
            for d in DeadLetter.objects.order_by("id").values(
                "job_id", "task_name", "reason", "attempts", "error_class", "error_message"
            )[:5]
        ],
        "worker_deaths": {
            "harness": sum(1 for d in deaths if d.cause == "harness"),
            "self": sum(1 for d in deaths if d.cause == "self"),
        },
        "recovery": recovery,
    }


def ready_workers(events: list[dict[str, Any]], at: float) -> int:
    """Workers that had logged ``worker_started`` and had not died by ``at`` (a live reaper)."""
    started = {e["source"]: e["t"] for e in events if e["event"] == "worker_started"}
    died = {e["worker_id"]: e["t"] for e in events if e["event"] == "worker_died"}
    return sum(1 for worker, t in started.items() if t <= at and died.get(worker, float("inf")) > at)


def recovery_times(deaths: Iterable[Death], transitions: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Seconds from a worker's death to the first committed change that took each of its
    leased jobs away from it (the reaper's return, a dead-letter, or its own in-flight ack)."""
    times: list[float] = []
    unrecovered: list[int] = []
    slowest: list[dict[str, Any]] = []
    for death in deaths:
        for job_id, token in death.orphans:
            taken = next((t for t in transitions.get(job_id, []) if t["old_token"] == token), None)
            if taken is None:
                unrecovered.append(job_id)
                continue
            seconds = max(0.0, taken["at"].timestamp() - death.at)
            times.append(seconds)
            slowest.append(
                {
                    "job_id": job_id,
                    "seconds": round(seconds, 3),
                    "worker_id": death.worker_id,
                    "cause": death.cause,
                    "returned_by": taken["worker_id"] or taken["new_status"],
                    "at": taken["at"].timestamp(),
                }
            )
    times.sort()
    slowest.sort(key=lambda s: -s["seconds"])
    return {
        "orphaned_jobs": len(times) + len(unrecovered),
        "unrecovered": len(unrecovered),
        "max_seconds": round(times[-1], 3) if times else None,
        "p50_seconds": round(times[len(times) // 2], 3) if times else None,
        "bound_seconds": RECOVERY_BOUND,
        "slowest": slowest[:5],
    }


# -- invariants ----------------------------------------------------------------------------

INVARIANTS = {
    "running jobs without a lease": (
        "SELECT id FROM jobguard_job WHERE status = 'running' "
        "AND (lease_token IS NULL OR lease_expires_at IS NULL)"
    ),
    "attempts > max attempts": "SELECT id FROM jobguard_job WHERE attempts > max_attempts",
    "dead letters without a reason": (
        "SELECT j.id FROM jobguard_job j LEFT JOIN jobguard_deadletter d ON d.job_id = j.id "
        "WHERE j.status = 'dead' AND (d.id IS NULL OR d.reason = '' OR d.reason <> ALL(%s))"
    ),
    "succeeded jobs with other than one accepted completion": (
        "SELECT j.id FROM jobguard_job j LEFT JOIN testapp_jobtransition t "
        "ON t.job_id = j.id AND t.new_status = 'succeeded' "
        "WHERE j.status = 'succeeded' GROUP BY j.id HAVING count(t.id) <> 1"
    ),
}


#: The package's own audit (``jobguard_audit``) at quiescence: no grace for expired leases.
AUDIT_CHECKS = ("expired_leases", "dead_without_dead_letter", "keys_disagreeing_with_their_job")


def invariant_violations() -> dict[str, list[int]]:
    """Run every invariant query and the audit's checks; each must return no rows."""
    from django_jobguard.models import DeadLetterReason
    from django_jobguard.monitoring.audit import audit

    out: dict[str, list[int]] = {}
    postgres = connection.vendor == "postgresql"
    reasons = list(DeadLetterReason.values)
    with connection.cursor() as cursor:
        for name, sql in INVARIANTS.items():
            if not postgres:
                if "testapp_jobtransition" in sql:
                    continue  # the transition history is recorded on PostgreSQL only
                sql = sql.replace("statement_timestamp()", "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')")
                sql = sql.replace("<> ALL(%s)", f"NOT IN ({', '.join(['%s'] * len(reasons))})")
            params = (reasons if not postgres else [reasons]) if "%s" in sql else []
            cursor.execute(sql, params)
            out[name] = sorted(row[0] for row in cursor.fetchall())
    for finding in audit(grace=0, sample_size=1_000_000):
        if finding.check in AUDIT_CHECKS:
            out[f"audit: {finding.description}"] = finding.sample
    return out


def write_artifact(scenario_id: str, data: dict[str, Any]) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{scenario_id}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return path


def env_seed(seed: int, scenario_id: str) -> random.Random:
    return random.Random(f"{seed}:{scenario_id}")


def pids_alive(pool: Pool) -> bool:
    return all(s.proc is not None and s.proc.poll() is None for s in pool.slots)


__all__ = [
    "ARTIFACTS",
    "FAULT_POINTS",
    "LEASE",
    "QUEUE",
    "RECOVERY_BOUND",
    "Death",
    "History",
    "Pool",
    "ProviderStub",
    "check",
    "enqueue_probes",
    "invariant_violations",
    "throughput",
]


def throughput() -> dict[str, Any]:
    """Jobs per second between the first claim and the last ack (database clock)."""
    from django.db.models import Max, Min

    from tests.testapp.models import JobTransition

    first = JobTransition.objects.filter(new_status="running").aggregate(at=Min("at"))["at"]
    last = JobTransition.objects.filter(new_status="succeeded").aggregate(at=Max("at"))["at"]
    done = JobTransition.objects.filter(new_status="succeeded").count()
    if first is None or last is None or last <= first:
        return {"jobs_per_second": None, "drain_seconds": None}
    seconds = (last - first).total_seconds()
    return {"jobs_per_second": round(done / seconds, 1), "drain_seconds": round(seconds, 2)}
