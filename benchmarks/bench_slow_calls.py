"""Slow calls: jobs that each make one HTTP request answered after 100 ms, per system and mode.

One worker process drains ``--jobs`` jobs, each one HTTP/1.1 GET to a local server on loopback
that answers after ``--delay`` seconds (``benchmarks/_slow_http.py``: the same exchange for every
system), in each mode:

- ``jobguard async 500``: ``jobguard_worker --async-slots 500`` (coroutines on one event loop);
  ``jobguard threads 8`` / ``64``: the thread executor (each job holds a thread, the coroutine
  run by ``async_to_sync``). PostgreSQL.
- ``celery gevent 500``: ``celery worker -P gevent -c 500``; ``celery threads 64``: ``-P threads
  -c 64``. Redis broker, ``acks_late``, results not stored, a blocking socket in the task.
- ``procrastinate 500``: ``run_worker_async(concurrency=500)``, an ``async def`` task; PostgreSQL.
- ``arq 500``: Arq's worker with ``max_jobs=500``, an ``async def`` task; Redis.
- ``bare asyncio 500``: one process makes the calls itself, 500 at once on one event loop,
  with the same client: what the machine, the server and the client allow without any queue.

Every job is enqueued, through the system's own client, before the worker starts. The peers run
in their own virtualenvs (``benchmarks/.venv-peers`` from ``requirements-peers.txt``, and
``benchmarks/.venv-arq`` from ``requirements-arq.txt``: Arq needs redis<6, Celery redis>=6.4),
created on the first run.

    python benchmarks/bench_slow_calls.py --pg-url postgres://postgres@127.0.0.1:5432/jg_slow
    python benchmarks/bench_slow_calls.py --jobs 2000 --runs 1 --modes "jobguard async 500,arq 500"

The table shows, per mode, the median of ``--runs`` runs (interleaved, one run of each mode per
round): jobs/s (first start to last finish), its share of the bound (slots / delay, per
process), p50 and p99 of the end-to-end latency (enqueue to finish, the enqueue time counted
from the worker's first start at the earliest, so the worker's start-up is left out: with a
backlog this is mostly the wait in the queue) and of the run latency (start to finish as the
system records it: the call plus the worker's own cost), the CPU per job of the worker's process
tree (``/proc``, start-up included), the most connections the worker held at once to its store
(PostgreSQL: ``pg_stat_activity``; Redis: ``CLIENT LIST`` on the broker's database), sampled
every 0.1 s, and the tree's peak RSS. Each run checks that every job succeeded exactly once.
Results also go to ``benchmarks/results/slow-calls-<UTC time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import pickle
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
sys.path.insert(0, str(ROOT))

from benchmarks._common import conninfo  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Mode:
    system: str  # jobguard, celery, procrastinate or arq
    slots: int  # jobs in flight at once
    flags: tuple[str, ...] = ()  # the worker's command-line flags (jobguard, Celery)


MODES: dict[str, Mode] = {
    "jobguard async 500": Mode("jobguard", 500, ("--async-slots", "500")),
    "jobguard threads 8": Mode("jobguard", 8, ("--concurrency", "8")),
    "jobguard threads 64": Mode("jobguard", 64, ("--concurrency", "64")),
    "celery gevent 500": Mode("celery", 500, ("--pool", "gevent", "--concurrency", "500")),
    "celery threads 64": Mode("celery", 64, ("--pool", "threads", "--concurrency", "64")),
    "procrastinate 500": Mode("procrastinate", 500),
    "arq 500": Mode("arq", 500),
    # No queue: the calls alone, 500 at once on one event loop (what this machine allows).
    "bare asyncio 500": Mode("bare", 500),
}
SAMPLE_SECONDS = 0.1
#: A worker that finishes no job for this long (after its start-up allowance) has stalled.
STALL_SECONDS = 60.0
STARTUP_SECONDS = 30.0
HARNESS = "jg-slow-harness"  # the client name of the harness's own Redis connections
TICKS = os.sysconf("SC_CLK_TCK")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("JOBGUARD_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/jg_slow"),
        help="PostgreSQL database of jobguard (created and migrated if missing); Procrastinate's is "
        "the same name with _procrastinate",
    )
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379", help="Redis server of Celery and Arq"
    )
    parser.add_argument(
        "--redis-dbs",
        default="8,9,10",
        help="Redis databases: Celery's broker, Celery's run records, Arq (flushed before each run)",
    )
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per run (default 10,000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per mode; the median is reported")
    parser.add_argument("--delay", type=float, default=0.1, help="seconds the server waits before answering")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)} (default all)"
    )
    parser.add_argument("--skip-install", action="store_true", help="use the peers' virtualenvs as they are")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default="",
        help="sample each worker with py-spy (from benchmarks/.venv-peers) into DIR/<mode>-<round>.txt "
        "(collapsed stacks per thread, for flamegraph.pl or speedscope); it costs the worker some CPU",
    )
    parser.add_argument("--no-save", action="store_true", help="print only; write no JSON")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the server process
    args = parser.parse_args()
    if args.jobs < 1 or args.runs < 1 or args.delay <= 0:
        parser.error("--jobs and --runs must be at least 1, --delay above 0")
    try:
        args.redis_dbs = [int(db) for db in args.redis_dbs.split(",")]
    except ValueError:
        parser.error("--redis-dbs takes three integers, comma-separated")
    if len(args.redis_dbs) != 3:
        parser.error("--redis-dbs takes three integers, comma-separated")
    return args


# -- the slow server (its own process) -------------------------------------------------------


def serve(port: int, delay: float) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(delay)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", port, backlog=4096)
        print("serving", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- /proc -----------------------------------------------------------------------------------


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants."""
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(
                    Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                continue
    tree = [root]
    for pid in tree:
        tree.extend(child for child, parent in parents.items() if parent == pid)
    return tree


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


# -- the systems -----------------------------------------------------------------------------


@dataclasses.dataclass
class Record:
    """One job as its store tells it: enqueued, started, finished (epoch seconds), runs, succeeded."""

    enqueued: float
    started: float
    finished: float
    runs: int = 1
    succeeded: bool = True


class Target:
    """One system: its store, how to reset it, enqueue, start a worker and read the jobs back."""

    def __init__(self, args: argparse.Namespace, python: str) -> None:
        self.args = args
        self.python = python

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        return env

    def driver(self, *args: str) -> list[str]:
        return [self.python, "-m", "benchmarks.drivers.slow_calls", *args]

    def run_driver(self, *args: str) -> None:
        proc = subprocess.run(self.driver(*args), cwd=ROOT, env=self.env(), capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-3000:]}")

    def prepare(self) -> None:
        """Create the store (once per command)."""

    def reset(self) -> None:
        raise NotImplementedError

    def enqueue(self, n: int, port: int) -> None:
        raise NotImplementedError

    def command(self, mode: Mode) -> list[str]:
        raise NotImplementedError

    def done(self) -> int:
        raise NotImplementedError

    def connections(self) -> int:
        raise NotImplementedError

    def records(self) -> list[Record]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class PostgresTarget(Target):
    url = ""

    def __init__(self, args: argparse.Namespace, python: str) -> None:
        super().__init__(args, python)
        self._conn: Any = None

    @property
    def dbname(self) -> str:
        return unquote(urlparse(self.url).path.lstrip("/"))

    def ensure_database(self) -> None:
        import psycopg

        admin = urlparse(self.url)._replace(path="/postgres").geturl()
        with psycopg.connect(conninfo(admin), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [self.dbname]).fetchone():
                conn.execute(f'CREATE DATABASE "{self.dbname}"')

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(conninfo(self.url), autocommit=True)
        cursor = self._conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []

    def connections(self) -> int:
        return int(
            self.query(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )[0][0]
        )

    def truncate(self, pattern: str) -> None:
        tables = [
            row[0] for row in self.query("SELECT tablename FROM pg_tables WHERE tablename LIKE %s", [pattern])
        ]
        self.query(f"TRUNCATE {', '.join(tables)} CASCADE")
        for table in tables:
            self.query(f"VACUUM ANALYZE {table}")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class JobguardTarget(PostgresTarget):
    def __init__(self, args: argparse.Namespace, python: str) -> None:
        super().__init__(args, python)
        self.url = args.pg_url

    def env(self) -> dict[str, str]:
        return super().env() | {
            "DJANGO_SETTINGS_MODULE": "benchmarks.jobguard_settings",
            "BENCH_DATABASE_URL": self.url,
        }

    def prepare(self) -> None:
        self.ensure_database()
        subprocess.run(
            [self.python, "-m", "django", "migrate", "-v", "0"],
            cwd=ROOT,
            env=self.env(),
            check=True,
            capture_output=True,
        )
        os.environ.update(
            {key: value for key, value in self.env().items() if key.startswith(("DJANGO", "BENCH"))}
        )
        import django

        django.setup()

    def reset(self) -> None:
        self.truncate("jobguard%")

    def enqueue(self, n: int, port: int) -> None:
        from django.db import connection

        from benchmarks.jobguard_app.tasks import http_get

        http_get.bulk_enqueue([(("127.0.0.1", port, i), {}) for i in range(n)])
        connection.close()  # not one of the worker's connections

    def command(self, mode: Mode) -> list[str]:
        return [self.python, "-m", "django", "jobguard_worker", "--no-schedule", *mode.flags]

    def done(self) -> int:
        return int(
            self.query("SELECT count(*) FROM jobguard_job WHERE status IN ('succeeded', 'dead')")[0][0]
        )

    def records(self) -> list[Record]:
        rows = self.query(
            "SELECT extract(epoch FROM enqueued_at), extract(epoch FROM started_at), "
            "extract(epoch FROM finished_at), attempts + reappearances, status = 'succeeded' "
            "FROM jobguard_job"
        )
        return [Record(float(r[0]), float(r[1]), float(r[2]), int(r[3]), bool(r[4])) for r in rows]


