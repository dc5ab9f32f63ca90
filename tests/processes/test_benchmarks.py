"""The benchmark suite runs end to end against real PostgreSQL, Redis and worker processes.

Only django-jobguard, a few dozen jobs, one run: this checks that ``make bench`` still
works and that its exactly-once check passes, not how fast anything is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.processes, pytest.mark.slow]


@pytest.fixture
def servers() -> Iterator[tuple[str, str, str]]:
    """(PostgreSQL server URL, Redis server URL, database prefix); the databases are dropped after."""
    pg = urlparse(os.environ["JOBGUARD_TEST_DATABASE_URL"])
    redis = urlparse(os.environ["JOBGUARD_TEST_REDIS_URL"])
    pg_server = f"{pg.scheme}://{pg.netloc}"
    prefix = f"{pg.path.lstrip('/') or 'jobguard'}_bench"
    yield pg_server, f"{redis.scheme}://{redis.netloc}", prefix
    with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{prefix}" WITH (FORCE)')


def test_bench_drains_jobs_and_verifies_each_ran_once(servers: tuple[str, str, str], tmp_path: Path) -> None:
    pg_server, redis_server, prefix = servers
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_peers.py"),
        "--quick",
        "--runs", "1",
        "--workloads", "throughput",
        "--systems", "jobguard",
        "--sizes", "40",
        "--warmup", "0",
        "--pg-url", pg_server,
        "--redis-url", redis_server,
        "--db-prefix", prefix,
        "--results-dir", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "### Throughput: 40 no-op jobs, 2 worker processes x 2" in proc.stdout
    data = json.loads((tmp_path / "latest.json").read_text())
    assert data["errors"] == []
    figures = {(r["metric"]): r for r in data["results"] if r["system"] == "jobguard"}
    assert figures["processing_rate"]["median"] > 0
    assert figures["worker_cpu_ms_per_job"]["median"] > 0
    assert data["meta"]["postgresql"]


def test_slow_calls_bench_drains_its_jobs_and_prints_its_table(servers: tuple[str, str, str]) -> None:
    # The modes that need no peer virtualenv: jobguard's async executor, and the calls alone.
    pg_server, _, prefix = servers
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_slow_calls.py"),
        "--jobs", "40",
        "--runs", "1",
        "--modes", "jobguard async 500,bare asyncio 500",
        "--pg-url", f"{pg_server}/{prefix}",
        "--no-save",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split(" | ")[0].strip(): line for line in proc.stdout.splitlines() if " | " in line}
    assert set(rows) == {"mode", "jobguard async 500", "bare asyncio 500"}, proc.stdout
    assert "not succeeded exactly once" not in proc.stderr
