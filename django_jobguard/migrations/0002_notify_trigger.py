"""On PostgreSQL, NOTIFY idle workers when a job becomes queued (delivered at commit)."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION jobguard_notify_queued() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('jobguard_jobs', NEW.queue_name);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER jobguard_job_queued_notify
AFTER INSERT OR UPDATE OF status ON jobguard_job
FOR EACH ROW WHEN (NEW.status = 'queued')
EXECUTE FUNCTION jobguard_notify_queued();
"""

DROP = """
DROP TRIGGER IF EXISTS jobguard_job_queued_notify ON jobguard_job;
DROP FUNCTION IF EXISTS jobguard_notify_queued();
"""


class PostgresOnlySQL(migrations.RunSQL):
    """RunSQL that does nothing on databases other than PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0001_initial")]

    operations = [PostgresOnlySQL(CREATE, DROP)]