class ProcrastinateTarget(PostgresTarget):
    def __init__(self, args: argparse.Namespace, python: str) -> None:
        super().__init__(args, python)
        self.url = args.pg_url.rstrip("/") + "_procrastinate"

    def env(self) -> dict[str, str]:
        return super().env() | {"BENCH_DATABASE_URL": self.url}

    def prepare(self) -> None:
        self.ensure_database()
        if not self.query("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")[0][0]:
            self.run_driver("schema", "procrastinate")

    def reset(self) -> None:
        self.truncate("procrastinate%")

    def enqueue(self, n: int, port: int) -> None:
        self.run_driver("enqueue", "procrastinate", "--n", str(n), "--port", str(port))

    def command(self, mode: Mode) -> list[str]:
        return self.driver("worker", "procrastinate", "--concurrency", str(mode.slots))

    def done(self) -> int:
        return int(
            self.query("SELECT count(*) FROM procrastinate_jobs WHERE status IN ('succeeded', 'failed')")[0][
                0
            ]
        )

    def records(self) -> list[Record]:
        rows = self.query(
            "SELECT extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'deferred')), "
            "extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'started')), "
            "extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded')), "
            "count(*) FILTER (WHERE e.type = 'started'), j.status = 'succeeded' "
            "FROM procrastinate_jobs j LEFT JOIN procrastinate_events e ON e.job_id = j.id GROUP BY j.id"
        )
        return [Record(float(r[0]), float(r[1] or 0), float(r[2] or 0), int(r[3]), bool(r[4])) for r in rows]


