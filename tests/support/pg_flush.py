"""A transactional test's cleanup on PostgreSQL: a DELETE of each table instead of one TRUNCATE.

After each transactional test Django empties every table (``flush``). On PostgreSQL that is one
``TRUNCATE`` of the suite's 40 tables, which gives each table and index new files: 0.6-1.35 s a
test on CI's 2-core host under load, against 0.02-0.07 s for a DELETE of each table's few rows
(the same 40 tables, interleaved, 6 rounds). The suite has about 1,200 transactional tests on
PostgreSQL. Django's MySQL and SQLite backends already flush with DELETE.

Only the test process is changed (``tests/conftest.py`` installs it): the worker processes it
starts run Django's backend as it is, and nothing they do flushes. A flush that resets sequences
or cascades keeps Django's TRUNCATE, and so does the flush after a test that wrote a million rows
(:func:`truncate_next_flush`): deleted, they would stay in the heap and the indexes as dead
tuples, and every later test would read past them until a vacuum that a busy host puts off
(4 such tests left 4 million dead job rows, 1 GB, and made the state machine test 40 times
slower later in the same run). A server may also run without autovacuum (this machine's CI
server does): every :data:`TRUNCATE_EVERY` flushes of an alias truncate, so the dead rows of
the tests between, theirs deleted and the rolled-back ones', never pile up past that many tests.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql.operations import DatabaseOperations

_truncate = DatabaseOperations.sql_flush
#: The aliases whose next flush truncates (each is cleared by that flush).
_truncate_next: set[str] = set()
#: One flush in this many truncates: about 1 s each 50 tests, against 0.02-0.07 s a DELETE.
TRUNCATE_EVERY = 50
_flushes: dict[str, int] = {}


def truncate_next_flush(alias: str = "default") -> None:
    """Make the next flush of ``alias`` a TRUNCATE: for a test that writes a big table."""
    _truncate_next.add(alias)


def _delete_each(
    self: DatabaseOperations,
    style: Any,
    tables: list[str],
    *,
    reset_sequences: bool = False,
    allow_cascade: bool = False,
) -> list[str]:
    alias = self.connection.alias
    _flushes[alias] = _flushes.get(alias, 0) + 1
    truncate = alias in _truncate_next or _flushes[alias] % TRUNCATE_EVERY == 0
    _truncate_next.discard(alias)
    if not tables or reset_sequences or allow_cascade or truncate:
        return _truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
    # flush runs the statements in one transaction and Django's foreign keys are DEFERRABLE
    # INITIALLY DEFERRED: rows go in any order, the constraints are checked once all are gone.
    delete_from = f"{style.SQL_KEYWORD('DELETE')} {style.SQL_KEYWORD('FROM')}"
    return [f"{delete_from} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]


def install() -> None:
    DatabaseOperations.sql_flush = _delete_each  # type: ignore[method-assign]
