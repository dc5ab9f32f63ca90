#!/usr/bin/env python
"""Atomic jobs against pgbench, side by side: how close does one job come to one transaction?

    benchmarks/bench_atomic.py [--runs 3] [--jobs 20000] [--seconds 10]
    benchmarks/bench_atomic.py --ref HEAD --db-prefix jg_h5 --redis-db 5    # a commit's code, own names
    benchmarks/bench_atomic.py --no-claim --runs 5                          # without the claim's variant

Both sides run the same transaction on the same database (``<prefix>_atomic``), as many at a
time as the workers have threads:

- **jobguard**: ``--jobs`` jobs of ``bench.insert_atomic`` (``benchmarks/jobguard_app/tasks_atomic.py``,
  ``@task(atomic=True)``), bulk-enqueued, then drained by 2 worker processes x 2 threads
  (``--burst``, package defaults, metrics on). The handler inserts one row into
  ``bench_atomic_log``; the worker's ack updates the job's row and commits both. The rate is
  timed from the store's first start to its last finish, as ``bench_compare.py`` does, and
  every job and every inserted row is checked (each job once, each row once).
- **pgbench**: ``pgbench -n -c 4 -j 2 -T --seconds`` with the script ``BEGIN; UPDATE one random
  row of bench_atomic_row (--jobs rows); INSERT the handler's row; COMMIT``.
- **pgbench + claim** (unless ``--no-claim``): the same, plus a claim-shaped transaction (one
  ``UPDATE`` of a range of rows, autocommitted) weighted as the workers' commits beyond one per
  job were in the latest drain: what a job costs the server, claim included. Its rate is the
  job-shaped script's transactions per second.

Each round runs the sides back to back, in the opposite order each round, after an unmeasured
warm-up of each. Per side: the rate, commits per job (``pg_stat_database.xact_commit`` of the
database over the drain, read from a transaction that rolls back, after every other client
left: the workers' claims, heartbeats and acks, everything they committed), CPU per job of the
client (the worker processes, or pgbench) and of the PostgreSQL backends serving the database
(from /proc), and how busy that kept the host's cores. Once, before the rounds, one drain runs
through a counting proxy (``_wire_count.py``): round trips and statements per job, and what they
were (its rate is not reported: the proxy takes CPU). The table gives medians [min-max] of
``--runs`` rounds and jobguard/pgbench per round. Exit status 1 if a run failed its checks.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._report import table  # noqa: E402
from benchmarks._systems import (  # noqa: E402
    CONCURRENCY,
    STARTUP_TIMEOUT_SECONDS,
    WORKER_PROCESSES,
    BackendCpu,
    BenchError,
    Jobguard,
    Servers,
    ServerWork,
    Workers,
    enqueue,
    log,
    verify,
)
from benchmarks._wire_count import WireCounter  # noqa: E402

#: The driver's variant (benchmarks/drivers/jobguard.py) and what its processes need to import it.
VARIANT = "insert_atomic"
ENVIRONMENT = {"BENCH_ATOMIC": "1"}

#: The handler's table and pgbench's: the same INSERT on both sides.
LOG_TABLE = "bench_atomic_log"
ROW_TABLE = "bench_atomic_row"
TABLES = (
    f"CREATE TABLE IF NOT EXISTS {LOG_TABLE} (id bigserial PRIMARY KEY, job bigint NOT NULL, "
    "at timestamptz NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS {ROW_TABLE} (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)",
)
JOB_SCRIPT = (
    "\\set id random(1, {rows})\n"
    "BEGIN;\n"
    f"UPDATE {ROW_TABLE} SET v = v + 1 WHERE id = :id;\n"
    f"INSERT INTO {LOG_TABLE} (job, at) VALUES (:id, now());\n"
    "COMMIT;\n"
)
CLAIM_SCRIPT = (
    "\\set first random(1, {last})\n"
    f"UPDATE {ROW_TABLE} SET v = v + 1 WHERE id BETWEEN :first AND :first + {{batch}} - 1;\n"
)

THREADS = WORKER_PROCESSES * CONCURRENCY

METRICS = [
    ("rate", "jobs/s (pgbench: job-shaped transactions/s)", 0),
    ("commits_per_job", "commits per job (xact_commit)", 3),
    ("client_cpu_ms", "client CPU ms/job (workers, or pgbench)", 3),
    ("postgres_cpu_ms", "PostgreSQL CPU ms/job", 3),
    ("total_cpu_ms", "client + PostgreSQL CPU ms/job", 3),
    ("busy", "host busy (CPU s/s over the cores)", 2),
]


class Database:
    """The benchmark's database, its two tables, and its commit counter."""

    def __init__(self, servers: Servers, dbname: str, rows: int) -> None:
        self.servers = servers
        self.dbname = dbname
        self.rows = rows

    def create_tables(self) -> None:
        self.servers.execute(self.dbname, *TABLES)
        have = int(self.servers.query(self.dbname, f"SELECT count(*) FROM {ROW_TABLE}")[0][0])
        if have != self.rows:
            self.servers.execute(
                self.dbname,
                f"TRUNCATE {ROW_TABLE}",
                f"INSERT INTO {ROW_TABLE} (id) SELECT g FROM generate_series(1, {int(self.rows)}) g",
            )

    def empty_log(self) -> None:
        self.servers.execute(self.dbname, f"TRUNCATE {LOG_TABLE} RESTART IDENTITY")
        self.servers.vacuum(self.dbname, [LOG_TABLE, ROW_TABLE])

    def commits(self) -> int:
        """The database's committed transactions so far, once every other client has left.

        Read from a transaction of a connection of its own that rolls back, so reading adds no
        commit; the harness's own connection is closed first (a backend reports its counts
        when it exits, or up to a minute later while it stays).
        """
        self.servers.close()
        conn = self.servers.psycopg.connect(self.servers.url(self.dbname))
        try:
            deadline = time.monotonic() + 30
            while True:
                conn.execute("SELECT pg_stat_clear_snapshot()")
                others = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchone()
                if not others or not others[0] or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            conn.rollback()
        finally:
            conn.close()
        return int(row[0]) if row else 0


