"""The workloads: throughput, bulk enqueue, latency, backlog, and the pgbench ceiling.

Each function runs one measured run and returns its figures; the orchestrator repeats
it and takes medians.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from benchmarks._common import WARMUP_INDEX, rss_kib
from benchmarks._systems import (
    CONCURRENCY,
    STARTUP_TIMEOUT_SECONDS,
    WORKER_PROCESSES,
    BackendCpu,
    BenchError,
    Jobguard,
    Servers,
    ServerWork,
    System,
    Workers,
    enqueue,
    log,
    run_checked,
    verify,
    wait_until,
)

if TYPE_CHECKING:
    from benchmarks._wire_count import WireCounter

#: Warm-up jobs run through the idle workers of the latency workload before measuring.
LATENCY_WARMUP_JOBS = 5


#: Configurations of the safety-costs workload: (label, variant, metrics on, lock back end).
SAFETY_CONFIGS = [
    ("baseline (all off)", "plain", False, "database"),
    ("+ atomic ack", "atomic", False, "database"),
    ("+ idempotency key", "idempotency", False, "database"),
    ("+ Redis lock", "lock", False, "redis"),
    ("+ database lock", "lock", False, "database"),
    ("+ metrics", "plain", True, "database"),
    ("all on (atomic, key, Redis lock, metrics)", "all", True, "redis"),
]


@dataclasses.dataclass
class Sizes:
    throughput: list[int]
    bulk: int
    latency_jobs: int
    latency_rate: float
    backlog_rows: int
    backlog_jobs: int
    safety_jobs: int
    warmup_jobs: int
    pgbench_seconds: int
    enqueue_jobs: int = 5_000
    deep_depths: tuple[int, int] = (5_000, 1_000_000)  # queued jobs: the shallow and the deep due set
    deep_jobs: int = 5_000  # drained from it per run
    deep_queues: tuple[int, int] = (100, 5)  # queues the jobs are spread over, and those served
    memory_jobs: int = 1_000_000
    memory_mark: int = 10_000
    concurrencies: tuple[int, ...] = (1, 2, 4, 8)  # --concurrency values the defaults row is held against


FULL = Sizes([5_000, 20_000], 5_000, 200, 20.0, 1_000_000, 5_000, 5_000, 1_000, 10)


QUICK = Sizes(
    [1_000],
    1_000,
    40,
    20.0,
    50_000,
    1_000,
    1_000,
    200,
    3,
    enqueue_jobs=1_000,
    deep_depths=(1_000, 50_000),
    deep_jobs=1_000,
    memory_jobs=10_000,
    memory_mark=2_000,
    concurrencies=(1, 2, 4),
)


WORKLOADS = [
    "throughput",
    "bulk",
    "enqueue",
    "latency",
    "backlog",
    "deep",
    "memory",
    "defaults",
    "safety",
    "ceiling",
]


def throughput_run(
    system: System,
    workdir: Path,
    n: int,
    *,
    profile: bool = False,
    workers: Workers | None = None,
    counter: WireCounter | None = None,
) -> dict[str, float]:
    """Enqueue ``n`` jobs one by one, then drain them with the workers; verify every job.

    With ``counter`` (a proxy in front of PostgreSQL), the workers connect through it and the
    result has what they sent per job: ``round_trips`` and ``statements``.
    """
    system.reset()
    enq = enqueue(system, workdir, n)
    worker_env: dict[str, str] = {}
    if counter is not None:
        url = urlsplit(system.env()["BENCH_DATABASE_URL"])
        netloc = f"{url.username}@127.0.0.1:{counter.port}" if url.username else f"127.0.0.1:{counter.port}"
        worker_env["BENCH_DATABASE_URL"] = url._replace(netloc=netloc).geturl()
        counter.reset()
    workers = workers or Workers(system, workdir, burst=True, profile=profile, env=worker_env)
    redis_before = system.servers.redis_cpu()
    backends = BackendCpu(system.dbname) if system.dbname else None
    with backends or contextlib.nullcontext():
        workers.start()
        try:
            if system.burst:
                workers.wait_exit(timeout=STARTUP_TIMEOUT_SECONDS + n / 20)
            else:
                wait_until(lambda: system.done() >= n, STARTUP_TIMEOUT_SECONDS + n / 20, f"{n} jobs")
                workers.stop()
        except BaseException:
            workers.kill()
            raise
    redis_cpu = system.servers.redis_cpu() - redis_before
    sent = (counter.round_trips, counter.statements) if counter is not None else None
    records = verify(system, n)
    first = min(r.started_at for r in records if r.started_at is not None)
    last = max(r.finished_at for r in records if r.finished_at is not None)
    cpu = workers.cpu_seconds()
    result = {
        "enqueue_rate": float(enq["rate"]),
        "enqueue_cpu_ms_per_job": float(enq["client_cpu_seconds"]) * 1000 / n,
        "processing_rate": n / (last - first),
        "drain_seconds": last - first,
        "worker_cpu_ms_per_job": cpu * 1000 / n,
    }
    if backends:
        result["postgres_cpu_ms_per_job"] = backends.seconds * 1000 / n
    result["redis_cpu_ms_per_job"] = redis_cpu * 1000 / n
    # What one job costs the machine while draining: the worker and the servers it talks to.
    result["total_cpu_ms_per_job"] = (
        result["worker_cpu_ms_per_job"]
        + result.get("postgres_cpu_ms_per_job", 0.0)
        + result["redis_cpu_ms_per_job"]
    )
    if sent is not None:
        result["round_trips_per_job"] = sent[0] / n
        result["statements_per_job"] = sent[1] / n
    rss = [kib for kib in workers.rss_kib() if kib]
    if rss:
        result["worker_rss_mib"] = sum(rss) / len(rss) / 1024
    if profile:
        result["profiles"] = [str(p) for p in workers.profiles]  # type: ignore[assignment]
    return result


def bulk_run(system: System, workdir: Path, n: int) -> dict[str, float]:
    system.reset()
    enq = enqueue(system, workdir, n, mode="bulk")
    done = len(system.records())
    if done != n:
        raise BenchError(f"{system.label}: bulk enqueue stored {done} of {n} jobs")
    return {"bulk_enqueue_rate": float(enq["rate"])}


def latency_run(system: System, workdir: Path, n: int, rate: float) -> dict[str, float]:
    """Idle workers; ``n`` jobs enqueued one at a time at ``rate`` per second; enqueue-to-start."""
    system.reset()
    workers = Workers(system, workdir, burst=False)
    workers.start()
    try:
        enqueue(system, workdir, LATENCY_WARMUP_JOBS, start=WARMUP_INDEX)
        wait_until(
            lambda: system.done() >= LATENCY_WARMUP_JOBS, STARTUP_TIMEOUT_SECONDS, "the workers to start"
        )
        time.sleep(1.5)  # idle: every worker is back asleep on its listener or poll timer
        enqueue(system, workdir, n, rate=rate)
        wait_until(lambda: system.done() >= n + LATENCY_WARMUP_JOBS, 60 + n / rate, f"{n} jobs")
        workers.stop()
    except BaseException:
        workers.kill()
        raise
    records = verify(system, n)
    latencies = sorted(
        (r.started_at - r.enqueued_at) * 1000
        for r in records
        if r.started_at is not None and r.enqueued_at is not None
    )
    return {
        "latency_p50_ms": percentile(latencies, 50),
        "latency_p95_ms": percentile(latencies, 95),
        "latency_p99_ms": percentile(latencies, 99),
    }


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (the usual 'inclusive' definition)."""
    if not values:
        return float("nan")
    position = (len(values) - 1) * pct / 100
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def fill_backlog(servers: Servers, system: Jobguard, rows: int) -> None:
    """``rows`` succeeded jobs in one INSERT ... SELECT generate_series, then VACUUM ANALYZE."""
    have = servers.query(system.dbname, "SELECT count(*), coalesce(max(id), 0) FROM jobguard_job")[0]
    if int(have[0]) == rows and int(have[1]) == rows:
        system.watermark = rows
        return
    log(f"filling the backlog table with {rows:,} finished jobs")
    servers.execute(system.dbname, "TRUNCATE jobguard_job RESTART IDENTITY CASCADE")
    servers.execute(
        system.dbname,
        "INSERT INTO jobguard_job (task_name, queue_name, args, kwargs, priority, status, run_after, "
        "attempts, max_attempts, visibility_timeout, worker_id, enqueued_at, started_at, finished_at, "
        "last_error, reappearances, lock_contentions, lock_key, handler_version, result, checkpoints) "
        "SELECT 'bench.noop_atomic', 'default', jsonb_build_array(-g), '{}', 0, 'succeeded', "
        "now() - g * interval '1 second', 1, 5, 60, 'backlog', now() - g * interval '1 second', "
        "now() - g * interval '1 second', now() - g * interval '1 second', '', 0, 0, '', '', 'null', '{}' "
        f"FROM generate_series(1, {int(rows)}) AS g",
    )
    servers.vacuum(system.dbname, ["jobguard_job"])
    # Filling writes hundreds of MB of WAL: checkpoint now, not during the next measurement.
    servers.execute(system.dbname, "CHECKPOINT")
    system.watermark = rows


