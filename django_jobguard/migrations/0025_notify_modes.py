"""On PostgreSQL, the jobs' NOTIFY triggers follow ``JOBGUARD["NOTIFY"]``.

A transaction that has called NOTIFY takes one lock of the whole server as it commits and holds
it until its commit is flushed, so every notifying commit of the cluster waits its turn. Until
now every enqueuing transaction notified. From here the enqueue trigger notifies only when the
mode is "row"; with "coalesced" (the default) the enqueuing process notifies after its commit,
in a transaction of its own and at most once per queue per interval; with "none" nothing does.
The trigger on a job put back in the queue (a lease handed back, an operator's retry) notifies
unless the mode is "none": those commits are the workers' and the operators', not the
application's.

The mode is the constant that ``jobguard_notify_mode()`` returns: this migration installs the
default and ``migrate`` then installs the setting (a post-migrate step replaces the function,
which takes no lock on the jobs table; see ``django_jobguard.store.wakeup``). The function is
IMMUTABLE so that PostgreSQL folds the triggers' WHEN into a constant once per statement: a
row costs no call, and no lookup, in any mode.
"""

from django.db import migrations

from ._operations import PostgreSQLOnlySQL

CREATE = """
CREATE OR REPLACE FUNCTION jobguard_notify_mode() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 'coalesced'::text $$;

DROP TRIGGER IF EXISTS jobguard_job_queued_notify ON jobguard_job;
CREATE TRIGGER jobguard_job_queued_notify
AFTER INSERT ON jobguard_job
FOR EACH ROW WHEN (
    NEW.status = 'queued' AND NEW.run_after <= statement_timestamp() AND jobguard_notify_mode() = 'row'
)
EXECUTE FUNCTION jobguard_notify_queued();

CREATE TRIGGER jobguard_job_requeued_notify
AFTER UPDATE OF status ON jobguard_job
FOR EACH ROW WHEN (
    NEW.status = 'queued' AND NEW.run_after <= statement_timestamp() AND jobguard_notify_mode() <> 'none'
)
EXECUTE FUNCTION jobguard_notify_queued();
"""

# Back to 0008's single trigger, which notifies per row whatever the setting.
RESTORE = """
DROP TRIGGER IF EXISTS jobguard_job_requeued_notify ON jobguard_job;
DROP TRIGGER IF EXISTS jobguard_job_queued_notify ON jobguard_job;
CREATE TRIGGER jobguard_job_queued_notify
AFTER INSERT OR UPDATE OF status ON jobguard_job
FOR EACH ROW WHEN (NEW.status = 'queued' AND NEW.run_after <= statement_timestamp())
EXECUTE FUNCTION jobguard_notify_queued();
DROP FUNCTION IF EXISTS jobguard_notify_mode();
"""


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0024_jobs_autovacuum")]

    operations = [PostgreSQLOnlySQL(CREATE, RESTORE)]
