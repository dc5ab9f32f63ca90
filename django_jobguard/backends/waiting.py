"""Wait for a Django ``TaskResult`` of the jobguard backend to finish, woken as ``Job.wait()`` is.

Django's ``TaskResult.refresh()`` and ``arefresh()`` read the result once; they never wait.
:func:`wait_for` and :func:`await_for` wait on the result's job with jobguard's wake-up (the
settlement's NOTIFY on PostgreSQL, a bounded poll elsewhere), then refresh the result once, so
it reads ``SUCCESSFUL`` or ``FAILED`` as Django's API defines them: a failed task is a status
to read, not an exception.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.exceptions import SynchronousOnlyOperation

from ..conf import get_settings
from ..exceptions import InvalidArgumentsError, JobCancelled, JobFailed, ResultExpired
from ..models import Job
from ..results import waiting
from . import _compat
from .backend import JobGuardBackend

__all__ = ["await_for", "wait_for"]

#: What the job settled with when the result is FAILED (dead, cancelled), or SUCCESSFUL with
#: a value past its retention: the refreshed result says which.
_FINISHED = (JobFailed, JobCancelled, ResultExpired)


def _job_of(result: Any) -> Job | None:
    """The job to wait on for ``result``; None if the result has finished already."""
    if not isinstance(result, _compat.TaskResult):
        raise InvalidArgumentsError(
            f"result must be the TaskResult that enqueue() or get_result() returned, "
            f"not {type(result).__name__} {result!r}."
        )
    backend = result.task.get_backend()
    if not isinstance(backend, JobGuardBackend):
        raise InvalidArgumentsError(
            f"result {result.id!r} is of the tasks backend {backend.alias!r} ({type(backend).__name__}); "
            "wait_for() and await_for() wait on the results of a JobGuardBackend only "
            "(elsewhere, call result.refresh() until result.is_finished)."
        )
    if result.is_finished:  # a finished job never runs again (a replay is a job of its own)
        return None
    job = Job(pk=int(result.id), task_name=result.task.module_path)
    # As if read from the database: a row gone by now is a pruned result, not a bad id.
    job._state.adding = False
    job._state.db = get_settings().database_alias
    return job


def wait_for(result: Any, timeout: float | None = None) -> Any:
    """Block until the job of Django ``TaskResult`` ``result`` finishes, then refresh it.

    Returns ``result`` itself, refreshed: ``result.status`` is ``SUCCESSFUL`` (read
    ``result.return_value``) or ``FAILED`` (read ``result.errors``). Raises
    :class:`~django_jobguard.exceptions.WaitTimeout` (a ``TimeoutError``) if it has not
    finished within ``timeout`` seconds (None: no limit), leaving ``result`` as it was; the
    arguments' errors are :meth:`Job.wait() <django_jobguard.models.Job.wait>`'s. Not in
    async code (use :func:`await_for`), nor inside a transaction for a job not finished yet.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass  # no event loop on this thread: blocking is fine
    else:
        raise SynchronousOnlyOperation(
            "wait_for() blocks, and this thread runs an event loop: "
            "use await await_for(result) in async code."
        )
    job = _job_of(result)
    if job is None:
        return result
    try:
        waiting.wait(job, timeout)
    except _FINISHED:
        pass
    result.refresh()
    return result


async def await_for(result: Any, timeout: float | None = None) -> Any:
    """:func:`wait_for` without blocking the event loop (``await_result()``'s wake-up, then
    ``arefresh()``)."""
    job = _job_of(result)
    if job is None:
        return result
    try:
        await waiting.await_result(job, timeout)
    except _FINISHED:
        pass
    await result.arefresh()
    return result
