"""Fixtures shared by the suite: server markers, worker processes, a clean registry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections

# The reliability suite's options (--reliability-seed, --reliability-soak...) and fixtures.
# The test kit's fixtures (jobguard, jobguard_settings, jobguard_worker), as a project enables them.
pytest_plugins = ["tests.reliability.plugin", "django_jobguard.testing.pytest_plugin"]

ROOT = Path(__file__).resolve().parent.parent
_DATABASE_SCHEME = os.environ.get("JOBGUARD_TEST_DATABASE_URL", "").partition("://")[0]
#: The run is on PostgreSQL / on MariaDB or MySQL / on either (a database server, not SQLite).
ON_POSTGRES = _DATABASE_SCHEME in ("postgres", "postgresql")
ON_MYSQL = _DATABASE_SCHEME in ("mysql", "mariadb")
ON_SERVER_DB = ON_POSTGRES or ON_MYSQL
HAS_REDIS = bool(os.environ.get("JOBGUARD_TEST_REDIS_URL"))


def pytest_configure(config: pytest.Config) -> None:
    if ON_POSTGRES:
        # Transactional tests' cleanup deletes rows instead of truncating: see the module.
        from tests.support import pg_flush

        pg_flush.install()


@pytest.fixture(scope="session", autouse=True)
def _sqlite_json_support_known(django_db_setup: Any, django_db_blocker: Any) -> None:
    """Ask each SQLite alias once whether it supports JSONField, before any test runs.

    Django 6.0+ runs ``check``'s model checks against every alias, and on SQLite a JSONField's
    check asks the connection with a query. A test allowed only "default" (or no database)
    that runs ``check`` would then be refused the query on "jobs". The answer is cached on
    the connection's features.
    """
    with django_db_blocker.unblock():
        for alias in connections:
            if connections[alias].vendor == "sqlite":
                try:
                    connections[alias].features.supports_json_field  # noqa: B018 (cached on first read)
                except DatabaseError:
                    pass


@pytest.fixture
def truncated_after() -> None:
    """For a transactional test that writes a million rows: its cleanup truncates the tables
    (on PostgreSQL; elsewhere the cleanup already deletes). Rolled back or deleted, the rows
    would stay behind as dead tuples for every later test to read past."""
    if ON_POSTGRES:
        from tests.support import pg_flush

        pg_flush.truncate_next_flush()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    pg_url = "JOBGUARD_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobguard"
    my_url = "JOBGUARD_TEST_DATABASE_URL=mysql://root@127.0.0.1:3306/jobguard"
    pg_reason = f"needs PostgreSQL: set {pg_url}"
    if ON_MYSQL:
        pg_reason = "PostgreSQL only (this run is on MariaDB/MySQL)"
    skip_pg = pytest.mark.skip(reason=pg_reason)
    skip_mysql = pytest.mark.skip(reason=f"needs MariaDB or MySQL: set {my_url}")
    skip_server = pytest.mark.skip(reason=f"needs a database server: set {pg_url} (or {my_url})")
    skip_redis = pytest.mark.skip(reason="needs Redis: set JOBGUARD_TEST_REDIS_URL=redis://127.0.0.1:6379/0")
    for item in items:
        if "postgres" in item.keywords and not ON_POSTGRES:
            item.add_marker(skip_pg)
        if "mysql" in item.keywords and not ON_MYSQL:
            item.add_marker(skip_mysql)
        if "server_db" in item.keywords and not ON_SERVER_DB:
            item.add_marker(skip_server)
        if "redis" in item.keywords and not HAS_REDIS:
            item.add_marker(skip_redis)


def worker_env(**extra: str) -> dict[str, str]:
    """Environment for a worker subprocess: same settings, the test database."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["JOBGUARD_TEST_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def worker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", "jobguard_worker", *args]


class WorkerProcesses:
    """Starts real ``manage.py jobguard_worker`` processes and cleans them up.

    Each process logs (at INFO) to its own file, readable with :meth:`log`.
    """

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: dict[int, Path] = {}

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        path = self.log_dir / f"worker-{len(self.procs)}.log"
        with path.open("wb") as log:
            proc = subprocess.Popen(
                worker_command(*args),
                cwd=ROOT,
                env=worker_env(JOBGUARD_TEST_LOG_LEVEL="INFO", **(env or {})),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self._logs[proc.pid] = path
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self._logs[proc.pid].read_text(errors="replace")

    def wait_started(self, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
        # Generous: four workers starting at once on a loaded 2-core machine took over 30 s.
        wait_for(lambda: "worker_started" in self.log(proc), timeout, message="the worker to start")

    def burst(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            worker_command("--burst", *args),
            cwd=ROOT,
            env=worker_env(**(env or {})),
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[WorkerProcesses]:
    pool = WorkerProcesses(tmp_path)
    yield pool
    pool.stop_all()


def statuses(jobs: list[Any]) -> list[str]:
    """Each job's status as the database holds it now, in the order of ``jobs``."""
    from django_jobguard.models import Job

    by_id = dict(Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("pk", "status"))
    return [by_id[job.pk] for job in jobs]


def wait_for(
    predicate: Callable[[], bool], timeout: float = 60, interval: float = 0.1, message: str = ""
) -> None:
    """Poll ``predicate`` until true; fail the test with ``message`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for: {message or predicate}")
