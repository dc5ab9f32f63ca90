"""``JobGuardTask``: Django's ``Task`` with jobguard's options, and its jobguard twin.

On Django 6.1 (and the backport) ``@task(...)`` from Django's Tasks framework passes extra
keyword arguments on to the backend's ``task_class``, so ``@task(lock="order:{order_id}",
atomic=True)`` lands in the fields below. On Django 6.0 they stay at their defaults, and
the backend's ``OPTIONS`` and the queue's settings apply.

The worker runs jobs of registered jobguard tasks only. Each Django task on this backend
gets a jobguard :class:`~django_jobguard.task.Task` twin, registered under the Django
task's module path, whose handler builds Django's ``TaskContext`` and calls the function.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

from asgiref.sync import async_to_sync

from ..context import JobContext
from ..registry import registry
from ..task import Task as JobguardTask
from ..task import _exception_types, _policy
from . import _compat

__all__ = ["JOBGUARD_OPTIONS", "JobGuardTask", "jobguard_task_for"]

#: jobguard options a Django task (6.1 keywords) or the backend's OPTIONS may set.
JOBGUARD_OPTIONS = (
    "max_attempts",
    "visibility_timeout",
    "timeout",
    "atomic",
    "lock",
    "lock_ttl",
    "retry_on",
    "recoverable_on",
    "fatal_on",
    "retry",
    "recoverable_retry",
    "handler_version",
    "idempotency_scope",
    # The checklist's classification (jobguard.W002, W004): without them every Django task
    # on this backend warned, with a hint (@task(idempotent=True)) Django's @task refused.
    "idempotent",
    "idempotency_key",
    "expected_duration",
)
#: The subset that makes sense for every task of a backend (OPTIONS): no lock template
#: (it names one task's parameters) and no exception classes (not settings material).
BACKEND_OPTIONS = (
    "max_attempts",
    "visibility_timeout",
    "timeout",
    "atomic",
    "lock_ttl",
    "retry",
    "recoverable_retry",
    "handler_version",
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobGuardTask(_compat.Task):
    """A Django task with jobguard's options (see :func:`django_jobguard.task` for each)."""

    max_attempts: int | None = None
    visibility_timeout: float | None = None
    timeout: float | None = None
    atomic: bool | None = None
    lock: str | None = None
    lock_ttl: float | None = None
    retry_on: Any = ()
    recoverable_on: Any = ()
    fatal_on: Any = ()
    retry: Any = None
    recoverable_retry: Any = None
    handler_version: str | None = None
    idempotency_scope: str | None = None
    idempotent: bool | None = None
    #: A key template such as ``"charge:order:{order_id}"`` (jobguard's ``@task(idempotency_key=)``).
    idempotency_key: str | None = None
    expected_duration: float | None = None


# Django task module path -> (the options it was built with, its jobguard twin, the Django task).
_twins: dict[str, tuple[tuple[Any, ...], JobguardTask[Any, Any], Any]] = {}
_twins_lock = threading.Lock()


def _options_of(django_task: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The jobguard options of ``django_task``: its own fields, else the backend's OPTIONS."""
    options: dict[str, Any] = {}
    for name in JOBGUARD_OPTIONS:
        value = getattr(django_task, name, None)
        if value is None or value == ():
            value = defaults.get(name)
        if value is not None:
            options[name] = value
    return options


def jobguard_task_for(django_task: Any, defaults: Mapping[str, Any]) -> JobguardTask[Any, Any]:
    """The registered jobguard twin of ``django_task`` (built, checked and registered once).

    Raises :class:`~django_jobguard.exceptions.InvalidTaskError` when an option is invalid.
    """
    name = django_task.module_path
    options = _options_of(django_task, defaults)
    key = (django_task.func, django_task.takes_context, repr(sorted(options.items())))
    cached = _twins.get(name)
    if cached is not None and cached[0] == key:
        return cached[1]
    twin: JobguardTask[Any, Any] = JobguardTask(
        func=_handler(django_task),
        name=name,
        max_attempts=options.get("max_attempts"),
        visibility_timeout=options.get("visibility_timeout"),
        takes_context=True,
        atomic=bool(options.get("atomic", False)),
        lock=options.get("lock"),
        lock_ttl=options.get("lock_ttl"),
        retry_on=_exception_types(options.get("retry_on"), "retry_on"),
        recoverable_on=_exception_types(options.get("recoverable_on"), "recoverable_on"),
        fatal_on=_exception_types(options.get("fatal_on"), "fatal_on"),
        retry=_policy(options.get("retry"), "retry"),
        recoverable_retry=_policy(options.get("recoverable_retry"), "recoverable_retry"),
        timeout=options.get("timeout"),
        handler_version=options.get("handler_version") or "",
        idempotency_scope=options.get("idempotency_scope"),
        idempotent=options.get("idempotent"),
        idempotency_key_template=options.get("idempotency_key"),
        expected_duration=options.get("expected_duration"),
    )
    twin.signature  # noqa: B018 - checks the signature now, not in the worker
    registry.register(twin)
    with _twins_lock:
        _twins[name] = (key, twin, django_task)
    return twin


def django_task_named(name: str) -> Any | None:
    """The Django task this process registered under ``name``, if any."""
    cached = _twins.get(name)
    return cached[2] if cached is not None else None


def _handler(django_task: Any) -> Callable[..., Any]:
    """The twin's handler: Django's context and signals around the Django task's function."""
    func = django_task.func
    takes_context = django_task.takes_context
    name = django_task.module_path

    def run(jobguard_context: JobContext, *args: Any, **kwargs: Any) -> Any:
        current = django_task_named(name) or django_task
        backend = current.get_backend()
        result = None
        if takes_context or _compat.task_started.has_listeners(type(backend)):
            result = backend.get_result(str(jobguard_context.job_id))
            _compat.task_started.send(type(backend), task_result=result)
        call_args = (_compat.TaskContext(task_result=result), *args) if takes_context else args
        if inspect.iscoroutinefunction(func):
            return async_to_sync(func)(*call_args, **kwargs)
        return func(*call_args, **kwargs)

    # The registry tells tasks apart by their function's module and name: take the task's.
    run.__module__ = func.__module__
    run.__qualname__ = func.__qualname__
    run.__name__ = func.__name__
    params = list(inspect.signature(func).parameters.values())
    if takes_context:
        params = params[1:]
    context_param = inspect.Parameter("jobguard_context", inspect.Parameter.POSITIONAL_ONLY)
    run.__signature__ = inspect.Signature([context_param, *params])  # type: ignore[attr-defined]
    return run
