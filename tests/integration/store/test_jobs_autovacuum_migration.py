"""Migration 0024: the jobs table's autovacuum settings on PostgreSQL, reversible; nothing elsewhere."""

from importlib import import_module

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)

MIGRATION = import_module("django_jobguard.migrations.0024_jobs_autovacuum")
EXPECTED = {
    "autovacuum_vacuum_scale_factor=0.02",
    "autovacuum_vacuum_threshold=1000",
    "autovacuum_analyze_scale_factor=0.02",
    "autovacuum_analyze_threshold=1000",
}


def reloptions() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'jobguard_job'::regclass")
        (options,) = cursor.fetchone()
    return set(options or [])


def run(direction: str, *, collect: bool = False) -> list[str]:
    (operation,) = MIGRATION.Migration.operations
    with connection.schema_editor(collect_sql=collect) as editor:
        getattr(operation, f"database_{direction}")("jobguard", editor, None, None)
    return list(editor.collected_sql) if collect else []


@pytest.mark.postgres
def test_the_migration_sets_the_jobs_autovacuum_settings_and_reverses_to_the_servers():
    assert EXPECTED <= reloptions(), "migrate applied 0024 to the test database"
    run("backwards")
    assert not any(option.startswith("autovacuum_") for option in reloptions())
    run("forwards")
    assert EXPECTED <= reloptions()


def test_the_migration_does_nothing_on_other_databases():
    if connection.vendor == "postgresql":
        pytest.skip("the other databases' case")
    assert run("forwards", collect=True) == []
    assert run("backwards", collect=True) == []
