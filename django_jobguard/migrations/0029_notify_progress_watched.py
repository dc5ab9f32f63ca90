"""On PostgreSQL, a job somebody watches (``waited``, set by ``Job.watch()``) notifies each new report.

The trigger fires after an update of ``progress`` that changes a watched job's progress, and
sends ``pg_notify('jobguard_settled', 'p' || id)`` on the channel migration 0027 notifies
settlements on: the watching process's one LISTEN connection wakes that job's watchers (the
``p`` tells ``Job.wait()``'s waiters to stay asleep). A job nobody watches costs its
heartbeat's statement the trigger's WHEN, false on its first column. Elsewhere watchers poll.
"""

from django.db import migrations

from ._operations import PostgreSQLOnlySQL

CREATE = """
CREATE OR REPLACE FUNCTION jobguard_notify_progress() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('jobguard_settled', 'p' || NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobguard_job_progress_notify
AFTER UPDATE OF progress ON jobguard_job
FOR EACH ROW WHEN (NEW.waited AND NEW.progress IS DISTINCT FROM OLD.progress)
EXECUTE FUNCTION jobguard_notify_progress();
"""

DROP = """
DROP TRIGGER IF EXISTS jobguard_job_progress_notify ON jobguard_job;
DROP FUNCTION IF EXISTS jobguard_notify_progress();
"""


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0028_dead_letter_reason_label")]

    operations = [PostgreSQLOnlySQL(CREATE, DROP)]
