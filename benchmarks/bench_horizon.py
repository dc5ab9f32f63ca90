"""The queue while something holds PostgreSQL's vacuum horizon back (issue 58): one command.

It creates a PostgreSQL cluster of its own (``initdb`` into a temporary directory, on a free
loopback port, with ``pg_stat_statements``), migrates a database ``jg_horizon`` and an empty
``jg_other``, and for each scenario starts 2 ``jobguard_worker --concurrency 2`` processes,
enqueues no-op jobs at a fixed rate (1,500 a second: ``bulk_enqueue`` every 20 ms) and prints
one row per minute:

- ``clean``: nothing else runs;
- ``idle-same`` / ``idle-other``: a session idle in transaction (it took an xid, so it holds
  the horizon of the whole cluster) in ``jg_horizon`` / in ``jg_other``, for the whole run;
- ``readers``: four overlapping ``REPEATABLE READ`` transactions, each two minutes long and
  scanning the jobs table every 5 s, staggered by half a minute (the shape of the public
  job-queue harness's ``active_readers``).

Per minute: jobs finished per second (and as a share of the same run's minute 2), p50/p99 of
enqueue-to-start of the jobs started in it, the plain claim's mean time and shared buffers
(``pg_stat_statements``: time inside PostgreSQL) and its buffers per job started, claims, how
many of them were full (from the head of the claim index) and their mean buffers; at the
minute's end, the buffers of the claim's read (``EXPLAIN (ANALYZE, BUFFERS)``, 10 rows, rolled
back) from the head of the index and from the last claimed job on, jobs queued, dead tuples,
heap and index size of the jobs table; and autovacuum runs on it.

A minute lasts ``--minute-seconds`` (20 by default, so the default 5 minutes fit a busy
2-core machine; the autovacuum naptime is one such minute); the full run is
``--minutes 30 --minute-seconds 60``. ``--code LABEL=DIR`` runs every scenario with the
workers importing ``django_jobguard`` from DIR (for example ``git archive HEAD~
django_jobguard | tar -x -C DIR``) instead of this tree's, each ``--code`` in turn for each
scenario (the orchestrator enqueues with the ``django_jobguard`` it imports: this tree's, or
the first one on ``PYTHONPATH``)::

    .venv/bin/python benchmarks/bench_horizon.py
    .venv/bin/python benchmarks/bench_horizon.py --scenarios clean,idle-same \
        --code before=/tmp/before --code after=/tmp/after
    .venv/bin/python benchmarks/bench_horizon.py --minutes 30 --minute-seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    # Last: django_jobguard comes from PYTHONPATH when set there (a tree of another commit).
    sys.path.append(str(ROOT))

from benchmarks._database import Cluster, Enqueuer, load, log, reset, start_workers, stop_workers  # noqa: E402

SCENARIOS = ("clean", "idle-same", "idle-other", "readers")
#: The active readers: how many, each transaction's length and the pause between its scans.
READERS = 4
READER_MINUTES = 2
READER_SCAN_SECONDS = 5
#: Where the cluster may listen (the first free port from here up).
PORTS = range(5480, 5500)
DATABASE, OTHER_DATABASE = "jg_horizon", "jg_other"
#: The plain claim's statement, as pg_stat_statements normalises it, and the mark of a bounded
#: one (it reads ranges of the claim index from an array, ``AS b(...)``; a full claim does not).
CLAIM_QUERY = "WITH picked AS (%UPDATE jobguard_job AS j SET status = %"
BOUNDED_MARK = "% AS b(%"


# -- what runs beside the queue ---------------------------------------------------------------


class Holder:
    """What holds the horizon in a scenario: nothing, an idle transaction, or the readers."""

    def __init__(self, scenario: str, cluster: Cluster, minute_seconds: float) -> None:
        self.scenario = scenario
        self.cluster = cluster
        self.minute_seconds = minute_seconds
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.idle: Any = None
        self.scans = 0

    def __enter__(self) -> Holder:
        import psycopg

        if self.scenario in ("idle-same", "idle-other"):
            dbname = DATABASE if self.scenario == "idle-same" else OTHER_DATABASE
            self.idle = psycopg.connect(self.cluster.url(dbname))
            self.idle.execute("SELECT txid_current()")  # left idle in transaction, with an xid
        elif self.scenario == "readers":
            length = READER_MINUTES * self.minute_seconds
            for index in range(READERS):
                thread = threading.Thread(target=self._reader, args=(index * length / READERS, length))
                thread.start()
                self.threads.append(thread)
        return self

    def _reader(self, delay: float, length: float) -> None:
        import psycopg

        if self.stop.wait(delay):
            return
        with psycopg.connect(self.cluster.url(DATABASE)) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not self.stop.is_set():
                ends = time.monotonic() + length
                while not self.stop.is_set() and time.monotonic() < ends:
                    conn.execute("SELECT count(*), sum(length(args::text)) FROM jobguard_job").fetchone()
                    self.scans += 1
                    self.stop.wait(min(READER_SCAN_SECONDS, max(0.0, ends - time.monotonic())))
                conn.commit()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()
        if self.idle is not None:
            self.idle.rollback()
            self.idle.close()


# -- one run ----------------------------------------------------------------------------------


def _sample(conn: Any) -> dict[str, float]:
    """The counters read at a minute's end."""
    claims = conn.execute(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0), "
        "coalesce(sum(shared_blks_hit + shared_blks_read), 0), "
        "coalesce(sum(calls) FILTER (WHERE query NOT LIKE %s), 0), "
        "coalesce(sum(shared_blks_hit + shared_blks_read) FILTER (WHERE query NOT LIKE %s), 0) "
        "FROM pg_stat_statements WHERE query LIKE %s",
        [BOUNDED_MARK, BOUNDED_MARK, CLAIM_QUERY],
    ).fetchone()
    table = conn.execute(
        "SELECT n_dead_tup, autovacuum_count, pg_table_size(relid), pg_indexes_size(relid) "
        "FROM pg_stat_user_tables WHERE relname = 'jobguard_job'"
    ).fetchone()
    queued = conn.execute("SELECT count(*) FROM jobguard_job WHERE status = 'queued'").fetchone()[0]
    full_read, bounded_read = _reads(conn)
    return {
        "full_read": full_read,
        "bounded_read": bounded_read,
        "claims": float(claims[0]),
        "claim_ms": float(claims[1]),
        "claim_buffers": float(claims[2]),
        "full_claims": float(claims[3]),
        "full_buffers": float(claims[4]),
        "dead": float(table[0]),
        "autovacuum": float(table[1]),
        "size_mb": (table[2] + table[3]) / 2**20,
        "queued": float(queued),
    }


