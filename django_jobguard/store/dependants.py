"""The statement that releases the jobs waiting for a workflow member that succeeded.

The rest of a member's settling (:mod:`django_jobguard.workflows.settle`) is the ORM's, or
the counters' statements each dialect writes (``add_workflow_counts``), or the reads every
database shares (:func:`~django_jobguard.store.workflow_children`,
:func:`~django_jobguard.store.workflow_totals`). This one is raw SQL in the dialect's clock:
a released job is due at the database's now, never a worker's.
"""

from __future__ import annotations

from django.db import connections

from . import dialect_of
from .common import TABLE, placeholders

__all__ = ["release"]


def release(alias: str, job_ids: list[int]) -> None:
    """One more dependency succeeded for each waiting job of ``job_ids``: queue those it was the last of.

    One statement per child set: each row's decrement is atomic under its row lock, and the
    completion that takes the count to zero is the one that queues the job (due now).
    """
    with connections[alias].cursor() as cursor:
        # waiting_on last: MariaDB/MySQL apply assignments left to right, each seeing the
        # ones before it (PostgreSQL and SQLite read the old row throughout).
        cursor.execute(
            f"UPDATE {TABLE} SET status = CASE WHEN waiting_on = 1 THEN 'queued' ELSE status END, "
            f"run_after = CASE WHEN waiting_on = 1 THEN {dialect_of(alias).CLOCK.now} ELSE run_after END, "
            "waiting_on = waiting_on - 1 "
            f"WHERE id IN ({placeholders(job_ids)}) AND status = 'waiting'",
            job_ids,
        )
