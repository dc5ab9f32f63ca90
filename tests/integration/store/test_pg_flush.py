"""The suite's own cleanup on PostgreSQL (tests/support/pg_flush.py): DELETEs, with TRUNCATEs
often enough that dead rows never pile up on a server without autovacuum."""

from __future__ import annotations

import pytest
from django.core.management.color import no_style
from django.db import connection

from tests.support import pg_flush

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

TABLES = ["jobguard_job", "jobguard_deadletter"]


def flush_sql() -> str:
    return " ".join(connection.ops.sql_flush(no_style(), TABLES))


def test_a_flush_deletes_and_one_in_truncate_every_truncates():
    kinds = [flush_sql().split()[0] for _ in range(pg_flush.TRUNCATE_EVERY)]
    assert kinds.count("TRUNCATE") == 1, kinds
    assert kinds.count("DELETE") == pg_flush.TRUNCATE_EVERY - 1, kinds


def test_the_flush_after_a_big_write_truncates_once():
    # Away from the periodic TRUNCATE: neither of the next two flushes is one.
    every = pg_flush.TRUNCATE_EVERY
    while pg_flush._flushes.get(connection.alias, 0) % every in (every - 2, every - 1):
        flush_sql()
    pg_flush.truncate_next_flush(connection.alias)
    assert flush_sql().startswith("TRUNCATE")
    assert flush_sql().startswith("DELETE")
