"""On PostgreSQL, a job somebody waits on (``waited``, set by ``Job.wait()``) notifies when it settles.

The trigger fires after an update of ``status`` that takes a waited job from an unsettled
status to succeeded, dead or cancelled, and sends ``pg_notify('jobguard_settled', id)``: the
waiting process's one LISTEN connection wakes the waiters of that job. A job nobody waits on
costs its settling statement the trigger's WHEN, false on its first column; no NOTIFY, so
its commit takes no notification lock. Elsewhere waiters poll their row.
"""

from django.db import migrations

from ._operations import PostgreSQLOnlySQL

CREATE = """
CREATE OR REPLACE FUNCTION jobguard_notify_settled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobguard_settled', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobguard_job_settled_notify
AFTER UPDATE OF status ON jobguard_job
FOR EACH ROW WHEN (
    NEW.waited
    AND NEW.status IN ('succeeded', 'dead', 'cancelled')
    AND OLD.status NOT IN ('succeeded', 'dead', 'cancelled')
)
EXECUTE FUNCTION jobguard_notify_settled();
"""

DROP = """
DROP TRIGGER IF EXISTS jobguard_job_settled_notify ON jobguard_job;
DROP FUNCTION IF EXISTS jobguard_notify_settled();
"""


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0026_job_progress_and_waiters")]

    operations = [PostgreSQLOnlySQL(CREATE, DROP)]
