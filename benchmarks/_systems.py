"""The systems under test, the servers they share, and their worker processes.

Each :class:`System` knows how to reset its store, start its driver (in its own
virtualenv) and read back, from its own data store, when each job was enqueued,
started and finished and how often it ran. The orchestrator never trusts a driver's
word for a figure it can read from the database or Redis.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import WARMUP_INDEX

ROOT = Path(__file__).resolve().parent.parent

#: Worker processes per system and jobs each runs at once (threads, or async slots).
WORKER_PROCESSES = 2


CONCURRENCY = 2


#: Seconds a worker may take to import and set up before the run is declared broken.
STARTUP_TIMEOUT_SECONDS = 60


SYSTEM_LABELS = {
    "jobguard": "django-jobguard",
    "dtdb": "django-tasks-db",
    "celery_default": "Celery+Redis (default)",
    "celery": "Celery+Redis (tuned)",
    "procrastinate": "Procrastinate",
}


#: The headline configuration of django-jobguard: fencing (always on), atomic ack, metrics on.
HEADLINE = ("atomic", True, "database")


#: django-jobguard's non-atomic row of the throughput table: the same, with ``@task()``.
NON_ATOMIC = ("plain", True, "database")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A run failed its checks (a job lost, run twice, or a worker that crashed)."""


class Servers:
    """Connections to PostgreSQL and Redis for setup, reset and verification."""

    def __init__(
        self,
        pg_url: str,
        redis_url: str,
        prefix: str = "jg_bench",
        redis_dbs: tuple[int, int, int] = (5, 6, 7),
    ) -> None:
        import psycopg
        import redis

        self.prefix = prefix
        # Redis databases: django-jobguard's locks, Celery's broker (and result backend),
        # Celery's run records. Each is flushed between runs.
        self.locks_db, self.broker_db, self.records_db = redis_dbs
        self.psycopg = psycopg
        self.pg_url = pg_url.rstrip("/")
        self.redis_url = redis_url.rstrip("/")
        self._redis = redis
        self._conns: dict[str, Any] = {}

    def db(self, suffix: str) -> str:
        """The name of one of the benchmark's databases: the prefix and ``suffix``."""
        return f"{self.prefix}{suffix}"

    def url(self, dbname: str) -> str:
        return f"{self.pg_url}/{dbname}"

    def redis_db_url(self, db: int) -> str:
        return f"{self.redis_url}/{db}"

    def redis(self, db: int) -> Any:
        return self._redis.Redis.from_url(self.redis_db_url(db))

    def conn(self, dbname: str) -> Any:
        conn = self._conns.get(dbname)
        if conn is None or conn.closed:
            conn = self.psycopg.connect(self.url(dbname), autocommit=True)
            self._conns[dbname] = conn
        return conn

    def query(self, dbname: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.conn(dbname).cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def execute(self, dbname: str, *statements: str) -> None:
        with self.conn(dbname).cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)

    def ensure_database(self, dbname: str) -> bool:
        """Create ``dbname`` if it is missing; True if it was created."""
        if self.query("postgres", "SELECT 1 FROM pg_database WHERE datname = %s", [dbname]):
            return False
        self.execute("postgres", f'CREATE DATABASE "{dbname}"')
        return True

    def table_exists(self, dbname: str, table: str) -> bool:
        return bool(self.query(dbname, "SELECT to_regclass(%s) IS NOT NULL", [table])[0][0])

    def vacuum(self, dbname: str, tables: list[str]) -> None:
        # autovacuum may be off (it is on the development machine): every run starts
        # from a vacuumed, analysed table, whichever system it is.
        self.execute(dbname, *(f"VACUUM (ANALYZE) {table}" for table in tables))

    def redis_cpu(self) -> float:
        """CPU seconds the Redis server has used so far (INFO cpu; shared by every client)."""
        info = self.redis(self.locks_db).info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(Exception):
                conn.close()
        self._conns.clear()


