"""An atomic task whose transaction has pgbench's shape, for ``benchmarks/bench_atomic.py``.

Imported only with ``BENCH_ATOMIC=1`` (see tasks.py): its table, ``bench_atomic_log``, is
created by that benchmark, not by a migration. The handler inserts one row; the worker's
ack updates the job's row and commits both: one row update and one insert per transaction,
the script ``bench_atomic.py`` gives pgbench.
"""

from django.db import connection

from django_jobguard import task

#: The handler's statement, the same text pgbench's script sends (with ``:id`` for ``%s``).
INSERT_SQL = "INSERT INTO bench_atomic_log (job, at) VALUES (%s, now())"


@task(name="bench.insert_atomic", atomic=True)
def insert_atomic(i: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(INSERT_SQL, [i])
