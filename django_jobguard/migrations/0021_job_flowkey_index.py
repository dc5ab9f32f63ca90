"""PostgreSQL: an index of queued jobs by their first flow key, for limited claims beside a hot key.

A limited claim leaves out the jobs of keys that are full. When one of them has thousands of
jobs queued before the others, reading past them in claim order costs milliseconds per
claim; with this index the claim looks for the other keys' jobs key by key instead. Only
queued rows are indexed, as in the due index. MariaDB/MySQL and SQLite read in claim order.
"""

from django.db import migrations

from ._operations import PostgreSQLOnlySQL


class Migration(migrations.Migration):
    dependencies = [
        ("jobguard", "0020_job_has_dependants"),
    ]

    operations = [
        PostgreSQLOnlySQL(
            "CREATE INDEX IF NOT EXISTS jobguard_job_flowkey_idx ON jobguard_job "
            "((coalesce(flow_keys->>0, '')), queue_name, priority DESC, run_after, id) "
            "WHERE status = 'queued'",
            "DROP INDEX IF EXISTS jobguard_job_flowkey_idx",
        ),
    ]