def _proc_stat(pid: int) -> list[Any]:
    """/proc/<pid>/stat after the command name: [state, ppid, ...], ppid as an int."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields: list[Any] = text.rsplit(")", 1)[1].split()
    fields[1] = int(fields[1])
    return fields


class BackendCpu:
    """CPU seconds of the PostgreSQL backends serving one database, over a window.

    A thread samples /proc every ``INTERVAL`` seconds for processes whose title names the
    database (``postgres: 15/main: postgres jg_bench 127.0.0.1(…) idle``) and keeps each
    one's latest user + system time. Only this database's backends count, not the rest of
    a shared server; a backend's last ``INTERVAL`` before it exits is missed.
    """

    INTERVAL = 0.1

    def __init__(self, dbname: str) -> None:
        self.marker = f" {dbname} "
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = False

    def __enter__(self) -> BackendCpu:
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL):
            self._sample()

    def _sample(self, first: bool = False) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            with contextlib.suppress(OSError, ValueError, IndexError):
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
                if not title.startswith(b"postgres: ") or self.marker.encode() not in title:
                    continue
                fields = _proc_stat(pid)
                ticks = int(fields[11]) + int(fields[12])
                if first:
                    self.first[pid] = ticks
                self.first.setdefault(pid, 0)
                self.last[pid] = ticks

    @property
    def seconds(self) -> float:
        ticks = sum(self.last[pid] - self.first.get(pid, 0) for pid in self.last)
        return ticks / os.sysconf("SC_CLK_TCK")


class ServerWork:
    """What PostgreSQL did for one database over a window: WAL, buffer reads, waits.

    Counters are read before and after (``pg_stat_wal`` and ``pg_stat_bgwriter`` are the
    whole server's, so other databases must be idle; ``pg_statio_user_tables`` is the job
    table's). A thread samples ``pg_stat_activity`` every ``INTERVAL`` seconds and counts, for
    each backend of the database that is working on a transaction, what it was doing: on the
    CPU (``active``, no wait event), a wait event (``WALSync``, ``DataFileRead``, a lock...) or
    waiting for its client in the middle of the transaction (``idle in transaction``). The shares
    say where the time of the database's work went, not only its CPU.
    """

    INTERVAL = 0.01

    _COUNTERS = (
        "SELECT w.wal_fpi, w.wal_bytes, b.buffers_backend, b.checkpoints_timed + b.checkpoints_req, "
        "coalesce(sum(t.heap_blks_read + coalesce(t.idx_blks_read, 0)), 0), "
        "coalesce(sum(t.heap_blks_hit + coalesce(t.idx_blks_hit, 0)), 0) "
        "FROM pg_stat_wal w, pg_stat_bgwriter b LEFT JOIN pg_statio_user_tables t "
        "ON t.relname = 'jobguard_job' GROUP BY 1, 2, 3, 4"
    )
    _FIELDS = ("wal_fpi", "wal_bytes", "backend_writes", "checkpoints", "blocks_read", "blocks_hit")

    def __init__(self, servers: Servers, dbname: str) -> None:
        self.servers = servers
        self.dbname = dbname
        self.waits: collections.Counter[str] = collections.Counter()
        self.delta: dict[str, float] = {}
        self._before: tuple[Any, ...] = ()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _counters(self) -> tuple[Any, ...]:
        # An autocommit statement is a transaction of its own: it reads fresh statistics.
        return self.servers.query(self.dbname, self._COUNTERS)[0]

    def __enter__(self) -> ServerWork:
        self._before = self._counters()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        # Backends report their table counters as they exit; the workers' have by now.
        after = self._counters()
        pairs = zip(self._FIELDS, after, self._before, strict=True)
        self.delta = {name: float(a) - float(b) for name, a, b in pairs}

    def _run(self) -> None:
        # A connection of its own: the main thread's (Servers.conn) is not shared across threads.
        conn = self.servers.psycopg.connect(self.servers.url(self.dbname), autocommit=True)
        try:
            query = (
                "SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                "WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
            while not self._stop.wait(self.INTERVAL):
                for state, kind, event in conn.execute(query, [self.dbname]).fetchall():
                    category = self.category(state, kind, event)
                    if category is not None:
                        self.waits[category] += 1
        finally:
            conn.close()

    def per_job(self, jobs: int) -> dict[str, float]:
        """Per job: WAL bytes and full-page images, blocks read and found, writes by backends."""
        d = self.delta
        return {
            "wal_bytes_per_job": d["wal_bytes"] / jobs,
            "wal_fpi_per_job": d["wal_fpi"] / jobs,
            "blocks_read_per_job": d["blocks_read"] / jobs,
            "blocks_hit_per_job": d["blocks_hit"] / jobs,
            "backend_writes_per_job": d["backend_writes"] / jobs,
            "checkpoints": d["checkpoints"],
        }

    #: What a sampled backend was doing, in the categories the report shows.
    CATEGORIES = ("cpu", "wal", "data_io", "lock", "client", "other")

    @staticmethod
    def category(state: str | None, kind: str | None, event: str | None) -> str | None:
        """What a sampled backend was doing; None when idle outside a transaction (no work)."""
        if state == "idle":
            return None  # a connection with nothing to do (a listener, a heartbeat between beats)
        if state == "idle in transaction" or kind == "Client":
            return "client"  # inside a transaction, the worker has the next move
        if state != "active":
            return "other"
        if event is None:
            return "cpu"
        if event.startswith("WAL"):  # IO: WALSync / WALWrite, LWLock: WALWrite / WALInsert
            return "wal"
        if kind == "IO":
            return "data_io"
        if kind in ("Lock", "LWLock"):
            return "lock"
        return "other"

    def wait_shares(self) -> dict[str, float]:
        """Each category's share of the backends' samples (``wait_<category>``), 0 when unseen."""
        total = sum(self.waits.values()) or 1
        return {f"wait_{name}": self.waits[name] / total for name in self.CATEGORIES}


@dataclasses.dataclass
class Record:
    """What the data store says about one job after a run."""

    index: int
    enqueued_at: float | None
    started_at: float | None
    finished_at: float | None
    runs: int
    succeeded: bool


class System:
    """One queue under test: how to reset it, run its driver, and read back its jobs."""

    key = ""
    driver = ""
    burst = True  # the worker can drain and exit by itself
    dbname: str | None = None  # its PostgreSQL database, if it has one

    def __init__(self, servers: Servers, python: str) -> None:
        self.servers = servers
        self.python = python
        #: The working directory of its processes (``python -m`` puts it first on sys.path).
        self.cwd = ROOT

    @property
    def label(self) -> str:
        return SYSTEM_LABELS[self.key]

    def env(self, **overrides: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        env.pop("DJANGO_SETTINGS_MODULE", None)
        # Compiled modules are cached as a deployment's are: with PYTHONDONTWRITEBYTECODE set,
        # every worker would compile the package from source again, and a larger tree would
        # read as slower per job.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(self.base_env())
        env.update(overrides)
        return env

    def base_env(self) -> dict[str, str]:
        return {}

    def worker_args(self) -> list[str]:
        """Extra arguments of this system's worker driver."""
        return []

    def command(self, *args: str) -> list[str]:
        return [self.python, "-m", f"benchmarks.drivers.{self.driver}", *args]

    def setup(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def done(self) -> int:
        """Jobs completed so far (cheap; polled while idle workers run)."""
        raise NotImplementedError

    def records(self) -> list[Record]:
        raise NotImplementedError

    def settings(self) -> str:
        """The peer's settings, stated in the report."""
        raise NotImplementedError

    def describe(self, indexes: list[int]) -> str:
        """What the store holds about these jobs, for an error message."""
        return ", ".join(str(r) for r in self.records() if r.index in indexes)


class Jobguard(System):
    key = "jobguard"
    driver = "jobguard"

    def __init__(self, servers: Servers, python: str, suffix: str = "", code: Path | None = None) -> None:
        super().__init__(servers, python)
        self.dbname = servers.db(suffix)
        self.watermark = 0  # jobs at or below this id are backlog, not part of any run
        self.variant, self.metrics, self.lock_backend = HEADLINE
        #: Extra JOBGUARD settings (JSON) and worker flags of this system's runs.
        self.extra_settings = ""
        #: Extra environment of its processes (``BENCH_KEYED=1`` imports the limited task).
        self.extra_env: dict[str, str] = {}
        self.concurrency: int | None = CONCURRENCY
        self.queues = ""
        self.max_jobs = 0  # per worker process
        # A directory holding only ``django_jobguard`` (a link into another commit's
        # worktree): first on sys.path, so the harness of this tree drives that code.
        self.code = code
        if code is not None:
            self.cwd = code

    def env(self, **overrides: str) -> dict[str, str]:
        env = super().env(**overrides)
        if self.code is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.code), env["PYTHONPATH"]])
        return env

    def configure(self, variant: str, metrics: bool, lock_backend: str) -> Jobguard:
        self.variant, self.metrics, self.lock_backend = variant, metrics, lock_backend
        return self

    def base_env(self) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": "benchmarks.jobguard_settings",
            "BENCH_DATABASE_URL": self.servers.url(self.dbname),
            "BENCH_REDIS_URL": self.servers.redis_db_url(self.servers.locks_db),
            "BENCH_LOCK_BACKEND": self.lock_backend,
            "BENCH_METRICS": "1" if self.metrics else "0",
            "BENCH_JOBGUARD": _merged_json(os.environ.get("BENCH_JOBGUARD", ""), self.extra_settings),
            "BENCH_DB_OPTIONS": os.environ.get("BENCH_DB_OPTIONS", ""),
            **self.extra_env,
        }

    def setup(self) -> None:
        self.servers.ensure_database(self.dbname)
        run_checked([self.python, "-m", "django", "migrate", "--verbosity", "0"], self.env(), cwd=self.cwd)

    def reset(self) -> None:
        tables = [
            row[0]
            for row in self.servers.query(
                self.dbname, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'jobguard%%'"
            )
        ]
        others = [t for t in tables if t != "jobguard_job"]
        if self.watermark:
            self.servers.execute(
                self.dbname,
                f"TRUNCATE {', '.join(others)}",
                f"DELETE FROM jobguard_job WHERE id > {int(self.watermark)}",
            )
        else:
            self.servers.execute(self.dbname, f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")
        self.servers.vacuum(self.dbname, tables)
        self.servers.redis(self.servers.locks_db).flushdb()

    def done(self) -> int:
        return int(
            self.servers.query(
                self.dbname,
                "SELECT count(*) FROM jobguard_job WHERE id > %s AND status = 'succeeded'",
                [self.watermark],
            )[0][0]
        )

    def records(self) -> list[Record]:
        rows = self.servers.query(
            self.dbname,
            "SELECT (args->>0)::bigint, extract(epoch FROM enqueued_at), extract(epoch FROM started_at), "
            "extract(epoch FROM finished_at), attempts + reappearances, "
            "status = 'succeeded' AND reappearances = 0 AND lock_contentions = 0 "
            "FROM jobguard_job WHERE id > %s",
            [self.watermark],
        )
        return [Record(int(r[0]), _f(r[1]), _f(r[2]), _f(r[3]), int(r[4]), bool(r[5])) for r in rows]

    def describe(self, indexes: list[int]) -> str:
        rows = self.servers.query(
            self.dbname,
            "SELECT id, status, attempts, reappearances, lock_contentions, last_error FROM jobguard_job "
            "WHERE id > %s AND (args->>0)::bigint = ANY(%s)",
            [self.watermark, indexes],
        )
        return "; ".join(
            f"job {r[0]}: status={r[1]} attempts={r[2]} reappearances={r[3]} lock_contentions={r[4]} "
            f"last_error={r[5][:200]!r}"
            for r in rows
        )

    def settings(self) -> str:
        return (
            f"{WORKER_PROCESSES} x `manage.py jobguard_worker --concurrency {CONCURRENCY} --burst` "
            "(threads; adaptive batch: 2 x concurrency, up to 64 for short jobs; "
            "LISTEN/NOTIFY with 1 s poll fallback; package defaults); "
            "headline task `@task(atomic=True)`, fencing always on, metrics on (prometheus_client installed)"
            + "".join(
                f"; EXPERIMENT {name}={os.environ[name]}"
                for name in ("BENCH_JOBGUARD", "BENCH_DB_OPTIONS")
                if os.environ.get(name)
            )
        )


class DjangoTasksDB(System):
    key = "dtdb"
    driver = "dtdb"

    table = "django_tasks_database_dbtaskresult"

    def __init__(self, servers: Servers, python: str) -> None:
        super().__init__(servers, python)
        self.dbname = servers.db("_dtdb")

    def base_env(self) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": "benchmarks.peers.dtdb_settings",
            "BENCH_DATABASE_URL": self.servers.url(self.dbname),
        }

    def setup(self) -> None:
        self.servers.ensure_database(self.dbname)
        run_checked([self.python, "-m", "django", "migrate", "--verbosity", "0"], self.env())

    def reset(self) -> None:
        self.servers.execute(self.dbname, f"TRUNCATE {self.table}")
        self.servers.vacuum(self.dbname, [self.table])

    def done(self) -> int:
        return int(
            self.servers.query(self.dbname, f"SELECT count(*) FROM {self.table} WHERE status = 'SUCCESSFUL'")[
                0
            ][0]
        )

    def records(self) -> list[Record]:
        rows = self.servers.query(
            self.dbname,
            "SELECT (args_kwargs->'args'->>0)::bigint, extract(epoch FROM enqueued_at), "
            "extract(epoch FROM started_at), extract(epoch FROM finished_at), "
            f"jsonb_array_length(worker_ids), status = 'SUCCESSFUL' FROM {self.table}",
        )
        return [Record(int(r[0]), _f(r[1]), _f(r[2]), _f(r[3]), int(r[4]), bool(r[5])) for r in rows]

    def settings(self) -> str:
        return (
            f"{WORKER_PROCESSES} x `manage.py db_worker --batch --no-startup-delay --verbosity 0` "
            "(one task at a time per process: it has no concurrency option; 1 s poll interval, "
            "its default); `@task()` from django-tasks with the `DatabaseBackend`"
        )


