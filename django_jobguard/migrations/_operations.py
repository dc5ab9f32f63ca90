"""Operations shared by migrations (a leading underscore: Django's loader skips this module)."""

from django.db import migrations


class MySQLOnlySQL(migrations.RunSQL):
    """RunSQL that does nothing on databases other than MariaDB/MySQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "mysql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "mysql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