def captured_insert(system: Jobguard, workdir: Path) -> str:
    """The single-job INSERT that ``enqueue()`` sends, captured from a real enqueue (not rewritten)."""
    out = workdir / "capture.json"
    system.reset()
    run_checked(
        system.command("capture", "--variant", system.variant, "--out", str(out)),
        system.env(),
        cwd=system.cwd,
    )
    statements = [
        sql for sql in json.loads(out.read_text())["statements"] if sql.lstrip().upper().startswith("INSERT")
    ]
    if len(statements) != 1:
        raise BenchError(f"expected one INSERT from one enqueue, captured: {statements}")
    return statements[0]


def pgbench_tps(url: str, sql: str, seconds: int, clients: int = 1) -> tuple[float, int]:
    """Transactions per second of ``pgbench -n -c clients`` running ``sql`` (one statement each)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(sql.strip().rstrip(";") + ";\n")
    try:
        command = ["pgbench", "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds)]
        proc = subprocess.run([*command, "-f", script.name, url], capture_output=True, text=True, check=False)
    finally:
        os.unlink(script.name)
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", proc.stdout)
    done = re.search(r"number of transactions actually processed: ([0-9]+)", proc.stdout)
    if proc.returncode != 0 or not match or not done:
        raise BenchError(f"pgbench failed:\n{proc.stdout}\n{proc.stderr}")
    return float(match.group(1)), int(done.group(1))


def enqueue_bound_run(
    system: Jobguard, workdir: Path, n: int, bulk_n: int, seconds: int, save: Path | None = None
) -> dict[str, float]:
    """One-at-a-time ``enqueue`` against ``pgbench -c1`` sending the exact INSERT it sends; and bulk.

    The statement is captured from a real enqueue of this run's task; pgbench runs it against the
    same table (its trigger, indexes and NOTIFY included), then the same client process enqueues
    ``n`` jobs one by one and ``bulk_n`` in calls of 1,000.
    """
    sql = captured_insert(system, workdir)
    if save:
        save.write_text(sql + ";\n")
    system.reset()
    tps, done = pgbench_tps(system.servers.url(system.dbname), sql, seconds)
    stored = int(system.servers.query(system.dbname, "SELECT count(*) FROM jobguard_job")[0][0])
    if stored != done:
        raise BenchError(f"pgbench reported {done} transactions but the table holds {stored} rows")
    system.reset()
    single = enqueue(system, workdir, n)
    system.reset()
    bulk = enqueue(system, workdir, bulk_n, mode="bulk")
    return {
        "pgbench_insert_tps": tps,
        "enqueue_rate": float(single["rate"]),
        "enqueue_vs_pgbench": float(single["rate"]) / tps,
        "bulk_enqueue_rate": float(bulk["rate"]),
        "bulk_vs_single": float(bulk["rate"]) / float(single["rate"]),
    }


_QUEUED_COLUMNS = (
    "task_name, queue_name, args, kwargs, priority, status, run_after, attempts, max_attempts, "
    "visibility_timeout, worker_id, enqueued_at, last_error, reappearances, lock_contentions, lock_key, "
    "handler_version, result, checkpoints"
)


_QUEUED_VALUES = (
    "'bench.noop_atomic', {queue}, jsonb_build_array({index}), '{{}}', 0, 'queued', "
    "now() - interval '1 day', 0, 5, 60, '', now() - interval '1 day', '', 0, 0, '', '', NULL, '{{}}'"
)


def fill_queued(servers: Servers, system: Jobguard, depth: int, queues: int) -> None:
    """Exactly ``depth`` due jobs queued (over ``queues`` queues, round robin), vacuumed.

    After a run, the jobs it took are replaced by as many new ones at the tail of the due set,
    in the same queues, so every run starts from the same depth without refilling the table.
    """
    dbname = system.dbname
    total, spread, top = servers.query(
        dbname,
        "SELECT count(*), count(DISTINCT queue_name), coalesce(max((args->>0)::bigint), -1) "
        "FROM jobguard_job",
    )[0]
    if (int(total), int(spread)) == (depth, queues):
        values = _QUEUED_VALUES.format(queue="d.queue_name", index=f"{int(top)} + row_number() OVER ()")
        servers.execute(
            dbname,
            f"INSERT INTO jobguard_job ({_QUEUED_COLUMNS}) SELECT {values} FROM jobguard_job d "
            "WHERE d.status <> 'queued'",
            "DELETE FROM jobguard_job WHERE status <> 'queued'",
        )
    else:
        log(f"filling {dbname} with {depth:,} queued jobs over {queues} queue(s)")
        queue = "'default'" if queues == 1 else f"'q' || (g % {int(queues)})"
        values = _QUEUED_VALUES.format(queue=queue, index="g")
        servers.execute(
            dbname,
            "TRUNCATE jobguard_job RESTART IDENTITY CASCADE",
            f"INSERT INTO jobguard_job ({_QUEUED_COLUMNS}) SELECT {values} "
            f"FROM generate_series(0, {int(depth) - 1}) AS g",
        )
    tables = [
        r[0]
        for r in servers.query(dbname, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'jobguard%%'")
    ]
    servers.execute(dbname, f"TRUNCATE {', '.join(t for t in tables if t != 'jobguard_job')}")
    servers.vacuum(dbname, tables)
    servers.execute(dbname, "CHECKPOINT")
    servers.redis(servers.locks_db).flushdb()


def explain_claim(servers: Servers, dbname: str, captured: Path) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a claim the worker sent, in a transaction rolled back."""
    data = json.loads(captured.read_text())
    conn = servers.psycopg.connect(servers.url(dbname))
    try:
        with conn.cursor() as cursor:
            for sql in data["settings"]:
                cursor.execute(sql)
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, VERBOSE OFF) " + data["claim"])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        conn.rollback()
    finally:
        conn.close()
    return "\n".join([*data["settings"], data["claim"], "", plan])


