"""Operations shared by migrations (a leading underscore: Django's loader skips this module)."""

from typing import Any

from django.db import DatabaseError, migrations
from django.db.migrations.operations.base import Operation


class VendorOnlySQL(migrations.RunSQL):
    """RunSQL that does nothing on databases other than ``vendor``'s."""

    vendor = ""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == self.vendor:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == self.vendor:
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class MySQLOnlySQL(VendorOnlySQL):
    """RunSQL that does nothing on databases other than MariaDB/MySQL."""

    vendor = "mysql"


class PostgreSQLOnlySQL(VendorOnlySQL):
    """RunSQL that does nothing on databases other than PostgreSQL."""

    vendor = "postgresql"


#: The NO PAD binary collations of utf8mb4, in order of preference: MariaDB's (10.2+) and
#: MySQL's (8.0.17+). Under either, ``'a'`` and ``'a '`` differ, as on PostgreSQL.
NO_PAD_BINARY_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")


def no_pad_binary_collation(cursor: Any) -> str:
    """The server's NO PAD binary collation of utf8mb4; an error naming the fix without one."""
    cursor.execute(
        "SELECT collation_name FROM information_schema.collations WHERE collation_name IN (%s, %s)",
        list(NO_PAD_BINARY_COLLATIONS),
    )
    found = {str(row[0]).lower() for row in cursor.fetchall()}
    for name in NO_PAD_BINARY_COLLATIONS:
        if name in found:
            return name
    raise DatabaseError(
        "This MySQL server has no NO PAD binary collation for utf8mb4 (utf8mb4_0900_bin came in "
        "MySQL 8.0.17): django-jobguard's keys would compare with PAD SPACE, 'a' equal to 'a '. "
        "Upgrade to MySQL 8.0.17 or later, or MariaDB 10.6 or later."
    )


class MySQLKeyCollation(Operation):
    """On MariaDB/MySQL: give ``columns`` the server's NO PAD binary collation; back: ``previous``.

    ``columns`` are ``(table, column, max_length, nullable)`` as the models declare them. The
    collation is chosen when the migration runs (:func:`no_pad_binary_collation`), so no SQL is
    fixed in the migration; elsewhere the operation does nothing.
    """

    reversible = True
    reduces_to_sql = True  # sqlmigrate prints the ALTERs for the server it is connected to

    def __init__(self, columns: list[tuple[str, str, int, bool]], previous: str) -> None:
        self.columns = columns
        self.previous = previous

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # the models do not change: only the database's comparison of these columns

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "mysql":
            with schema_editor.connection.cursor() as cursor:
                collation = no_pad_binary_collation(cursor)
            self._alter(schema_editor, collation)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any) -> None:
        if schema_editor.connection.vendor == "mysql":
            self._alter(schema_editor, self.previous)

    def _alter(self, schema_editor: Any, collation: str) -> None:
        tables: dict[str, list[str]] = {}
        for table, column, length, null in self.columns:
            tables.setdefault(table, []).append(
                f"MODIFY `{column}` varchar({length}) CHARACTER SET utf8mb4 COLLATE {collation} "
                + ("NULL" if null else "NOT NULL")
            )
        # One statement per table: MariaDB rebuilds a table once for all of its columns.
        for table, changes in tables.items():
            schema_editor.execute(f"ALTER TABLE {table} {', '.join(changes)}")

    def describe(self) -> str:
        return f"On MariaDB/MySQL: {len(self.columns)} key columns compared exactly (NO PAD binary collation)"

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [], {"columns": self.columns, "previous": self.previous})
