"""``JobGuardBackend``: Django's Tasks API on jobguard's job table, worker and console.

A thin adapter: ``enqueue`` goes through :func:`django_jobguard.enqueue.enqueue` (the same
validation, idempotency and transactional insert as jobguard's own tasks), results are
read from the ``Job`` row, and ``manage.py jobguard_worker`` runs the jobs with the same
leases, fencing, retries, dead letters and metrics.
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from .. import enqueue as enqueue_service
from .. import signals
from ..checks.tasks import check_tasks_backend
from ..conf import get_settings
from ..encryption.payloads import ARGS, KWARGS, RESULT, open_history, open_json
from ..exceptions import InvalidArgumentsError, InvalidTaskError
from ..models import Job, JobStatus
from ..registry import registry
from ..task import Signature
from ..task import Task as JobguardTask
from . import _compat
from .task import BACKEND_OPTIONS, JobGuardTask, django_task_named, jobguard_task_for

# The messages of resolve_task() keep the logger they were logged under before it moved here.
logger = logging.getLogger("django_jobguard.backends")

__all__ = ["JobGuardBackend", "resolve_task"]

#: Job status -> Django's TaskResultStatus (waiting for a retry is "queued" too: READY; a
#: workflow step waiting on its dependencies has not run either: READY).
STATUS_MAP = {
    JobStatus.WAITING: "READY",
    JobStatus.QUEUED: "READY",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.SUCCEEDED: "SUCCESSFUL",
    JobStatus.DEAD: "FAILED",
    JobStatus.CANCELLED: "FAILED",
}


class JobGuardBackend(_compat.BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "django_jobguard.backends.JobGuardBackend"}}``.

    ``OPTIONS`` may hold defaults for every task of the backend: ``max_attempts``,
    ``visibility_timeout``, ``timeout``, ``atomic``, ``lock_ttl``, ``retry``,
    ``recoverable_retry``, ``handler_version`` (a task's own options win; the queue's
    ``JOBGUARD["QUEUES"]`` settings come after both).
    """

    task_class = JobGuardTask
    #: ``run_after`` is stored on the job; the claim skips it until then (database clock).
    supports_defer = True
    #: ``async def`` tasks run in the worker, one coroutine per executor thread.
    supports_async_task = True
    #: Results are the job rows, readable from any process.
    supports_get_result = True
    #: Jobs are claimed highest priority first.
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.jobguard_defaults = self._parse_options(alias, self.options)
        signals.job_succeeded.connect(_job_succeeded, dispatch_uid="jobguard_tasks_backend_succeeded")
        signals.job_dead_lettered.connect(_job_dead_lettered, dispatch_uid="jobguard_tasks_backend_dead")

    @staticmethod
    def _parse_options(alias: str, options: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(options, Mapping):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS'] must be a dict, not {options!r}.")
        unknown = sorted(set(options) - set(BACKEND_OPTIONS))
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'][{unknown[0]!r}] is not an option of JobGuardBackend; "
                f"options: {', '.join(BACKEND_OPTIONS)}."
            )
        return dict(options)

    # -- Django's API ----------------------------------------------------------------------

    def validate_task(self, task: Any) -> None:
        """Django's checks (its messages and exception), then jobguard's options of the task."""
        super().validate_task(task)
        try:
            jobguard_task_for(task, self.jobguard_defaults)
        except InvalidTaskError as exc:
            raise _compat.InvalidTask(str(exc)) from exc

    def enqueue(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Store a job for ``task(*args, **kwargs)`` in the caller's transaction; its ``TaskResult``."""
        self.validate_task(task)
        twin = jobguard_task_for(task, self.jobguard_defaults).using(
            priority=task.priority, queue_name=task.queue_name, run_after=task.run_after
        )
        job = enqueue_service.enqueue(twin, args, kwargs)
        result = self._result(job, task)
        _compat.task_enqueued.send(type(self), task_result=result)
        return result

    async def aenqueue(self, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """:meth:`enqueue` from inside an event loop."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    def get_result(self, result_id: str) -> Any:
        """The ``TaskResult`` of job ``result_id``; ``TaskResultDoesNotExist`` if there is none."""
        if not isinstance(result_id, str) or not result_id.isascii() or not result_id.isdigit():
            raise _compat.TaskResultDoesNotExist(f"{result_id!r} is not a result id of this backend.")
        alias = get_settings().database_alias
        job = Job.objects.using(alias).filter(pk=int(result_id)).first()
        if job is None:
            raise _compat.TaskResultDoesNotExist(f"No result with id {result_id!r}.")
        task = self._task_of(job)
        if task is None:
            raise _compat.TaskResultDoesNotExist(
                f"Job {result_id} runs {job.task_name!r}, which is not a task of backend {self.alias!r}."
            )
        return self._result(job, task)

    async def aget_result(self, result_id: str) -> Any:
        """:meth:`get_result` from inside an event loop."""
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """Django's checks of the backend, then jobguard.E013 and W017 (see checks/tasks.py)."""
        return [*super().check(**kwargs), *check_tasks_backend(self.alias, self.queues)]

    # -- rows to results -------------------------------------------------------------------

    def _task_of(self, job: Job) -> Any | None:
        """The Django task of ``job`` (with the job's queue, priority and run_after), or None."""
        task = django_task_named(job.task_name)
        if task is None and resolve_task(job.task_name) is not None:
            task = django_task_named(job.task_name)
        if task is None or task.backend != self.alias:
            return None
        # run_after was left unset if the insert gave it the enqueue time (one clock reading).
        run_after = None if job.run_after == job.enqueued_at else job.run_after
        return task.using(priority=job.priority, queue_name=job.queue_name, run_after=run_after)

    def _result(self, job: Job, task: Any) -> Any:
        # A TaskResult is its caller's own job: its encrypted values are read in clear.
        history = open_history(job.attempt_history or [])
        starts = [_history_time(entry.get("started_at")) for entry in history]
        errors = [
            _compat.TaskError(
                exception_class_path=entry["error_class"],
                traceback=entry.get("traceback") or f"{entry['error_class']}: {entry.get('error', '')}",
            )
            for entry in history
            if entry.get("error_class")
        ]
        status = _compat.TaskResultStatus(STATUS_MAP[JobStatus(job.status)])
        finished = status in (_compat.TaskResultStatus.SUCCESSFUL, _compat.TaskResultStatus.FAILED)
        result = _compat.TaskResult(
            task=task,
            id=str(job.pk),
            status=status,
            enqueued_at=job.enqueued_at,
            started_at=starts[0] if starts else None,
            finished_at=job.finished_at if finished else None,
            last_attempted_at=starts[-1] if starts else None,
            args=list(open_json(job.args, ARGS, "job.args")),
            kwargs=dict(open_json(job.kwargs, KWARGS, "job.kwargs")),
            backend=self.alias,
            errors=errors,
            worker_ids=[str(entry.get("worker_id", "")) for entry in history],
        )
        if status == _compat.TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", open_json(job.result, RESULT, "job.result"))
        return result


def _history_time(value: Any) -> datetime.datetime | None:
    """A timestamp of the attempt history (ISO text from PostgreSQL or SQLite), aware UTC."""
    if not value:
        return None
    parsed = parse_datetime(str(value))
    if parsed is None:
        return None
    return parsed.replace(tzinfo=datetime.UTC) if parsed.tzinfo is None else parsed.astimezone(datetime.UTC)


def _backend_of(task_name: str) -> tuple[JobGuardBackend, Any] | None:
    task = django_task_named(task_name)
    if task is None:
        return None
    backend = task.get_backend()
    return (backend, task) if isinstance(backend, JobGuardBackend) else None


def _finished(job_id: int, task_name: str) -> None:
    found = _backend_of(task_name)
    if found is None or not _compat.task_finished.has_listeners(type(found[0])):
        return
    backend = found[0]
    _compat.task_finished.send(type(backend), task_result=backend.get_result(str(job_id)))


def _job_succeeded(sender: Any, *, job_id: int, task_name: str, **kwargs: Any) -> None:
    _finished(job_id, task_name)


def _job_dead_lettered(sender: Any, *, dead_letter: Any, **kwargs: Any) -> None:
    if dead_letter.job_id is not None:
        _finished(dead_letter.job_id, dead_letter.task_name)


def resolve_task(name: str) -> JobguardTask[Any, Any] | None:
    """The jobguard twin of the Django task at module path ``name``, importing it if needed.

    Only a Django ``Task`` object whose backend is a :class:`JobGuardBackend` resolves: a
    path that imports something else (a plain function, a class) gives None, so the
    worker dead-letters the job as an unknown task and never calls it.
    """
    twin = registry.find(name)
    if twin is not None:
        return twin
    if not _importable_task_path(name):
        # A row's task name is data: importing an arbitrary module runs its top-level code.
        logger.warning("task_refused task=%r; its module is neither loaded nor in an installed app", name)
        return None
    try:
        found = import_string(name)
    except Exception:  # an unimportable path is an unknown task, whatever the import raised
        logger.warning("task_unresolved task=%r; the path does not import", name, exc_info=True)
        return None
    if not isinstance(found, _compat.Task):
        logger.warning("task_refused task=%r; the path names a %s, not a task", name, type(found).__name__)
        return None
    try:
        backend = found.get_backend()
    except Exception:
        logger.warning("task_refused task=%r; its backend is not configured", name, exc_info=True)
        return None
    if not isinstance(backend, JobGuardBackend) or found.module_path != name:
        logger.warning("task_refused task=%r; it does not run on a JobGuardBackend", name)
        return None
    try:
        return jobguard_task_for(found, backend.jobguard_defaults)
    except InvalidTaskError:
        logger.warning("task_refused task=%r; its options are invalid", name, exc_info=True)
        return None


def _importable_task_path(name: str) -> bool:
    """Whether the module of dotted path ``name`` may be imported to find a task.

    Only a module that is already loaded, or one inside an installed app's package, where
    Django's tasks live: a job row can never make the worker import anything else.
    """
    module = name.rpartition(".")[0]
    if not module:
        return False
    if module in sys.modules:
        return True
    return any(module == app.name or module.startswith(app.name + ".") for app in apps.get_app_configs())


def step(django_task: Any, *args: Any, **kwargs: Any) -> Signature:
    """A workflow step of a task declared with Django's ``@task``: its ``task.s(...)``.

    ``chain(step(charge, order_id=1), step(receipt, order_id=1)).enqueue()``. The task must
    run on a :class:`JobGuardBackend`: a workflow's jobs share one table and commit together,
    so a task of another backend (another store) is refused with
    :class:`~django_jobguard.exceptions.InvalidArgumentsError`. A jobguard task is accepted too.
    """
    if isinstance(django_task, JobguardTask):
        return django_task.s(*args, **kwargs)
    if not isinstance(django_task, _compat.Task):
        raise InvalidArgumentsError(
            f"{django_task!r} is not a task; a step is made of a task and its arguments."
        )
    backend = django_task.get_backend()
    if not isinstance(backend, JobGuardBackend):
        raise InvalidArgumentsError(
            f"{django_task.module_path} runs on the tasks backend {backend.alias!r} "
            f"({type(backend).__name__}), "
            "which keeps its jobs elsewhere: every job of a workflow must run on a JobGuardBackend, "
            "in the one database its jobs commit in."
        )
    backend.validate_task(django_task)
    twin = jobguard_task_for(django_task, backend.jobguard_defaults).using(
        priority=django_task.priority, queue_name=django_task.queue_name, run_after=django_task.run_after
    )
    return twin.s(*args, **kwargs)