def deep_run(
    system: Jobguard, workdir: Path, n: int, depth: int, queues: int, served: int, explain: Path | None = None
) -> dict[str, float]:
    """Drain ``n`` jobs (``--max-jobs``) from ``depth`` due jobs; the workers serve ``served`` queues.

    The due set stays ``depth`` deep: before each run the last run's jobs are deleted and as many
    appended at its tail. With ``explain``, a worker's first claim statement is captured and its
    plan at this depth (rows still queued) written there.
    """
    fill_queued(system.servers, system, depth, queues)
    system.max_jobs = n // WORKER_PROCESSES
    system.queues = ",".join(f"q{i}" for i in range(served)) if queues > 1 else ""
    capture = workdir / "claim.json"
    capture.unlink(missing_ok=True)
    workers = Workers(system, workdir, burst=True)
    backends = BackendCpu(system.dbname)
    work = ServerWork(system.servers, system.dbname)
    old = os.environ.pop("BENCH_CAPTURE_SQL", None)
    if explain:
        os.environ["BENCH_CAPTURE_SQL"] = str(capture)
    try:
        with backends, work:
            workers.start()
            try:
                workers.wait_exit(timeout=STARTUP_TIMEOUT_SECONDS + n / 20)
            except BaseException:
                workers.kill()
                raise
    finally:
        os.environ.pop("BENCH_CAPTURE_SQL", None)
        if old is not None:
            os.environ["BENCH_CAPTURE_SQL"] = old
        system.max_jobs, system.queues = 0, ""
    rows = system.servers.query(
        system.dbname,
        "SELECT count(*), "
        "count(*) FILTER (WHERE status = 'succeeded' AND attempts = 1 AND reappearances = 0), "
        "extract(epoch FROM max(finished_at) - min(started_at)) FROM jobguard_job WHERE status <> 'queued'",
    )[0]
    total = WORKER_PROCESSES * (n // WORKER_PROCESSES)
    if int(rows[0]) != total or int(rows[1]) != total:
        raise BenchError(
            f"deep backlog: {rows[0]} jobs left the queue, {rows[1]} succeeded once; expected {total}"
        )
    result = {
        "processing_rate": total / float(rows[2]),
        "worker_cpu_ms_per_job": workers.cpu_seconds() * 1000 / total,
        "postgres_cpu_ms_per_job": backends.seconds * 1000 / total,
        **work.per_job(total),
        **work.wait_shares(),
    }
    if explain and capture.exists():
        # Planned against the rows still queued: depth - n, the depth the run ended at.
        explain.write_text(explain_claim(system.servers, system.dbname, capture) + "\n")
    return result


#: How often the memory workload vacuums the job table while a million jobs drain.
MEMORY_VACUUM_SECONDS = 30.0


def memory_run(system: Jobguard, workdir: Path, n: int, mark: int, interval: float = 2.0) -> dict[str, float]:
    """Worker RSS per process after ``mark`` jobs and after all ``n`` (bulk-enqueued), in one run.

    A thread samples the worker processes' VmRSS and the jobs done every ``interval`` seconds;
    the figure after ``mark`` is the first sample at or past it, the one after ``n`` each
    worker's own reading as it exits. The job table is vacuumed every ``MEMORY_VACUUM_SECONDS``
    as autovacuum would (it may be off on the benchmark's server): without it the claim walks
    the index entries of every job done so far, and a million jobs take hours.
    """
    system.reset()
    for first in range(0, n, 100_000):
        enqueue(system, workdir, min(100_000, n - first), start=first, mode="bulk")
    workers = Workers(system, workdir, burst=True)
    at_mark: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        vacuumed = time.monotonic()
        while not stop.wait(interval):
            if not at_mark and system.done() >= mark:
                at_mark.extend(rss_kib(proc.pid) for proc in workers.procs)
            if time.monotonic() - vacuumed >= MEMORY_VACUUM_SECONDS:
                system.servers.execute(system.dbname, "VACUUM jobguard_job")
                vacuumed = time.monotonic()

    sampler = threading.Thread(target=sample, daemon=True)
    workers.start()
    sampler.start()
    try:
        workers.wait_exit(timeout=STARTUP_TIMEOUT_SECONDS + n / 20)
    except BaseException:
        workers.kill()
        raise
    finally:
        stop.set()
        sampler.join()
    done = system.done()
    if done != n:
        raise BenchError(f"memory: {done} of {n} jobs succeeded")
    end = [kib for kib in workers.rss_kib() if kib]
    result = {"rss_end_mib": sum(end) / len(end) / 1024 if end else 0.0}
    if at_mark and all(at_mark):
        result["rss_mark_mib"] = sum(at_mark) / len(at_mark) / 1024
        result["rss_end_vs_mark"] = result["rss_end_mib"] / result["rss_mark_mib"]
    return result


def pgbench_run(servers: Servers, seconds: int) -> dict[str, float]:
    """PostgreSQL's single-row UPDATE commit rate: the ceiling for one commit per job.

    With as many clients as the workers have executor threads (the processing ceiling),
    and with one client (the ceiling for enqueueing one job per transaction from one
    process). Each transaction is one autocommitted ``UPDATE`` of a random row.
    """
    dbname = servers.db("_pgbench")
    if servers.ensure_database(dbname) or not servers.table_exists(dbname, "bench_row"):
        servers.execute(
            dbname,
            "CREATE TABLE IF NOT EXISTS bench_row (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)",
            "INSERT INTO bench_row (id) SELECT g FROM generate_series(1, 10000) g ON CONFLICT DO NOTHING",
        )
    servers.vacuum(dbname, ["bench_row"])
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("\\set id random(1, 10000)\nUPDATE bench_row SET v = v + 1 WHERE id = :id;\n")
    result = {}
    try:
        for clients, metric in ((WORKER_PROCESSES * CONCURRENCY, "commit_rate"), (1, "commit_rate_1_client")):
            command = ["pgbench", "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds)]
            proc = subprocess.run(
                [*command, "-f", script.name, servers.url(dbname)],
                capture_output=True,
                text=True,
                check=False,
            )
            match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", proc.stdout)
            if proc.returncode != 0 or not match:
                raise BenchError(f"pgbench failed:\n{proc.stdout}\n{proc.stderr}")
            result[metric] = float(match.group(1))
    finally:
        os.unlink(script.name)
    return result
