"""On PostgreSQL, NOTIFY idle workers only for jobs that are due when they become queued.

A job queued with a later ``run_after`` (a delayed enqueue, a retry waiting out its backoff,
a durable cache invalidation waiting for its writer to settle it) woke every idle worker for
a claim that could find nothing: with durable invalidation that is every write transaction.
Workers pick such jobs up by polling, as they did after the useless wake-up.
"""

from django.db import migrations


class PostgresOnlySQL(migrations.RunSQL):
    """RunSQL that does nothing on databases other than PostgreSQL (as in 0002)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


CREATE = """
DROP TRIGGER IF EXISTS jobguard_job_queued_notify ON jobguard_job;
CREATE TRIGGER jobguard_job_queued_notify
AFTER INSERT OR UPDATE OF status ON jobguard_job
FOR EACH ROW WHEN (NEW.status = 'queued' AND NEW.run_after <= statement_timestamp())
EXECUTE FUNCTION jobguard_notify_queued();
"""

RESTORE = """
DROP TRIGGER IF EXISTS jobguard_job_queued_notify ON jobguard_job;
CREATE TRIGGER jobguard_job_queued_notify
AFTER INSERT OR UPDATE OF status ON jobguard_job
FOR EACH ROW WHEN (NEW.status = 'queued')
EXECUTE FUNCTION jobguard_notify_queued();
"""


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0007_attempt_history")]

    operations = [PostgresOnlySQL(CREATE, RESTORE)]