@contextlib.contextmanager
def children_cpu() -> Iterator[list[float]]:
    """CPU seconds of the child processes waited for inside the block (pgbench)."""
    spent: list[float] = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    yield spent
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


def drain(
    system: Jobguard,
    database: Database,
    workdir: Path,
    n: int,
    counter: WireCounter | None = None,
    sampled: bool = False,
) -> dict[str, Any]:
    """Enqueue ``n`` jobs in bulk, drain them with the workers; check every job and every row."""
    system.reset()
    database.empty_log()
    enqueue(system, workdir, n, mode="bulk")
    env: dict[str, str] = {}
    if counter is not None:
        url = urlsplit(system.env()["BENCH_DATABASE_URL"])
        user = f"{url.username}@" if url.username else ""
        env["BENCH_DATABASE_URL"] = url._replace(netloc=f"{user}127.0.0.1:{counter.port}").geturl()
        counter.reset()
    before = database.commits()
    workers = Workers(system, workdir, burst=True, env=env)
    backends = BackendCpu(database.dbname)
    work = ServerWork(system.servers, database.dbname) if sampled else contextlib.nullcontext()
    with backends, work:
        workers.start()
        try:
            workers.wait_exit(timeout=STARTUP_TIMEOUT_SECONDS + n / 20)
        except BaseException:
            workers.kill()
            raise
    commits = database.commits() - before
    records = verify(system, n)
    logged = system.servers.query(database.dbname, f"SELECT count(*), count(DISTINCT job) FROM {LOG_TABLE}")[
        0
    ]
    if (int(logged[0]), int(logged[1])) != (n, n):
        raise BenchError(f"jobguard: {logged[0]} rows inserted for {logged[1]} jobs; expected {n} for {n}")
    first = min(r.started_at for r in records if r.started_at is not None)
    last = max(r.finished_at for r in records if r.finished_at is not None)
    rate = n / (last - first)
    client, server = workers.cpu_seconds() * 1000 / n, backends.seconds * 1000 / n
    result: dict[str, Any] = {
        "rate": rate,
        "commits_per_job": commits / n,
        "client_cpu_ms": client,
        "postgres_cpu_ms": server,
        "total_cpu_ms": client + server,
        "busy": rate * (client + server) / 1000 / (os.cpu_count() or 1),
    }
    if counter is not None:
        result["round_trips_per_job"] = counter.round_trips / n
        result["statements_per_job"] = counter.statements / n
        result["kinds_per_job"] = {kind: count / n for kind, count in counter.kinds.most_common()}
    if isinstance(work, ServerWork):
        result.update(work.per_job(n), **work.wait_shares())
    return result