class RedisTarget(Target):
    db = 0  # the broker's database: its clients are the worker's connections

    def redis(self, db: int) -> Any:
        import redis

        return redis.Redis.from_url(f"{self.args.redis_url.rstrip('/')}/{db}", client_name=HARNESS)

    def connections(self) -> int:
        clients = self.redis(self.db).client_list()
        return sum(1 for c in clients if int(c.get("db", -1)) == self.db and c.get("name") != HARNESS)


class CeleryTarget(RedisTarget):
    keys = ("jgslow:runs", "jgslow:start", "jgslow:end", "jgslow:enq")

    def __init__(self, args: argparse.Namespace, python: str) -> None:
        super().__init__(args, python)
        self.db, self.records_db = args.redis_dbs[0], args.redis_dbs[1]

    def env(self) -> dict[str, str]:
        base = self.args.redis_url.rstrip("/")
        return super().env() | {
            "BENCH_CELERY_BROKER": f"{base}/{self.db}",
            "BENCH_CELERY_RECORD": f"{base}/{self.records_db}",
        }

    def reset(self) -> None:
        self.redis(self.db).flushdb()
        self.redis(self.records_db).flushdb()

    def enqueue(self, n: int, port: int) -> None:
        self.run_driver("enqueue", "celery", "--n", str(n), "--port", str(port))

    def command(self, mode: Mode) -> list[str]:
        # Celery's own command line: it applies gevent's monkey-patching before anything imports.
        return [self.python, "-m", "celery", "-A", "benchmarks.peers.slow_celery", "worker", *mode.flags,
                "--queues", "jgslow", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "--loglevel", "WARNING"]  # fmt: skip

    def done(self) -> int:
        return int(self.redis(self.records_db).hlen(self.keys[0]))

    def records(self) -> list[Record]:
        client = self.redis(self.records_db)
        runs, start, end, enq = (client.hgetall(key) for key in self.keys)
        return [
            Record(float(enq[i]), float(start[i]), float(end[i]), int(count)) for i, count in runs.items()
        ]