class CeleryRedis(System):
    key = "celery"
    driver = "celery_driver"
    burst = False
    keys = ("jgbench:runs", "jgbench:start", "jgbench:end", "jgbench:enq")

    def base_env(self) -> dict[str, str]:
        return {
            "BENCH_CELERY_BROKER": self.servers.redis_db_url(self.servers.broker_db),
            "BENCH_CELERY_RECORD": self.servers.redis_db_url(self.servers.records_db),
        }

    def setup(self) -> None:
        info = self.servers.redis(self.servers.broker_db).config_get("save")
        aof = self.servers.redis(self.servers.broker_db).config_get("appendonly")
        self.persistence = f"save={info.get('save', '')!r} appendonly={aof.get('appendonly', '')}"

    def reset(self) -> None:
        self.servers.redis(self.servers.broker_db).flushdb()
        self.servers.redis(self.servers.records_db).flushdb()

    def done(self) -> int:
        return int(self.servers.redis(self.servers.records_db).hlen(self.keys[0]))

    def records(self) -> list[Record]:
        client = self.servers.redis(self.servers.records_db)
        runs, start, end, enq = (client.hgetall(key) for key in self.keys)
        return [
            Record(
                int(i),
                _f(enq.get(i)),
                _f(start.get(i)),
                _f(end.get(i)),
                int(count),
                True,
            )
            for i, count in runs.items()
        ]

    def settings(self) -> str:
        return (
            f"{WORKER_PROCESSES} x `celery worker --pool threads --concurrency {CONCURRENCY} "
            "--without-gossip --without-mingle --without-heartbeat --loglevel WARNING`; "
            "`task_acks_late=True`, prefetch multiplier 4 (default), `task_ignore_result=True`, "
            f"Redis broker (db {self.servers.broker_db}) visibility timeout 3600 s; each task records its "
            f"run with one Lua call to Redis db {self.servers.records_db} (the check that it ran exactly "
            "once); Redis persistence: "
            f"{getattr(self, 'persistence', '?')}"
        )