def pgbench(
    system: Jobguard,
    database: Database,
    seconds: int,
    claim: tuple[int, int, int] | None = None,
    sampled: bool = False,
) -> dict[str, Any]:
    """pgbench with the job-shaped script (and, with ``claim`` = (job weight, claim weight, rows),
    the claim-shaped one beside it) on the database, ``THREADS`` clients."""
    database.empty_log()
    scripts: list[str] = []
    with contextlib.ExitStack() as stack:
        job_script = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".sql"))
        job_script.write(JOB_SCRIPT.format(rows=database.rows))
        job_script.flush()
        if claim is None:
            scripts += ["-f", job_script.name]
        else:
            job_weight, claim_weight, batch = claim
            claim_script = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".sql"))
            claim_script.write(CLAIM_SCRIPT.format(last=max(1, database.rows - batch + 1), batch=batch))
            claim_script.flush()
            scripts += ["-f", f"{job_script.name}@{job_weight}", "-f", f"{claim_script.name}@{claim_weight}"]
        command = ["pgbench", "-n", "-c", str(THREADS), "-j", str(min(THREADS, 2)), "-T", str(seconds)]
        before = database.commits()
        backends = BackendCpu(database.dbname)
        work = ServerWork(system.servers, database.dbname) if sampled else contextlib.nullcontext()
        with backends, work, children_cpu() as spent:
            proc = subprocess.run(
                [*command, *scripts, system.servers.url(database.dbname)],
                capture_output=True,
                text=True,
                check=False,
            )
        commits = database.commits() - before
    if proc.returncode != 0:
        raise BenchError(f"pgbench failed:\n{proc.stdout}\n{proc.stderr}")
    processed = [int(m) for m in re.findall(r"^ - ([0-9]+) transactions \(", proc.stdout, re.MULTILINE)]
    total = re.search(r"number of transactions actually processed: ([0-9]+)", proc.stdout)
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", proc.stdout)
    if not total or not tps:
        raise BenchError(f"pgbench's output has no transaction count or tps:\n{proc.stdout}")
    done, all_tps = int(total.group(1)), float(tps.group(1))
    jobs = processed[0] if claim is not None and processed else done
    logged = int(system.servers.query(database.dbname, f"SELECT count(*) FROM {LOG_TABLE}")[0][0])
    # At -T's end a client may stop after its COMMIT went out and before it counted it.
    if not jobs <= logged <= jobs + THREADS:
        raise BenchError(f"pgbench reported {jobs} job-shaped transactions, the table holds {logged} rows")
    rate = all_tps * jobs / done  # the job-shaped script's share of the transactions
    client, server = spent[0] * 1000 / jobs, backends.seconds * 1000 / jobs
    result: dict[str, Any] = {
        "rate": rate,
        "commits_per_job": commits / jobs,
        "client_cpu_ms": client,
        "postgres_cpu_ms": server,
        "total_cpu_ms": client + server,
        "busy": rate * (client + server) / 1000 / (os.cpu_count() or 1),
        "transactions": done,
    }
    if isinstance(work, ServerWork):
        result.update(work.per_job(jobs), **work.wait_shares())
    return result


def claim_share(extra: float) -> tuple[int, int, int]:
    """pgbench's weights for ``extra`` commits per job beyond the job's own: (job-shaped script,
    claim-shaped script, rows each claim-shaped transaction updates)."""
    weight = max(1, round(1000 * extra))
    return 1000, weight, max(1, round(1000 / weight))


