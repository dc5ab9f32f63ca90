"""On MariaDB/MySQL: the indexes the claim, the reaper and the reports need, and exact keys.

Django creates the job table's partial indexes there without their condition, and leaves
out the due indexes (they are expressions: ``priority DESC``). These lead with ``status``: a
claim walks the queued rows of one queue in claim order and stops after its batch, however
many finished rows the table holds. (MariaDB before 10.8 ignores DESC in an index and sorts
the due rows instead.) Key columns get a binary collation: idempotency and lock keys are
compared exactly, as on PostgreSQL, not case- and accent-insensitively.
"""

from django.db import migrations

from ._operations import MySQLOnlySQL

CREATE = [
    "CREATE INDEX jobguard_job_due_my_idx ON jobguard_job (status, queue_name, priority DESC, run_after, id)",
    "CREATE INDEX jobguard_job_due_all_my_idx ON jobguard_job (status, priority DESC, run_after, id)",
    "CREATE INDEX jobguard_job_lease_my_idx ON jobguard_job (status, lease_expires_at)",
    "ALTER TABLE jobguard_idempotencykey "
    "MODIFY `key` varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
    "MODIFY scope varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
    "ALTER TABLE jobguard_lock MODIFY `key` varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
    "ALTER TABLE jobguard_job MODIFY idempotency_key varchar(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
]
DROP = [
    "ALTER TABLE jobguard_job MODIFY idempotency_key varchar(255) NULL",
    "ALTER TABLE jobguard_lock MODIFY `key` varchar(255) NOT NULL",
    "ALTER TABLE jobguard_idempotencykey MODIFY `key` varchar(255) NOT NULL, MODIFY scope varchar(255) NOT NULL",
    "DROP INDEX jobguard_job_lease_my_idx ON jobguard_job",
    "DROP INDEX jobguard_job_due_all_my_idx ON jobguard_job",
    "DROP INDEX jobguard_job_due_my_idx ON jobguard_job",
]


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0015_workflows")]

    operations = [MySQLOnlySQL(CREATE, DROP)]
