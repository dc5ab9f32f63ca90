"""On MariaDB/MySQL: keys and names are compared exactly, trailing spaces included.

``utf8mb4_bin``, which 0016 and 0019 gave these columns, is a PAD SPACE collation: it ignores
trailing spaces, so ``welcome:alice`` and ``welcome:alice `` were one idempotency key there
(the second job was dropped as a duplicate) and two on PostgreSQL, and two lock keys, rate
keys or queue names that differed so were merged the same way. Each column gets the server's
NO PAD binary collation instead, chosen when the migration runs: ``utf8mb4_nopad_bin`` on
MariaDB, ``utf8mb4_0900_bin`` on MySQL 8.0.17 and later (an older MySQL has none, and the
migration stops with an error that says so). Case, accents and trailing spaces then all
count, as on PostgreSQL and SQLite, where this migration does nothing.

A collation, not ``VARBINARY``: Django's MySQL back end returns a binary column as bytes, not
str, so every key read through the ORM would change type; a ``VARBINARY`` length counts bytes,
not the characters the models' ``max_length`` counts; and the columns' ordering and the
console's searches (exact and case-sensitive on them since 0016/0019) stay as they are, with
indexes of the same size. Free text keeps the database's collation, as in 0019. Going back
restores ``utf8mb4_bin``, which fails on a unique column that by then holds two values
differing only by trailing spaces. A later ``AlterField`` of one of these columns must keep
its collation (the ``jobguard.E058`` check reports one that lost it).
"""

from django.db import migrations

from ._operations import MySQLKeyCollation

#: (table, column, max_length, nullable): 0016's and 0019's columns, as the models declare them.
COLUMNS = [
    ("jobguard_idempotencykey", "key", 255, False),
    ("jobguard_idempotencykey", "scope", 255, False),
    ("jobguard_lock", "key", 255, False),
    ("jobguard_lock", "token", 64, True),
    ("jobguard_job", "idempotency_key", 255, True),
    ("jobguard_job", "queue_name", 100, False),
    ("jobguard_job", "worker_id", 128, False),
    ("jobguard_job", "lock_key", 255, False),
    ("jobguard_job", "lease_token", 32, True),
    ("jobguard_deadletter", "queue_name", 100, False),
    ("jobguard_deadletter", "worker_id", 128, False),
    ("jobguard_deadletter", "idempotency_key", 255, True),
    ("jobguard_deadletter", "lock_key", 255, False),
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


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0021_job_flowkey_index")]

    operations = [MySQLKeyCollation(COLUMNS, previous="utf8mb4_bin")]
