"""The benchmark database on PostgreSQL or MariaDB/MySQL: created if missing, emptied between runs.

For the benchmarks that run in the project's virtualenv (psycopg and mysqlclient installed)
and take a ``postgres://`` or ``mysql://`` URL.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks._common import conninfo, django_database


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