class ArqTarget(RedisTarget):
    def __init__(self, args: argparse.Namespace, python: str) -> None:
        super().__init__(args, python)
        self.db = args.redis_dbs[2]

    def env(self) -> dict[str, str]:
        return super().env() | {"BENCH_ARQ_REDIS": f"{self.args.redis_url.rstrip('/')}/{self.db}"}

    def reset(self) -> None:
        self.redis(self.db).flushdb()

    def enqueue(self, n: int, port: int) -> None:
        self.run_driver("enqueue", "arq", "--n", str(n), "--port", str(port))
        self.enqueued = n

    def command(self, mode: Mode) -> list[str]:
        return self.driver("worker", "arq", "--concurrency", str(mode.slots))

    def done(self) -> int:
        # Arq takes a job off its queue (a sorted set) when it finishes it.
        return self.enqueued - int(self.redis(self.db).zcard("arq:queue"))

    def records(self) -> list[Record]:
        client = self.redis(self.db)
        keys = list(client.scan_iter(match="arq:result:*", count=1000))
        records = []
        for first in range(0, len(keys), 1000):
            for raw in client.mget(keys[first : first + 1000]):
                # Arq pickles its results; this is the benchmark's own Redis database.
                result = pickle.loads(raw)  # noqa: S301
                records.append(
                    Record(
                        result["et"] / 1000,
                        result["st"] / 1000,
                        result["ft"] / 1000,
                        int(result["t"]),
                        bool(result["s"]),
                    )
                )
        return records


class StalledError(Exception):
    """A worker stopped finishing jobs: the run is reported as failed, the others go on."""


class BareTarget(Target):
    """No queue: one process makes the calls itself, ``slots`` at once (the harness's ceiling)."""

    def __init__(self, args: argparse.Namespace, python: str) -> None:
        super().__init__(args, python)
        self.out = Path(tempfile.gettempdir()) / f"jg-slow-calls-{os.getpid()}-bare.json"

    def reset(self) -> None:
        self.out.unlink(missing_ok=True)

    def enqueue(self, n: int, port: int) -> None:
        self.n, self.port = n, port

    def command(self, mode: Mode) -> list[str]:
        args = ["--concurrency", str(mode.slots), "--n", str(self.n), "--port", str(self.port)]
        return self.driver("worker", "bare", *args, "--out", str(self.out))

    def done(self) -> int:
        return self.n if self.out.exists() else 0

    def connections(self) -> int:
        return 0

    def records(self) -> list[Record]:
        return [Record(*times) for times in json.loads(self.out.read_text())]