def cell(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def report(runs: dict[str, list[dict[str, Any]]], counted: dict[str, Any], sides: list[str]) -> str:
    headers = ["figure", *sides]
    rows = [[heading, *(cell([r[m] for r in runs[s]], d) for s in sides)] for m, heading, d in METRICS]
    text = table(headers, rows) + "\n"
    for side in sides[1:]:
        # Each round's sides ran back to back: their ratio leaves out drift between rounds.
        paired = [j["rate"] / p["rate"] for j, p in zip(runs["jobguard"], runs[side], strict=False)]
        if paired:
            text += (
                f"\njobguard / {side}, per round: {', '.join(f'{x:.3f}' for x in paired)}; "
                f"median **{statistics.median(paired):.3f}**"
            )
    if counted:
        # A statement's literals are blanked by the counter, its numbers (a job's id) here.
        grouped: collections.Counter[str] = collections.Counter()
        for kind, per_job in counted["kinds_per_job"].items():
            grouped[re.sub(r"\b[0-9]+\b", "N", kind)] += per_job
        kinds = [
            [f"`{kind}`", f"{per_job:.3f}"] for kind, per_job in grouped.most_common() if per_job >= 0.001
        ]
        rest = sum(per_job for per_job in grouped.values() if per_job < 0.001)
        if rest:
            kinds.append(["everything else", f"{rest:.3f}"])
        text += (
            f"\n\nWhat the workers sent per job (one drain through the counting proxy): "
            f"{counted['round_trips_per_job']:.3f} round trips, {counted['statements_per_job']:.3f} "
            f"statements, {counted['commits_per_job']:.3f} commits.\n\n"
            + table(["statement", "per job"], kinds)
        )
    return text


def where_report(where: dict[str, dict[str, Any]]) -> str:
    """The sampled runs: where the backends' transaction time went, what each job wrote."""
    if not where:
        return ""
    categories = ServerWork.CATEGORIES
    rows = [
        [
            side,
            f"{values['rate']:,.0f}",
            *(f"{values[f'wait_{c}']:.0%}" for c in categories),
            f"{values['wal_bytes_per_job']:,.0f}",
            f"{values['wal_fpi_per_job']:.2f}",
        ]
        for side, values in where.items()
    ]
    headers = ["side", "rate (sampled)", *(f"{c.replace('_', ' ')} %" for c in categories)]
    return (
        "\n\nWhere the time went (one more run of each, `pg_stat_activity` sampled every 10 ms: the "
        "shares of the samples of backends inside a transaction; client: waiting for the client's next "
        "statement; wal: the commit's flush) and WAL per job:\n\n"
        + table([*headers, "WAL bytes/job", "full-page images/job"], rows)
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument(
        "--jobs", type=int, default=20_000, help="jobs per drain, and rows of pgbench's table"
    )
    parser.add_argument("--seconds", type=int, default=10, help="pgbench's -T per run (default 10)")
    parser.add_argument("--warmup", type=int, default=2_000, help="jobs of the unmeasured warm-up drain")
    parser.add_argument("--no-claim", action="store_true", help="leave out the pgbench + claim variant")
    parser.add_argument(
        "--no-count", action="store_true", help="leave out the drain through the counting proxy"
    )
    parser.add_argument(
        "--where",
        action="store_true",
        help="after the rounds, one more drain and pgbench run sampling pg_stat_activity every 10 ms: "
        "where the backends' transaction time went, and WAL per job",
    )
    parser.add_argument(
        "--ref", default="", help="run this commit's django_jobguard (a git worktree), not this tree's"
    )
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379", help="Redis server")
    parser.add_argument("--redis-db", type=int, default=5, help="Redis database (flushed between runs)")
    parser.add_argument("--db-prefix", default="jg_bench", help="prefix of the database it creates")
    parser.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.runs < 1 or args.jobs < 1 or args.seconds < 1:
        parser.error("--runs, --jobs and --seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    servers = Servers(args.pg_url, args.redis_url, args.db_prefix, (args.redis_db,) * 3)
    started, load = time.monotonic(), os.getloadavg()
    sides = ["jobguard", "pgbench"] + ([] if args.no_claim else ["pgbench + claim"])
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    loads: list[float] = []
    errors: list[str] = []
    counted: dict[str, Any] = {}
    where: dict[str, dict[str, Any]] = {}
    code_label = "this tree"
    with tempfile.TemporaryDirectory(prefix="jg-atomic-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        code = None
        if args.ref:
            from benchmarks.bench_compare import Checkout, check_code

            checkout = stack.enter_context(Checkout(args.ref, workdir, "ref"))
            code, code_label = checkout.code, f"{args.ref} ({checkout.sha[:9]})"
        system = Jobguard(servers, sys.executable, suffix="_atomic", code=code)
        system.configure(VARIANT, True, "database")
        system.extra_env = dict(ENVIRONMENT)
        if args.ref:
            check_code(system, checkout)
        log(f"setting up {system.dbname} ({code_label})")
        system.setup()
        database = Database(servers, servers.db("_atomic"), args.jobs)
        database.create_tables()
        log(f"warm-up: {args.warmup} jobs and {min(args.seconds, 3)} s of pgbench (not measured)")
        drain(system, database, workdir, args.warmup)
        pgbench(system, database, min(args.seconds, 3))
        extra = 0.15  # the workers' commits beyond one per job, until a drain measures them
        if not args.no_count:
            pg = urlsplit(args.pg_url)
            counter = WireCounter(pg.hostname or "127.0.0.1", pg.port or 5432).start()
            log(f"counted drain: {args.jobs} jobs through the counting proxy")
            counted = drain(system, database, workdir, args.jobs, counter)
            extra = max(counted["commits_per_job"] - 1, 0.0)
        claims: list[tuple[int, int, int]] = []
        for r in range(args.runs):
            loads.append(os.getloadavg()[0])
            order = sides if r % 2 == 0 else sides[::-1]
            log(f"round {r + 1}/{args.runs}: {', '.join(order)}; load {loads[-1]:.2f}")
            for side in order:
                try:
                    if side == "jobguard":
                        values = drain(system, database, workdir, args.jobs)
                        extra = max(values["commits_per_job"] - 1, 0.0)
                    elif side == "pgbench":
                        values = pgbench(system, database, args.seconds)
                    else:
                        claims.append(claim_share(extra))
                        values = pgbench(system, database, args.seconds, claims[-1])
                except BenchError as exc:
                    errors.append(f"{side}, round {r + 1}: {exc}")
                    log(f"  FAILED {side}: {str(exc)[:2000]}")
                    continue
                runs[side].append(values)
                log(
                    f"  {side}: {values['rate']:,.0f}/s, {values['commits_per_job']:.3f} commits/job, "
                    f"CPU {values['client_cpu_ms']:.3f} + {values['postgres_cpu_ms']:.3f} ms/job"
                )
        if args.where:
            log("where the time goes: a drain and a pgbench run, pg_stat_activity sampled (not in the table)")
            try:
                where = {
                    "jobguard": drain(system, database, workdir, args.jobs, sampled=True),
                    "pgbench": pgbench(system, database, args.seconds, sampled=True),
                }
            except BenchError as exc:
                errors.append(f"the sampled runs: {exc}")
    servers.close()
    stamp = datetime.datetime.now(datetime.UTC)
    header = (
        f"## Atomic jobs against pgbench, {stamp:%Y-%m-%d %H:%M} UTC\n\n"
        f"Command: `benchmarks/bench_atomic.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
        f"django_jobguard from {code_label}; {os.cpu_count()} cores, load average at start "
        f"{', '.join(f'{x:.2f}' for x in load)}, at each round's start "
        f"{', '.join(f'{x:.2f}' for x in loads)}; took {(time.monotonic() - started) / 60:.1f} min. "
        f"{args.jobs:,} `@task(atomic=True)` jobs inserting one row each, "
        f"{WORKER_PROCESSES} worker processes x {CONCURRENCY}; `pgbench -c {THREADS} -T "
        f"{args.seconds}`: BEGIN, UPDATE one random row of {args.jobs:,}, INSERT one row, COMMIT"
        + (
            "; + claim: per 1,000 of those, as many claim-shaped transactions (an UPDATE of as many rows as "
            "jobs per such commit) as the workers committed beyond one per job in the latest drain: "
            + ", ".join(f"{weight} of {batch} rows" for _, weight, batch in claims)
            if claims
            else ""
        )
        + f". Median [min-max] of {args.runs} interleaved rounds."
    )
    document = header + "\n\n" + report(runs, counted, sides) + where_report(where)
    if errors:
        document += "\n\n### Errors\n\n" + "\n".join(f"- {e[:500]}" for e in errors)
    print(document)
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"atomic-{stamp:%Y%m%dT%H%M%SZ}.json"
    path.write_text(
        json.dumps(
            {
                "args": vars(args),
                "load_average_at_start": load,
                "round_loads": loads,
                "claim_shares": claims,
                "runs": runs,
                "counted": counted,
                "where": where,
                "errors": errors,
                "table": document,
            },
            indent=2,
        )
        + "\n"
    )
    log(f"wrote {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