class CeleryDefault(CeleryRedis):
    """Celery as users run it: prefork, one child per core, results stored in Redis."""

    key = "celery_default"

    def base_env(self) -> dict[str, str]:
        return super().base_env() | {"BENCH_CELERY_MODE": "default"}

    def worker_args(self) -> list[str]:
        return ["--pool", "prefork"]

    def settings(self) -> str:
        return (
            f"{WORKER_PROCESSES} x `celery worker --pool prefork --concurrency {CONCURRENCY} "
            "--loglevel WARNING` (Celery's default flags: gossip, mingle, heartbeat); "
            "`task_acks_late=True`, prefetch multiplier 4 (default), Redis result backend "
            f"(db {self.servers.broker_db}, results stored); Redis broker visibility timeout 3600 s; the "
            "same Lua run record as the tuned row; worker CPU includes the pool's children"
        )


class Procrastinate(System):
    key = "procrastinate"
    driver = "procrastinate_driver"

    def __init__(self, servers: Servers, python: str) -> None:
        super().__init__(servers, python)
        self.dbname = servers.db("_procrastinate")

    def base_env(self) -> dict[str, str]:
        return {"BENCH_DATABASE_URL": self.servers.url(self.dbname)}

    def setup(self) -> None:
        self.servers.ensure_database(self.dbname)
        if not self.servers.table_exists(self.dbname, "procrastinate_jobs"):
            run_checked(self.command("schema"), self.env())

    def reset(self) -> None:
        tables = [
            row[0]
            for row in self.servers.query(
                self.dbname, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'procrastinate%%'"
            )
        ]
        self.servers.execute(self.dbname, f"TRUNCATE {', '.join(tables)} CASCADE")
        self.servers.vacuum(self.dbname, tables)

    def done(self) -> int:
        return int(
            self.servers.query(
                self.dbname, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            )[0][0]
        )

    def records(self) -> list[Record]:
        rows = self.servers.query(
            self.dbname,
            "SELECT (j.args->>'i')::bigint, "
            "extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'deferred')), "
            "extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'started')), "
            "extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded')), "
            "count(*) FILTER (WHERE e.type = 'started'), j.status = 'succeeded' "
            "FROM procrastinate_jobs j LEFT JOIN procrastinate_events e ON e.job_id = j.id GROUP BY j.id",
        )
        return [Record(int(r[0]), _f(r[1]), _f(r[2]), _f(r[3]), int(r[4]), bool(r[5])) for r in rows]

    def settings(self) -> str:
        return (
            f"{WORKER_PROCESSES} x `run_worker_async(concurrency={CONCURRENCY}, listen_notify=True, "
            "wait=False)` (asyncio); an `async def` no-op task (its best case); PsycopgConnector"
        )