# -- one run ---------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile, interpolated between the two nearest (as percentile_cont does)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def start_profiler(
    args: argparse.Namespace, name: str, round_: int, pid: int
) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the worker (without pausing it) until it gets SIGINT; None if not asked for."""
    if not args.profile:
        return None
    py_spy = BENCH / ".venv-peers" / "bin" / "py-spy"
    out = Path(args.profile) / f"{name.replace(' ', '-')}-{round_ + 1}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [str(py_spy), "record", "--pid", str(pid), "--format", "raw", "--threads", "--nonblocking"]
    return subprocess.Popen(
        [*command, "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def stop_profiler(profiler: subprocess.Popen[bytes] | None) -> None:
    if profiler is not None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        profiler.wait(timeout=60)


def one_run(
    args: argparse.Namespace, name: str, target: Target, port: int, server: int, round_: int = 0
) -> dict[str, Any]:
    mode = MODES[name]
    target.reset()
    target.enqueue(args.jobs, port)
    load_before = os.getloadavg()[0]
    server_cpu = cpu_seconds([server])
    # A file, not a pipe: a worker logging more than a pipe holds would block on its next line.
    log_path = Path(tempfile.gettempdir()) / f"jg-slow-calls-{os.getpid()}-{name.replace(' ', '-')}.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            target.command(mode), cwd=ROOT, env=target.env(), stdout=log, stderr=subprocess.STDOUT
        )
    profiler = start_profiler(args, name, round_, worker.pid)
    most_connections, peak_rss, done, tree = 0, 0.0, 0, [worker.pid]
    samples, progress_at = 0, time.monotonic() + STARTUP_SECONDS  # when ``done`` last grew

    try:
        while done < args.jobs:
            if worker.poll() is not None:
                raise RuntimeError(
                    f"{name}: the worker exited: {log_path.read_text(errors='replace')[-2000:]}"
                )
            if time.monotonic() > progress_at + STALL_SECONDS:
                raise StalledError(
                    f"{name}: stalled at {done} of {args.jobs} jobs (none done for {STALL_SECONDS:.0f} s); "
                    f"its log: {log_path}"
                )
            time.sleep(SAMPLE_SECONDS)
            if samples % 10 == 0:
                tree = process_tree(worker.pid)
            samples += 1
            most_connections = max(most_connections, target.connections())
            peak_rss = max(peak_rss, rss_mib(tree))
            done, before = target.done(), done
            if done > before:
                progress_at = max(progress_at, time.monotonic())
        cpu = cpu_seconds(process_tree(worker.pid))
        server_cpu = cpu_seconds([server]) - server_cpu
    finally:
        stop_profiler(profiler)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    load_after = os.getloadavg()[0]
    log_path.unlink()
    records = target.records()
    first = min(r.started for r in records)
    e2e = [r.finished - max(r.enqueued, first) for r in records]
    run = [r.finished - r.started for r in records]
    problems = args.jobs - sum(1 for r in records if r.succeeded and r.runs == 1)
    rate = args.jobs / (max(r.finished for r in records) - first)
    return {
        "jobs_per_s": rate,
        "of_bound": rate / (mode.slots / args.delay),
        "e2e_p50_s": percentile(e2e, 0.5),
        "e2e_p99_s": percentile(e2e, 0.99),
        "run_p50_ms": percentile(run, 0.5) * 1000,
        "run_p99_ms": percentile(run, 0.99) * 1000,
        "cpu_ms_per_job": cpu / args.jobs * 1000,
        "connections": most_connections,
        "rss_mib": peak_rss,
        "server_cpu_ms_per_job": server_cpu / args.jobs * 1000,
        "problems": problems,
        "load_before": load_before,
        "load_after": load_after,
    }


COLUMNS = [
    ("jobs/s", "jobs_per_s", "{:.0f}"),
    ("of bound", "of_bound", "{:.0%}"),
    ("e2e p50 s", "e2e_p50_s", "{:.2f}"),
    ("e2e p99 s", "e2e_p99_s", "{:.2f}"),
    ("run p50 ms", "run_p50_ms", "{:.0f}"),
    ("run p99 ms", "run_p99_ms", "{:.0f}"),
    ("CPU ms/job", "cpu_ms_per_job", "{:.2f}"),
    ("conns", "connections", "{:.0f}"),
    ("RSS MiB", "rss_mib", "{:.0f}"),
    ("load 1m", "load_before", "{:.1f}"),
]


def table(medians: dict[str, dict[str, float]]) -> str:
    head = ["mode", *(title for title, _, _ in COLUMNS)]
    rows = [[mode, *(fmt.format(values[key]) for _, key, fmt in COLUMNS)] for mode, values in medians.items()]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = [" | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in [head, *rows]]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def targets_for(args: argparse.Namespace, modes: list[str]) -> dict[str, Target]:
    """One target per system among ``modes``, their virtualenvs built (once) and stores prepared."""
    from benchmarks.bench_peers import ensure_peers_venv, ensure_venv

    systems = {MODES[name].system for name in modes}
    targets: dict[str, Target] = {}
    if "jobguard" in systems:
        targets["jobguard"] = JobguardTarget(args, sys.executable)
    if systems & {"celery", "procrastinate"}:
        peers = ensure_peers_venv(args.skip_install)
        if "celery" in systems:
            targets["celery"] = CeleryTarget(args, peers)
        if "procrastinate" in systems:
            targets["procrastinate"] = ProcrastinateTarget(args, peers)
    if "bare" in systems:
        targets["bare"] = BareTarget(args, sys.executable)
    if "arq" in systems:
        arq = ensure_venv(BENCH / ".venv-arq", BENCH / "requirements-arq.txt", [], args.skip_install)
        targets["arq"] = ArqTarget(args, arq)
    for target in targets.values():
        target.prepare()
    return targets


def main() -> None:
    args = parse_args()
    if args.serve is not None:
        serve(args.serve, args.delay)
        return
    modes = [name.strip() for name in args.modes.split(",") if name.strip()]
    unknown = [name for name in modes if name not in MODES]
    if unknown or not modes:
        sys.exit(f"unknown modes {unknown}; choose from {list(MODES)}")
    targets = targets_for(args, modes)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--delay", str(args.delay)], stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "serving"
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        stalled: dict[str, int] = {}
        for round_ in range(args.runs):  # interleaved: one run of each mode per round
            for mode in modes:
                try:
                    result = one_run(args, mode, targets[MODES[mode].system], port, server.pid, round_)
                except StalledError as exc:
                    print(f"round {round_ + 1} {exc}", file=sys.stderr, flush=True)
                    stalled[mode] = stalled.get(mode, 0) + 1
                    continue
                runs[mode].append(result)
                print(
                    f"round {round_ + 1} {mode}: {result['jobs_per_s']:.0f} jobs/s, "
                    f"{result['cpu_ms_per_job']:.2f} ms CPU/job (the server's: "
                    f"{result['server_cpu_ms_per_job']:.2f}; load {result['load_before']:.1f} -> "
                    f"{result['load_after']:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait()
        for target in targets.values():
            target.close()
    medians = {
        mode: {key: statistics.median(run[key] for run in results) for _, key, _ in COLUMNS}
        for mode, results in runs.items()
        if results
    }
    print(
        f"\n{args.jobs} jobs per run, each one HTTP GET answered after {args.delay * 1000:.0f} ms; one worker"
    )
    print(f"process; medians of {args.runs} runs; bound = slots / {args.delay} s; {os.cpu_count()} CPUs\n")
    print(table(medians))
    if stalled:
        print(f"\nruns that stalled (left out of the medians): {stalled}")
    bad = {mode: [run["problems"] for run in results] for mode, results in runs.items()}
    if any(any(counts) for counts in bad.values()):
        print(f"\njobs not succeeded exactly once, per run: {bad}", file=sys.stderr)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        payload = {
            "jobs": args.jobs,
            "delay": args.delay,
            "modes": {mode: dataclasses.asdict(MODES[mode]) for mode in modes},
            "runs": runs,
            "stalled": stalled,
            "medians": medians,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }
        for name in (f"slow-calls-{stamp}.json", "slow-calls-latest.json"):
            (RESULTS / name).write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
