"""On MariaDB/MySQL: the names and keys that identify something are compared exactly.

Their default collations ignore case and accents, so a worker of queue ``mail`` claimed the
jobs of ``Mail``, pausing one paused both, and the rate keys ``partner:acme`` and
``partner:ACME`` shared one budget. These columns get a binary collation, as idempotency and
lock keys did in 0016; PostgreSQL and SQLite already compare them byte for byte. Free text
(task and workflow names, errors, notes) keeps the database's collation, so the console's
searches still ignore case. The queue name columns change together: MySQL refuses to compare
a binary column with a case-insensitive one. A later ``AlterField`` of one of these columns
must keep its collation.
"""

from django.db import migrations

from ._operations import MySQLOnlySQL

#: (table, column, max_length, nullable): each column as the models declare it.
COLUMNS = [
    ("jobguard_job", "queue_name", 100, False),
    ("jobguard_job", "worker_id", 128, False),
    ("jobguard_job", "lock_key", 255, False),
    ("jobguard_job", "lease_token", 32, True),
    ("jobguard_deadletter", "queue_name", 100, False),
    ("jobguard_deadletter", "worker_id", 128, False),
    ("jobguard_deadletter", "idempotency_key", 255, True),
    ("jobguard_deadletter", "lock_key", 255, False),
    ("jobguard_lock", "token", 64, True),
    ("jobguard_lockrelease", "key", 255, False),
    ("jobguard_schedule", "name", 200, False),
    ("jobguard_schedule", "queue_name", 100, False),
    ("jobguard_queuestate", "queue_name", 100, False),
    ("jobguard_queueevent", "queue_name", 100, False),
    ("jobguard_queueminute", "queue_name", 100, False),
    ("jobguard_workerbeat", "worker_id", 128, False),
    ("jobguard_flowrate", "key", 255, False),
    ("jobguard_breaker", "name", 100, False),
    ("jobguard_breakerevent", "name", 100, False),
]


def _alter(binary: bool) -> list[str]:
    collation = " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin" if binary else ""
    tables: dict[str, list[str]] = {}
    for table, column, length, null in COLUMNS:
        tables.setdefault(table, []).append(
            f"MODIFY `{column}` varchar({length}){collation} {'NULL' if null else 'NOT NULL'}"
        )
    # One statement per table: MariaDB rebuilds a table once for all of its columns.
    return [f"ALTER TABLE {table} {', '.join(changes)}" for table, changes in tables.items()]


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0018_breakers")]

    operations = [MySQLOnlySQL(_alter(binary=True), _alter(binary=False))]
