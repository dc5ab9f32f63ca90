"""Operations shared by migrations (a leading underscore: Django's loader skips this module)."""

from django.db import migrations


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
