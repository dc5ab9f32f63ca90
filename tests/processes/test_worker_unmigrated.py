"""A worker started before ``migrate`` says to run it and exits; it does not wait for ever.

Without the job tables every statement fails with "no such table" (or "relation does not
exist"), which a worker would otherwise read as the database being away and retry for ever,
``--burst`` included. It exits with EXIT_NOT_MIGRATED instead, so a supervisor restarts it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_jobguard.worker import EXIT_NOT_MIGRATED
from tests.conftest import ON_POSTGRES, ON_SERVER_DB

pytestmark = pytest.mark.processes

MIGRATE = "run `python manage.py migrate`"
on_sqlite = pytest.mark.skipif(ON_SERVER_DB, reason="an SQLite file of its own (the server test is below)")


def output(result) -> str:
    return result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")


@on_sqlite
def test_a_burst_worker_on_an_unmigrated_database_says_to_migrate_and_exits(workers, tmp_path: Path) -> None:
    result = workers.burst(env={"JOBGUARD_TEST_DB_NAME": str(tmp_path / "unmigrated.sqlite3")}, timeout=120)
    text = output(result)
    assert result.returncode == EXIT_NOT_MIGRATED, text
    assert "schema_missing" in text and "lacks django_jobguard's tables jobguard_" in text, text
    assert MIGRATE in text, text
    assert "database_unreachable" not in text, text


@on_sqlite
def test_a_long_running_worker_on_an_unmigrated_database_exits_too(workers, tmp_path: Path) -> None:
    proc = workers.start(env={"JOBGUARD_TEST_DB_NAME": str(tmp_path / "unmigrated.sqlite3")})
    assert proc.wait(timeout=120) == EXIT_NOT_MIGRATED, workers.log(proc)[-3000:]
    assert MIGRATE in workers.log(proc)
    assert "worker_started" not in workers.log(proc)


def migrated_copy(tmp_path: Path) -> sqlite3.Connection:
    """A copy of the (migrated) test database, so changing it leaves the suite's own alone."""
    source = sqlite3.connect(str(connection.settings_dict["NAME"]))
    target = sqlite3.connect(str(tmp_path / "copy.sqlite3"))
    with target:
        source.backup(target)
    source.close()
    return target


@on_sqlite
@pytest.mark.django_db(transaction=True)
def test_a_worker_after_an_upgrade_whose_migrations_have_not_run_says_to_migrate(
    workers, tmp_path: Path
) -> None:
    copy = migrated_copy(tmp_path)
    with copy:
        (last,) = copy.execute(
            "SELECT name FROM django_migrations WHERE app = 'jobguard' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        copy.execute("DELETE FROM django_migrations WHERE app = 'jobguard' AND name = ?", [last])
    copy.close()
    result = workers.burst(env={"JOBGUARD_TEST_DB_NAME": str(tmp_path / "copy.sqlite3")}, timeout=120)
    text = output(result)
    assert result.returncode == EXIT_NOT_MIGRATED, text
    assert f"has not applied the migrations jobguard.{last}: {MIGRATE}" in text, text


@on_sqlite
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_job_table_goes_missing_says_to_migrate_and_exits(workers, tmp_path: Path) -> None:
    copy = migrated_copy(tmp_path)
    proc = workers.start(
        "--poll-interval", "0.2", env={"JOBGUARD_TEST_DB_NAME": str(tmp_path / "copy.sqlite3")}
    )
    workers.wait_started(proc)
    with copy:
        copy.execute("DROP TABLE jobguard_job")
    copy.close()
    assert proc.wait(timeout=120) == EXIT_NOT_MIGRATED, workers.log(proc)[-3000:]
    log = workers.log(proc)
    assert "schema_missing" in log and "lacks django_jobguard's tables jobguard_job:" in log, log[-3000:]
    assert MIGRATE in log


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database on the test's server with no table at all, dropped afterwards."""
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cursor.execute(f"CREATE DATABASE {quoted}")
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}{' WITH (FORCE)' if ON_POSTGRES else ''}")


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_on_an_unmigrated_server_database_says_to_migrate_and_exits(
    workers, empty_database: str
) -> None:
    result = workers.burst(env={"JOBGUARD_TEST_DB_NAME": empty_database}, timeout=120)
    text = output(result)
    assert result.returncode == EXIT_NOT_MIGRATED, text
    assert "lacks django_jobguard's tables jobguard_" in text and MIGRATE in text, text