_READ = (
    "SELECT id FROM jobguard_job WHERE status = 'queued' AND run_after <= statement_timestamp() "
    "AND attempts < max_attempts {bound}ORDER BY priority DESC, run_after, id LIMIT 10 FOR UPDATE SKIP LOCKED"
)


def _reads(conn: Any) -> tuple[float, float]:
    """Shared buffers of the claim's read now, from the head of the claim index and from the last
    claimed job on (``EXPLAIN (ANALYZE, BUFFERS)``, rolled back): what each tree's claims pay."""
    last = conn.execute(
        "SELECT priority, run_after, id FROM jobguard_job WHERE id = "
        "(SELECT max(id) FROM jobguard_job WHERE started_at IS NOT NULL)"
    ).fetchone()
    found = []
    for bound, params in (("", []), ("AND priority = %s AND (run_after, id) >= (%s, %s) ", list(last or []))):
        if params or not bound:
            with conn.transaction(force_rollback=True):
                conn.execute("SET LOCAL enable_bitmapscan = off")
                plan = conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _READ.format(bound=bound), params
                ).fetchone()[0][0]["Plan"]
            found.append(float(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]))
        else:
            found.append(float("nan"))
    return found[0], found[1]


def _wait_for(conn: Any, condition: str, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not conn.execute(condition).fetchone()[0]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {seconds:.0f} s")
        time.sleep(0.2)


def run(
    scenario: str, code: Path | None, cluster: Cluster, args: argparse.Namespace
) -> list[dict[str, float]]:
    """One scenario with one tree of django_jobguard: its rows, one per minute."""
    import psycopg

    conn: Any = psycopg.connect(cluster.url(DATABASE), autocommit=True)
    reset(conn)
    workers = start_workers(cluster, DATABASE, args.workers, args.concurrency, code)
    try:
        from benchmarks.jobguard_app.tasks import noop

        noop.bulk_enqueue(((-1,), {}) for _ in range(100))  # the workers are up once these ran
        _wait_for(conn, "SELECT count(*) = 100 FROM jobguard_job WHERE status = 'succeeded'", 120, "warm-up")
        conn.execute("TRUNCATE jobguard_job RESTART IDENTITY CASCADE")
        conn.execute("SELECT pg_stat_statements_reset()")
        minute = args.minute_seconds
        samples = [_sample(conn)]
        t0 = float(conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
        enqueuer = Enqueuer(args.rate)
        with Holder(scenario, cluster, minute):
            enqueuer.start()
            started = time.monotonic()
            for index in range(1, args.minutes + 1):
                time.sleep(max(0.0, started + index * minute - time.monotonic()))
                samples.append(_sample(conn))
                dead = [p.pid for p in workers if p.poll() is not None]
                if dead:
                    raise RuntimeError(f"worker {dead} exited (--keep keeps its log, workers.log)")
            enqueuer.stop.set()
            enqueuer.join()
        stop_workers(workers)
        rows = _minutes(conn, t0, minute, args.minutes)
        for index, row in enumerate(rows):
            before, after = samples[index], samples[index + 1]
            calls = after["claims"] - before["claims"]
            full = after["full_claims"] - before["full_claims"]
            per_claim = 1 / calls if calls else float("nan")
            row.update(
                claims=calls,
                claim_ms=(after["claim_ms"] - before["claim_ms"]) * per_claim,
                claim_buffers=(after["claim_buffers"] - before["claim_buffers"]) * per_claim,
                full_claims=full,
                full_buffers=(after["full_buffers"] - before["full_buffers"]) / full
                if full
                else float("nan"),
                queued=after["queued"],
                dead=after["dead"],
                size_mb=after["size_mb"],
                autovacuum=after["autovacuum"] - before["autovacuum"],
                buffers_per_job=(after["claim_buffers"] - before["claim_buffers"]) / row["started"]
                if row["started"]
                else float("nan"),
                full_read=after["full_read"],
                bounded_read=after["bounded_read"],
            )
        if enqueuer.behind > 1:
            log(f"the enqueuer fell {enqueuer.behind:.1f} s behind its pace: the rate is not what was asked")
        return rows
    finally:
        stop_workers(workers)
        conn.close()


def _minutes(conn: Any, t0: float, minute: float, minutes: int) -> list[dict[str, float]]:
    """Per minute from the job rows: finished per second, p50/p99 enqueue-to-start (ms), starts."""
    done = dict(
        conn.execute(
            "SELECT floor((extract(epoch FROM finished_at) - %s) / %s)::int, count(*) FROM jobguard_job "
            "WHERE status = 'succeeded' AND args->>0 <> '-1' GROUP BY 1",
            [t0, minute],
        ).fetchall()
    )
    waits = {
        row[0]: row[1:]
        for row in conn.execute(
            "SELECT floor((extract(epoch FROM started_at) - %s) / %s)::int, "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY started_at - enqueued_at), "
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY started_at - enqueued_at), count(*) "
            "FROM jobguard_job WHERE started_at IS NOT NULL GROUP BY 1",
            [t0, minute],
        ).fetchall()
    }
    rows = []
    for index in range(minutes):
        p50, p99, started = waits.get(index, (None, None, 0))
        rows.append(
            {
                "minute": index + 1,
                "done_per_s": done.get(index, 0) / minute,
                "p50_ms": p50.total_seconds() * 1000 if p50 is not None else float("nan"),
                "p99_ms": p99.total_seconds() * 1000 if p99 is not None else float("nan"),
                "started": float(started),
            }
        )
    return rows


