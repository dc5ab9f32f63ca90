"""Whether a database holds django_jobguard's schema, and errors that say it does not.

A worker started before ``manage.py migrate`` (or after an upgrade whose migrations have not
run) fails every statement with "no such table" or "column does not exist". Read as an outage,
that would retry for ever, and ``--burst`` would never exit; the worker asks here instead, says
to run ``migrate`` and exits (see :mod:`django_jobguard.worker.loop`).
"""

from __future__ import annotations

from django.apps import AppConfig, apps
from django.db import connections

__all__ = ["is_missing_relation", "missing_tables", "unapplied_migrations"]

#: PostgreSQL's SQLSTATEs for a table and a column that do not exist.
_PG_UNDEFINED = frozenset({"42P01", "42703"})  # undefined_table, undefined_column
#: MariaDB/MySQL's error numbers for the same: ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR.
_MYSQL_UNDEFINED = frozenset({1146, 1054})
#: How SQLite words them (it has no error codes for these).
_SQLITE_UNDEFINED = ("no such table", "no such column", "has no column named")


def is_missing_relation(exc: BaseException) -> bool:
    """Whether ``exc`` says a table or a column does not exist (PostgreSQL, MariaDB/MySQL, SQLite)."""
    # psycopg puts the SQLSTATE on the original error, which Django chains as the cause.
    if getattr(exc.__cause__, "sqlstate", None) in _PG_UNDEFINED:
        return True
    # mysqlclient: the server's error number first (Django keeps the driver's args).
    if exc.args and isinstance(exc.args[0], int) and exc.args[0] in _MYSQL_UNDEFINED:
        return True
    text = str(exc)
    return any(words in text for words in _SQLITE_UNDEFINED)


def missing_tables(alias: str) -> list[str]:
    """The tables of django_jobguard's models that database ``alias`` lacks (one catalogue query)."""
    expected = {
        model._meta.db_table for model in _app().get_models() if model._meta.managed and not model._meta.proxy
    }
    with connections[alias].cursor() as cursor:
        present = set(connections[alias].introspection.table_names(cursor))
    return sorted(expected - present)


def unapplied_migrations(alias: str, *, upgrades_only: bool = False) -> list[str]:
    """``app.migration`` names that ``migrate`` would apply on ``alias`` for django_jobguard.

    Its dependencies of other apps included. ``upgrades_only``: none unless one of
    django_jobguard's migrations is recorded as applied (a database migrated before an
    upgrade); a schema made without migrations (``pytest --no-migrations``) records none and
    is left alone. Reads every app's migration files (0.03 s here): once per worker process.
    """
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[alias])
    label = _app().label
    if upgrades_only and not any(app == label for app, _ in executor.loader.applied_migrations):
        return []
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == label]
    return [f"{migration.app_label}.{migration.name}" for migration, _ in executor.migration_plan(targets)]


def _app() -> AppConfig:
    """django_jobguard's app config (its label is ``jobguard``)."""
    from ..models import Job  # app registry: see common

    return apps.get_app_config(Job._meta.app_label)
