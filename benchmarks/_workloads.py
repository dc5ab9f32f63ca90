"""The workloads: throughput, bulk enqueue, latency, backlog, and the pgbench ceiling.

Each function runs one measured run and returns its figures; the orchestrator repeats
it and takes medians.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks._common import WARMUP_INDEX
from benchmarks._systems import (
    CONCURRENCY,
    STARTUP_TIMEOUT_SECONDS,
    WORKER_PROCESSES,
    BackendCpu,
    BenchError,
    Jobguard,
    Servers,
    System,
    Workers,
    enqueue,
    log,
    verify,
    wait_until,
)

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


FULL = Sizes([5_000, 20_000], 5_000, 200, 20.0, 1_000_000, 5_000, 5_000, 1_000, 10)


QUICK = Sizes([1_000], 1_000, 40, 20.0, 50_000, 1_000, 1_000, 200, 3)


WORKLOADS = ["throughput", "bulk", "latency", "backlog", "safety", "ceiling"]


def throughput_run(
    system: System, workdir: Path, n: int, *, profile: bool = False, workers: Workers | None = None
) -> dict[str, float]:
    """Enqueue ``n`` jobs one by one, then drain them with the workers; verify every job."""
    system.reset()
    enq = enqueue(system, workdir, n)
    workers = workers or Workers(system, workdir, burst=True, profile=profile)
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