def _f(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)


def _merged_json(*texts: str) -> str:
    merged: dict[str, Any] = {}
    for text in texts:
        merged.update(json.loads(text or "{}"))
    return json.dumps(merged) if merged else ""


def run_checked(command: list[str], env: dict[str, str], timeout: float = 600, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


class Workers:
    """The worker processes of one run, each reporting its CPU time to a JSON file."""

    def __init__(
        self,
        system: System,
        workdir: Path,
        *,
        burst: bool,
        profile: bool = False,
        wrap: Callable[[int], list[str]] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.system = system
        #: Environment overrides of the worker processes (a counting proxy's URL, for instance).
        self.env_overrides = env or {}
        self.workdir = workdir
        self.burst = burst
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        self.logs: list[Path] = []
        self.profiles: list[Path] = []
        self.profile = profile
        # A command prefix per worker index (a sampling profiler, for instance).
        self.wrap = wrap

    def start(self) -> None:
        """Start the processes, wait until each has set up, then let them all go at once."""
        go = self.workdir / "go"
        go.unlink(missing_ok=True)
        ready: list[Path] = []
        for index in range(WORKER_PROCESSES):
            out = self.workdir / f"{self.system.key}-worker{index}.json"
            log_path = self.workdir / f"{self.system.key}-worker{index}.log"
            ready.append(self.workdir / f"{self.system.key}-worker{index}.ready")
            for path in (out, ready[-1]):
                path.unlink(missing_ok=True)
            concurrency = getattr(self.system, "concurrency", CONCURRENCY)
            # 0: the worker's own default (no --concurrency flag).
            args = ["worker", "--index", str(index), "--concurrency", str(concurrency or 0)]
            args += ["--out", str(out)]
            if getattr(self.system, "queues", ""):
                args += ["--queues", self.system.queues]
            if getattr(self.system, "max_jobs", 0):
                args += ["--max-jobs", str(self.system.max_jobs)]
            args += ["--ready", str(ready[-1]), "--go", str(go)]
            if self.burst and self.system.burst:
                args.append("--burst")
            args += self.system.worker_args()
            if self.profile:
                prof = self.workdir / f"{self.system.key}-worker{index}.pstats"
                args += ["--profile", str(prof)]
                self.profiles.append(prof)
            with log_path.open("wb") as handle:
                self.procs.append(
                    subprocess.Popen(
                        [*(self.wrap(index) if self.wrap else []), *self.system.command(*args)],
                        cwd=self.system.cwd,
                        env=self.system.env(**self.env_overrides),
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                    )
                )
            self.outs.append(out)
            self.logs.append(log_path)
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while not all(path.exists() for path in ready):
            if time.monotonic() > deadline or any(proc.poll() is not None for proc in self.procs):
                self.kill()
                tail = "\n".join(p.read_text(errors="replace")[-2000:] for p in self.logs)
                raise BenchError(f"{self.system.label}: workers did not start:\n{tail}")
            time.sleep(0.02)
        go.touch()

    def wait_exit(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise BenchError(f"{self.system.label}: a worker did not finish in {timeout:.0f}s") from None
        self.check_exit()

    def stop(self, timeout: float = 30) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        self.wait_exit(timeout)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def check_exit(self) -> None:
        for proc, log_path in zip(self.procs, self.logs, strict=True):
            if proc.returncode not in (0, -signal.SIGTERM):
                tail = log_path.read_text(errors="replace")[-3000:]
                raise BenchError(f"{self.system.label}: worker exited {proc.returncode}:\n{tail}")

    def rss_kib(self) -> list[int]:
        """Each worker process's resident set size at the end of its run (KiB)."""
        return [int(json.loads(out.read_text()).get("rss_kib", 0)) for out in self.outs if out.exists()]

    def cpu_seconds(self) -> float:
        total = 0.0
        for out, log_path in zip(self.outs, self.logs, strict=True):
            if not out.exists():
                tail = log_path.read_text(errors="replace")[-3000:]
                raise BenchError(f"{self.system.label}: a worker wrote no CPU report:\n{tail}")
            total += json.loads(out.read_text())["cpu_seconds"]
        return total


def enqueue(
    system: System,
    workdir: Path,
    n: int,
    *,
    start: int = 0,
    mode: str = "single",
    rate: float = 0.0,
    profile: str = "",
) -> dict[str, Any]:
    """Enqueue jobs ``start..start+n-1`` from a client process of the system's own virtualenv."""
    out = workdir / f"{system.key}-enqueue.json"
    out.unlink(missing_ok=True)
    args = ["enqueue", "--n", str(n), "--start", str(start), "--mode", mode, "--out", str(out)]
    if rate:
        args += ["--rate", str(rate)]
    if profile:
        args += ["--profile", profile]
    if isinstance(system, Jobguard):
        args += ["--variant", system.variant]
    run_checked(system.command(*args), system.env(), timeout=max(600, n / 20), cwd=system.cwd)
    return dict(json.loads(out.read_text()))


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")


def verify(system: System, n: int) -> list[Record]:
    """Every job 0..n-1 succeeded and ran exactly once; return their records (warm-ups left out)."""
    records = [r for r in system.records() if r.index < WARMUP_INDEX]
    seen = collections.Counter(r.index for r in records)
    missing = n - len(seen)
    duplicated = [i for i, count in seen.items() if count > 1]
    ran_twice = [r.index for r in records if r.runs != 1]
    failed = [r.index for r in records if not r.succeeded]
    if missing or duplicated or ran_twice or failed or set(seen) != set(range(n)):
        raise BenchError(
            f"{system.label}: {missing} jobs missing, {len(duplicated)} duplicated rows, "
            f"{len(ran_twice)} run more than once (e.g. {ran_twice[:5]}), {len(failed)} not succeeded "
            f"(e.g. {system.describe((ran_twice + failed)[:3])})"
        )
    return records
