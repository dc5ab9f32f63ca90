"""Results you wait on: :func:`wait` and :func:`await_result`, behind ``Job.wait()`` and
``Job.await_result()``.

A waiter reads the job's row when it settles: its stored result, or the error it settled with
(:class:`~django_jobguard.exceptions.JobFailed` for a dead job,
:class:`~django_jobguard.exceptions.JobCancelled`,
:class:`~django_jobguard.exceptions.ResultExpired` past the result's retention). On PostgreSQL
it is woken by the notification its job's settlement sends (one LISTEN connection per process,
:mod:`django_jobguard.store.settled`); elsewhere it polls its row, from 5 ms up to 250 ms apart.
``Job.watch()`` and ``Job.awatch()`` are woken the same way by each new progress
(:mod:`django_jobguard.results.watching`).
"""

from .waiting import await_result, result_retention, wait
from .watching import awatch_wakeup, watch_wakeup

__all__ = ["await_result", "awatch_wakeup", "result_retention", "wait", "watch_wakeup"]
