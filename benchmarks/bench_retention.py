"""Finished jobs pruned by the workers (issue 58, point 3): table sizes under load, and a day pruned.

One command. It creates a PostgreSQL cluster of its own (``initdb`` into a temporary directory,
on a free loopback port, with ``pg_stat_statements``), migrates a database, starts 2
``jobguard_worker --concurrency 2`` processes with a short retention and enqueues no-op jobs at
a fixed rate, then:

1. **steady**: one row per minute of the jobs table's heap and index sizes
   (``pg_relation_size``, ``pg_indexes_size``), live and dead tuples, autovacuum runs, jobs
   finished per second and the finished jobs still stored; then how far each size strayed from
   its mean over minutes 4 to the last (the issue asks for ±10 %).
2. **day**: ``--day-rows`` succeeded jobs that finished over one day, two days ago (a day of
   history at a smaller rate), written straight into the table; the same load runs on while the
   elected worker prunes them with the default batch size. It reports how long the pruning
   took, its rate, the dead tuples it left, the claim's slowest and mean execution inside
   PostgreSQL (``pg_stat_statements``) during it, how many lock waits passed 100 ms
   (``log_lock_waits`` with ``deadlock_timeout = 100ms``: the server logs each one), and the
   p50/p99 of enqueue-to-start of the jobs started meanwhile.

A minute lasts ``--minute-seconds`` (30 by default: ten such minutes scale the issue's thirty);
autovacuum looks once per such minute. The workers prune every ``--interval`` seconds with a
retention of ``--retention`` seconds for succeeded jobs::

    .venv/bin/python benchmarks/bench_retention.py
    .venv/bin/python benchmarks/bench_retention.py --minutes 30 --minute-seconds 60 --rate 1500
    .venv/bin/python benchmarks/bench_retention.py --skip-steady --day-rows 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._database import Cluster, Enqueuer, load, log, reset, start_workers, stop_workers  # noqa: E402

#: Where the cluster may listen (the first free port from here up).
PORTS = range(5500, 5520)
DATABASE = "jg_retention"
#: The plain claim's statement, as pg_stat_statements normalises it.
CLAIM_QUERY = "WITH picked AS (%UPDATE jobguard_job AS j SET status = %"


def _workers(cluster: Cluster, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    retention = {"RETENTION": {"SUCCEEDED": args.retention, "INTERVAL": args.interval}}
    env = {"BENCH_JOBGUARD": json.dumps(retention)}
    return start_workers(cluster, DATABASE, args.workers, args.concurrency, env=env)


#: A row of the day's history: a no-op job as a worker leaves it (attempt history included).
HISTORY_ROW = """
INSERT INTO jobguard_job (
    task_name, queue_name, args, kwargs, priority, status, attempts, max_attempts,
    visibility_timeout, worker_id, enqueued_at, run_after, started_at, finished_at, last_error,
    reappearances, lock_contentions, lock_key, handler_version, result, checkpoints,
    attempt_history
)
SELECT 'bench.noop', 'default', jsonb_build_array(n), '{}'::jsonb, 0, 'succeeded', 1, 5, 60,
       'bench-host:4242:abcdef', at, at, at, at + interval '2 ms', '', 0, 0, '', '', 'null'::jsonb,
       '{}'::jsonb,
       jsonb_build_array(jsonb_build_object('worker_id', 'bench-host:4242:abcdef', 'started_at', at))
