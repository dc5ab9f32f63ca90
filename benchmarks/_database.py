"""The benchmark database on PostgreSQL or MariaDB/MySQL: created if missing, emptied between runs.

For the benchmarks that run in the project's virtualenv (psycopg and mysqlclient installed)
and take a ``postgres://`` or ``mysql://`` URL. Also what the benchmarks that build a
PostgreSQL cluster of their own share (``bench_horizon.py``, ``bench_retention.py``): the
cluster, its tables emptied between runs, the paced enqueuer and the worker processes.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import conninfo, django_database

ROOT = Path(__file__).resolve().parent.parent


def create_if_missing(url: str) -> None:
    """Create the URL's database if the server does not have it."""
    db = django_database(url)
    if db["ENGINE"].endswith("postgresql"):
        import psycopg

        with psycopg.connect(conninfo(url.rsplit("/", 1)[0] + "/postgres"), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone():
                conn.execute(f'CREATE DATABASE "{db["NAME"]}"')
        return
    import MySQLdb

    conn = MySQLdb.connect(
        host=db["HOST"] or "127.0.0.1", port=int(db["PORT"] or 3306), user=db["USER"], passwd=db["PASSWORD"]
    )
    try:
        # utf8mb4 and exact keys, as docs/how-to/choose-a-database.md asks.
        conn.cursor().execute(
            f"CREATE DATABASE IF NOT EXISTS `{db['NAME']}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )
    finally:
        conn.close()


def setup_django(url: str, **variables: str) -> dict[str, str]:
    """Point this process at ``url`` through ``benchmarks.jobguard_settings`` (with ``variables``
    set too), create the database if missing, set Django up and migrate.

    Returns the environment, for the worker processes the benchmark starts.
    """
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="benchmarks.jobguard_settings",
        BENCH_DATABASE_URL=url,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),
        **variables,
    )
    os.environ.update(env)
    create_if_missing(url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return env


def empty(tables: Sequence[str]) -> None:
    """Delete every row of ``tables`` (the default alias) and of the tables that refer to them."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
            return
        # As PostgreSQL's CASCADE: the tables whose foreign keys point at these go too (a dead
        # letter's job...). TRUNCATE refuses a table others point at, so with the checks off.
        emptied = set(tables)
        while True:
            cursor.execute(
                "SELECT DISTINCT table_name FROM information_schema.key_column_usage "
                "WHERE table_schema = DATABASE() AND referenced_table_name IN "
                f"({', '.join(['%s'] * len(emptied))})",
                sorted(emptied),
            )
            referring = {row[0] for row in cursor.fetchall()} - emptied
            if not referring:
                break
            emptied |= referring
        cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        try:
            for table in sorted(emptied):
                cursor.execute(f"TRUNCATE {table}")
        finally:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


# -- a throw-away PostgreSQL cluster and the load run on it -----------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load() -> str:
    """The load averages over 1, 5 and 15 minutes."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Cluster:
    """A throw-away PostgreSQL cluster on 127.0.0.1 (run as the postgres user when run as root).

    Built from the newest ``/usr/lib/postgresql/*/bin`` into a temporary directory, on the
    first free port of ``ports``, with ``pg_stat_statements`` in the first of ``databases``;
    autovacuum looks once per benchmark minute. ``settings`` are added to its configuration.
    """

    def __init__(
        self,
        name: str,
        ports: range,
        databases: Sequence[str],
        minute_seconds: float,
        keep: bool,
        settings: Sequence[str] = (),
    ) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
        initdb = found[-1] if found else shutil.which("initdb")
        if not initdb:
            raise SystemExit("needs PostgreSQL's initdb and pg_ctl: apt-get install postgresql")
        self.bin = Path(initdb).parent
        self.root = Path(tempfile.mkdtemp(prefix=f"jobguard-{name}-"))
        self.data = self.root / "data"
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.root, user="postgres", group="postgres")
        self.port = next((port for port in ports if _free(port)), None)
        if self.port is None:
            raise SystemExit(f"no free port in {ports.start}-{ports.stop - 1}")
        self.databases = list(databases)
        self.minute_seconds = minute_seconds
        self.keep = keep
        self.settings = list(settings)

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def environ(self, dbname: str) -> dict[str, str]:
        """The variables that point ``benchmarks.jobguard_settings`` at the cluster's ``dbname``."""
        return {
            "DJANGO_SETTINGS_MODULE": "benchmarks.jobguard_settings",
            "BENCH_DATABASE_URL": self.url(dbname),
            "BENCH_REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6"),
        }

    def _run(self, *command: str) -> None:
        argv = [str(self.bin / command[0]), *command[1:]]
        if self.as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, timeout=300, check=False, cwd=self.root)
        if done.returncode:
            raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr.decode()[-2000:]}")

    def start(self) -> None:
        import psycopg

        log(f"PostgreSQL cluster in {self.root}, port {self.port}; load {load()}")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.root}'",
            f"port = {self.port}",
            "max_connections = 100",
            "shared_buffers = 512MB",
            "shared_preload_libraries = 'pg_stat_statements'",
            # The cluster dies with the run: no fsync (the figures are the queue's, not the disk's).
            "fsync = off",
            "full_page_writes = off",
            "max_wal_size = 4GB",
            # Time runs at the benchmark's minutes: autovacuum looks once per minute.
            f"autovacuum_naptime = {max(1, round(self.minute_seconds))}s",
            *self.settings,
        ]
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n".join(settings) + "\n")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "start")
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            for name in self.databases:
                conn.execute(f"CREATE DATABASE {name}")
        with psycopg.connect(self.url(self.databases[0]), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        if self.keep:
            log(f"kept the cluster's directory {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def reset(conn: Any) -> None:
    """Empty the jobguard tables (a psycopg connection in autocommit), vacuum the jobs table and
    forget ``pg_stat_statements``'s counts: each run starts from the same empty table."""
    tables = [
        row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'jobguard%%'")
    ]
    conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")
    conn.execute("VACUUM (ANALYZE) jobguard_job")
    conn.execute("SELECT pg_stat_statements_reset()")


class Enqueuer(threading.Thread):
    """``bulk_enqueue`` of no-op jobs at ``rate`` a second, paced on the monotonic clock.

    The rate is spread over ``ticks_per_second`` calls (one multi-row INSERT each).
    """

    def __init__(self, rate: float, ticks_per_second: int = 50) -> None:
        super().__init__(daemon=True)
        self.rate = rate
        self.tick = 1 / ticks_per_second
        self.stop = threading.Event()
        self.sent = 0
        self.behind = 0.0  # the most seconds the enqueuer fell behind its pace

    def run(self) -> None:
        from django.db import connection

        from benchmarks.jobguard_app.tasks import noop

        started = time.monotonic()
        try:
            while not self.stop.is_set():
                due = int((time.monotonic() - started) * self.rate)
                if due > self.sent:
                    noop.bulk_enqueue(((i,), {}) for i in range(self.sent, due))
                    self.sent = due
                self.behind = max(self.behind, time.monotonic() - started - self.sent / self.rate)
                self.stop.wait(self.tick)
        finally:
            connection.close()  # this thread's own


def start_workers(
    cluster: Cluster,
    database: str,
    count: int,
    concurrency: int,
    code: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """``count`` ``jobguard_worker`` processes on the cluster's ``database``, importing
    ``django_jobguard`` from ``code`` when given (else this tree's), with ``env`` added."""
    environ = {
        **os.environ,
        **cluster.environ(database),
        "PYTHONPATH": os.pathsep.join([*([str(code)] if code else []), str(ROOT)]),
        **(env or {}),
    }
    command = [sys.executable, "-m", "django", "jobguard_worker", "--concurrency", str(concurrency)]
    # Their logs go to the cluster's directory (a pipe nobody reads would stall them once full).
    with open(cluster.root / "workers.log", "ab") as output:
        return [
            # ``-m`` puts the working directory first on sys.path: the tree's own, then.
            subprocess.Popen(command, env=environ, cwd=code or ROOT, stdout=subprocess.DEVNULL, stderr=output)
            for _ in range(count)
        ]


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each (a graceful stop), then wait a minute for each before killing it."""
    for process in workers:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in workers:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