# -- the report -------------------------------------------------------------------------------

COLUMNS = (
    ("min", "minute", "{:.0f}"),
    ("done/s", "done_per_s", "{:,.0f}"),
    ("vs min 2", "share", "{:.0%}"),
    ("p50 ms", "p50_ms", "{:,.0f}"),
    ("p99 ms", "p99_ms", "{:,.0f}"),
    ("claim ms", "claim_ms", "{:.2f}"),
    ("claim bufs", "claim_buffers", "{:,.0f}"),
    ("bufs/job", "buffers_per_job", "{:,.1f}"),
    ("claims", "claims", "{:,.0f}"),
    ("full", "full_claims", "{:,.0f}"),
    ("full bufs", "full_buffers", "{:,.0f}"),
    ("queued", "queued", "{:,.0f}"),
    ("dead tuples", "dead", "{:,.0f}"),
    ("read bufs full / bounded", "reads", "{}"),
    ("heap+idx MB", "size_mb", "{:,.0f}"),
    ("autovac", "autovacuum", "{:.0f}"),
)


def table(title: str, rows: list[dict[str, Any]]) -> str:
    second = rows[1]["done_per_s"] if len(rows) > 1 else rows[0]["done_per_s"]
    for row in rows:
        row["share"] = row["done_per_s"] / second if second else float("nan")
        row["reads"] = f"{row['full_read']:,.0f} / {row['bounded_read']:,.0f}"
    lines = [f"### {title}", "", "| " + " | ".join(c[0] for c in COLUMNS) + " |"]
    lines.append("|" + "|".join(" ---: " for _ in COLUMNS) + "|")
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def _codes(values: list[str]) -> list[tuple[str, Path | None]]:
    codes: list[tuple[str, Path | None]] = [] if values else [("this tree", None)]
    for value in values:
        label, _, directory = value.partition("=")
        if not (Path(directory) / "django_jobguard").is_dir():
            raise SystemExit(f"--code {value}: no django_jobguard package in {directory}")
        codes.append((label, Path(directory).resolve()))
    return codes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {SCENARIOS}")
    parser.add_argument("--rate", type=float, default=1500, help="jobs enqueued per second (1500)")
    parser.add_argument("--minutes", type=int, default=5, help="minutes per scenario (5)")
    parser.add_argument("--minute-seconds", type=float, default=20, help="seconds a minute (20; 60 real)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker (2)")
    parser.add_argument(
        "--code", action="append", default=[], metavar="LABEL=DIR",
        help="run each scenario with the workers' django_jobguard from DIR (repeatable; default: this tree)",
    )  # fmt: skip
    parser.add_argument("--json", help="write the rows to this file as JSON as well")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (its log)")
    args = parser.parse_args(argv)
    scenarios = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    codes = _codes(args.code)

    cluster = Cluster(
        "horizon", PORTS, [DATABASE, OTHER_DATABASE], args.minute_seconds, args.keep,
        settings=["pg_stat_statements.max = 1000"],
    )  # fmt: skip
    cluster.start()
    os.environ.update(cluster.environ(DATABASE))
    results: dict[str, Any] = {"load_before": load(), "args": vars(args), "runs": []}
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*(str(c) for _, c in codes[:1] if c), str(ROOT)])}
        migrate = [sys.executable, "-m", "django", "migrate", "--verbosity", "0", "--skip-checks"]
        subprocess.run(migrate, cwd=codes[0][1] or ROOT, env=env, check=True)
        import django

        django.setup()
        for scenario in scenarios:
            for label, code in codes:
                log(f"{scenario} ({label}): {args.minutes} x {args.minute_seconds:g} s, {args.rate:g} jobs/s")
                rows = run(scenario, code, cluster, args)
                results["runs"].append({"scenario": scenario, "code": label, "rows": rows})
                print(table(f"{scenario}, {label}", rows), "\n", flush=True)
    finally:
        cluster.stop()
    results["load_after"] = load()
    print(
        f"{args.workers} workers x {args.concurrency} threads, {args.rate:g} jobs/s, "
        f"{args.minutes} minutes of {args.minute_seconds:g} s; load before {results['load_before']}, "
        f"after {results['load_after']}; {os.cpu_count()} CPUs"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
