"""jobguard.W069: autovacuum cannot reach the jobs table (off on the server, or on the table)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from django_jobguard import checks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def server_setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        return cursor.fetchone()[0]


def warnings() -> list[str]:
    return [m.msg for m in checks.database.check_autovacuum(databases=["default"]) if m.id == "jobguard.W069"]


def test_the_warning_follows_the_server_and_the_table():
    server_off = server_setting("autovacuum") == "off" or server_setting("track_counts") == "off"
    assert bool(warnings()) == server_off
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobguard_job SET (autovacuum_enabled = false)")
    (message,) = warnings()
    assert "jobguard_job's autovacuum_enabled = false" in message
    assert ("autovacuum = off" in message) == (server_setting("autovacuum") == "off")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobguard_job RESET (autovacuum_enabled)")
    assert bool(warnings()) == server_off


def test_check_database_runs_it_and_plain_check_does_not():
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobguard_job SET (autovacuum_enabled = off)")
    err = StringIO()
    call_command("check", "--database", "default", stdout=StringIO(), stderr=err)
    assert "jobguard.W069" in err.getvalue()
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)
    assert "jobguard.W069" not in err.getvalue()
    assert checks.database.check_autovacuum(databases=None) == []