FROM (
    SELECT n, now() - interval '2 days' - (n * interval '1 day' / %(rows)s) AS at
    FROM generate_series(1, %(rows)s) AS n
) AS history
"""


def _sizes(conn: Any) -> dict[str, float]:
    row = conn.execute(
        "SELECT pg_relation_size(relid), pg_indexes_size(relid), n_live_tup, n_dead_tup, autovacuum_count "
        "FROM pg_stat_user_tables WHERE relname = 'jobguard_job'"
    ).fetchone()
    finished = conn.execute(
        "SELECT count(*) FROM jobguard_job WHERE status IN ('succeeded', 'dead', 'cancelled')"
    ).fetchone()[0]
    done = conn.execute(
        "SELECT count(*) FROM jobguard_job "
        "WHERE status = 'succeeded' AND finished_at > now() - interval '1 minute'"
    ).fetchone()[0]
    return {
        "heap_mb": row[0] / 2**20,
        "index_mb": row[1] / 2**20,
        "live": float(row[2]),
        "dead": float(row[3]),
        "autovacuum": float(row[4]),
        "finished": float(finished),
        "recent": float(done),
    }


def _claim_stats(conn: Any) -> tuple[float, float, float]:
    """Claims, their mean and their slowest execution (ms) since the last reset."""
    calls, mean, slowest = conn.execute(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time) / nullif(sum(calls), 0), 0), "
        "coalesce(max(max_exec_time), 0) FROM pg_stat_statements WHERE query LIKE %s",
        [CLAIM_QUERY],
    ).fetchone()
    return float(calls), float(mean), float(slowest)


def _warm(conn: Any) -> None:
    from benchmarks.jobguard_app.tasks import noop

    noop.bulk_enqueue(((-1,), {}) for _ in range(100))
    deadline = time.monotonic() + 120
    while conn.execute("SELECT count(*) < 100 FROM jobguard_job WHERE status = 'succeeded'").fetchone()[0]:
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start within 120 s (--keep keeps workers.log)")
        time.sleep(0.2)


def steady(cluster: Cluster, args: argparse.Namespace) -> list[dict[str, float]]:
    """The steady run: one row of sizes per minute."""
    import psycopg

    conn: Any = psycopg.connect(cluster.url(DATABASE), autocommit=True)
    reset(conn)
    workers = _workers(cluster, args)
    try:
        _warm(conn)
        rows = []
        enqueuer = Enqueuer(args.rate)
        enqueuer.start()
        started = time.monotonic()
        for minute in range(1, args.minutes + 1):
            time.sleep(max(0.0, started + minute * args.minute_seconds - time.monotonic()))
            rows.append({"minute": minute, **_sizes(conn)})
            if any(p.poll() is not None for p in workers):
                raise RuntimeError("a worker exited (--keep keeps workers.log)")
            log(f"minute {minute}: {rows[-1]}")
        enqueuer.stop.set()
        enqueuer.join()
        if enqueuer.behind > 1:
            log(f"the enqueuer fell {enqueuer.behind:.1f} s behind its pace: the rate is not what was asked")
        return rows
    finally:
        stop_workers(workers)
        conn.close()


def day(cluster: Cluster, args: argparse.Namespace) -> dict[str, float]:
    """A day of history pruned under the same load: how long, and what claims saw meanwhile."""
    import psycopg

    conn: Any = psycopg.connect(cluster.url(DATABASE), autocommit=True)
    reset(conn)
    log(f"writing {args.day_rows:,} succeeded jobs finished over a day, two days ago")
    conn.execute(HISTORY_ROW, {"rows": args.day_rows})
    conn.execute("VACUUM (ANALYZE) jobguard_job")
    before = _sizes(conn)
    server_log = cluster.root / "server.log"
    log_start = server_log.stat().st_size
    # The first pass waits one interval after a worker starts: the load is on by then.
    workers = _workers(cluster, args)
    try:
        _warm(conn)
        conn.execute("SELECT pg_stat_statements_reset()")
        t0 = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
        enqueuer = Enqueuer(args.rate)
        enqueuer.start()
        old = (
            "SELECT count(*) FROM jobguard_job "
            "WHERE status = 'succeeded' AND finished_at < now() - interval '1 day'"
        )
        first = last = None
        deadline = time.monotonic() + args.day_timeout
        while True:
            left = conn.execute(old).fetchone()[0]
            now = time.monotonic()
            if first is None and left < args.day_rows:
                first = now
            if left == 0:
                last = now
                break
            if now > deadline:
                log(f"{left:,} old jobs left after {args.day_timeout:.0f} s")
                break
            time.sleep(0.5)
        claims, mean, slowest = _claim_stats(conn)
        enqueuer.stop.set()
        enqueuer.join()
        t1 = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
    finally:
        stop_workers(workers)
    after = _sizes(conn)
    waits = conn.execute(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY started_at - enqueued_at), "
        "percentile_cont(0.99) WITHIN GROUP (ORDER BY started_at - enqueued_at) FROM jobguard_job "
        "WHERE started_at > to_timestamp(%s) AND started_at < to_timestamp(%s) AND args->>0 <> '-1'",
        [t0, t1],
    ).fetchone()
    conn.close()
    with server_log.open("rb") as text:
        text.seek(log_start)
        lock_waits = sum(b"still waiting for" in line for line in text)
    seconds = (last - first) if first is not None and last is not None else float("nan")
    return {
        "rows": float(args.day_rows),
        "seconds": seconds,
        "rows_per_s": args.day_rows / seconds if seconds == seconds and seconds > 0 else float("nan"),
        "heap_mb_before": before["heap_mb"],
        "index_mb_before": before["index_mb"],
        "heap_mb_after": after["heap_mb"],
        "index_mb_after": after["index_mb"],
        "dead_after": after["dead"],
        "claims": claims,
        "claim_mean_ms": mean,
        "claim_max_ms": slowest,
        "lock_waits_over_100ms": float(lock_waits),
        "p50_ms": waits[0].total_seconds() * 1000 if waits[0] is not None else float("nan"),
        "p99_ms": waits[1].total_seconds() * 1000 if waits[1] is not None else float("nan"),
    }


STEADY_COLUMNS = (
    ("min", "minute", "{:.0f}"),
    ("heap MB", "heap_mb", "{:,.1f}"),
    ("index MB", "index_mb", "{:,.1f}"),
    ("live", "live", "{:,.0f}"),
    ("dead", "dead", "{:,.0f}"),
    ("finished kept", "finished", "{:,.0f}"),
    ("done last min", "recent", "{:,.0f}"),
    ("autovac", "autovacuum", "{:.0f}"),
)


def steady_table(rows: list[dict[str, float]], first: int) -> str:
    lines = ["| " + " | ".join(c[0] for c in STEADY_COLUMNS) + " |"]
    lines.append("|" + "|".join(" ---: " for _ in STEADY_COLUMNS) + "|")
    lines += [
        "| " + " | ".join(fmt.format(row[key]) for _, key, fmt in STEADY_COLUMNS) + " |" for row in rows
    ]
    held = [row for row in rows if row["minute"] >= first]
    if held:
        lines.append("")
        for key, name in (("heap_mb", "heap"), ("index_mb", "indexes")):
            values = [row[key] for row in held]
            mean = statistics.fmean(values)
            spread = max(abs(v - mean) for v in values) / mean if mean else float("nan")
            lines.append(
                f"{name}, minutes {first}-{held[-1]['minute']:.0f}: mean {mean:,.1f} MB, "
                f"min {min(values):,.1f}, max {max(values):,.1f}, largest gap from the mean {spread:.1%}"
            )
    return "\n".join(lines)


def day_table(result: dict[str, float]) -> str:
    r = result
    return "\n".join(
        [
            "| figure | value |",
            "| --- | ---: |",
            f"| history rows pruned | {result['rows']:,.0f} |",
            f"| time to prune them (first to last gone) | {result['seconds']:,.1f} s |",
            f"| rate | {result['rows_per_s']:,.0f} rows/s |",
            f"| heap before / after | {r['heap_mb_before']:,.1f} / {r['heap_mb_after']:,.1f} MB |",
            f"| indexes before / after | {r['index_mb_before']:,.1f} / {r['index_mb_after']:,.1f} MB |",
            f"| dead tuples after | {result['dead_after']:,.0f} |",
            f"| claims meanwhile | {result['claims']:,.0f} |",
            f"| claim mean / slowest in PostgreSQL | {r['claim_mean_ms']:.2f} / {r['claim_max_ms']:.1f} ms |",
            f"| lock waits over 100 ms (server log) | {result['lock_waits_over_100ms']:.0f} |",
            f"| enqueue-to-start p50 / p99 meanwhile | {r['p50_ms']:,.0f} / {r['p99_ms']:,.0f} ms |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000, help="jobs enqueued per second (1000)")
    parser.add_argument("--minutes", type=int, default=10, help="minutes of the steady run (10)")
    parser.add_argument("--minute-seconds", type=float, default=30, help="seconds a minute (30; 60 real)")
    parser.add_argument("--retention", type=float, default=60, help="seconds succeeded jobs are kept (60)")
    parser.add_argument("--interval", type=float, default=5, help="RETENTION['INTERVAL'] (5)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker (2)")
    parser.add_argument("--from-minute", type=int, default=4, help="first minute of the size spread (4)")
    parser.add_argument("--day-rows", type=int, default=1_000_000, help="rows of the day pruned (1,000,000)")
    parser.add_argument("--day-timeout", type=float, default=1800, help="give up the day after (1800 s)")
    parser.add_argument("--skip-steady", action="store_true", help="only the day")
    parser.add_argument("--skip-day", action="store_true", help="only the steady run")
    parser.add_argument("--json", help="write the figures to this file as JSON as well")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (its logs)")
    args = parser.parse_args(argv)

    cluster = Cluster(
        "retention", PORTS, [DATABASE], args.minute_seconds, args.keep,
        # Each lock wait past 100 ms is a line of the server log ("still waiting for").
        settings=["log_lock_waits = on", "deadlock_timeout = '100ms'"],
    )  # fmt: skip
    cluster.start()
    os.environ.update(cluster.environ(DATABASE))
    results: dict[str, Any] = {"load_before": load(), "args": vars(args)}
    try:
        migrate = [sys.executable, "-m", "django", "migrate", "--verbosity", "0"]
        subprocess.run(migrate, cwd=ROOT, env=dict(os.environ), check=True)
        import django

        django.setup()
        if not args.skip_steady:
            shape = f"{args.minutes} x {args.minute_seconds:g} s, {args.rate:g} jobs/s"
            log(f"steady: {shape}, retention {args.retention:g} s")
            results["steady"] = steady(cluster, args)
            print(f"### steady load, succeeded jobs kept {args.retention:g} s\n")
            print(steady_table(results["steady"], args.from_minute), "\n", flush=True)
        if not args.skip_day:
            log(f"day: {args.day_rows:,} rows of history under {args.rate:g} jobs/s")
            results["day"] = day(cluster, args)
            print(f"### a day of history ({args.day_rows:,} rows) pruned under load\n")
            print(day_table(results["day"]), "\n", flush=True)
    finally:
        cluster.stop()
    results["load_after"] = load()
    print(
        f"{args.workers} workers x {args.concurrency} threads, {args.rate:g} jobs/s, batch 500, "
        f"interval {args.interval:g} s; load before {results['load_before']}, after {results['load_after']}; "
        f"{os.cpu_count()} CPUs"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
