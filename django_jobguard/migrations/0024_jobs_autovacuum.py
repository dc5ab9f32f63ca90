"""On PostgreSQL, autovacuum and analyze the jobs table after a fixed share of churn, not a fifth.

Every job is inserted, updated at its claim and at its ack (neither update is HOT: the status is
in the partial indexes' predicates), and deleted by retention: a dead row per step. With the
server's defaults (``autovacuum_vacuum_scale_factor`` 0.2) a table of 5 million rows waits for a
million dead rows before a vacuum, and every claim walks over them in the meantime. Vacuuming at
2 % (plus 1,000 rows, so a nearly empty table is not vacuumed at every pass) keeps the dead rows
a claim may meet in the tens of thousands at most; analyzing at the same share keeps the
planner's counts of the statuses current as the backlog grows and drains. See "Keep the queue
fast at scale" (docs/how-to/keep-the-queue-fast.md) for the values and why.

Table storage parameters only: no lock beyond a brief ``SHARE UPDATE EXCLUSIVE`` and no rewrite.
Reversed, the table follows the server's settings again. SQLite and MariaDB/MySQL: nothing.
"""

from django.db import migrations

from ._operations import PostgreSQLOnlySQL

#: Dead (and, for analyze, changed) rows that trigger a pass: threshold + scale_factor * rows.
AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor": "0.02",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "1000",
}

SET = "ALTER TABLE jobguard_job SET ({})".format(
    ", ".join(f"{key} = {value}" for key, value in AUTOVACUUM.items())
)
RESET = "ALTER TABLE jobguard_job RESET ({})".format(", ".join(AUTOVACUUM))


class Migration(migrations.Migration):
    dependencies = [("jobguard", "0023_replay_rate")]

    operations = [PostgreSQLOnlySQL(SET, RESET)]
