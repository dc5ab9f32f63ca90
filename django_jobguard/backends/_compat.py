"""The one place that knows where Django's Tasks framework lives.

Django 6.0+ ships it as ``django.tasks``; on Django 5.2 the ``django-tasks`` backport
provides the same API as ``django_tasks`` (``pip install "django-jobguard[backport]"``).
The backport renamed one exception (``InvalidTaskError`` for Django's ``InvalidTask``);
everything else is imported under Django's names from here.

The names are typed ``Any``: the type stubs in use cover one of the two roots at most.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = [
    "ROOT",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def _root() -> str:
    for name in ("django.tasks", "django_tasks"):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name
    raise ImportError(
        "django_jobguard.backends needs Django's Tasks framework: Django 6.0 or newer "
        '(django.tasks), or on Django 5.2 the backport: pip install "django-jobguard[backport]".'
    )


#: ``"django.tasks"`` or ``"django_tasks"``.
ROOT = _root()


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"{ROOT}.{name}")


_base = _module("base")
_exceptions = _module("exceptions")
_signals = _module("signals")

Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
BaseTaskBackend: Any = _module("backends.base").BaseTaskBackend
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
TaskResultMismatch: Any = _exceptions.TaskResultMismatch
task_enqueued: Any = _signals.task_enqueued
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
task_backends: Any = importlib.import_module(ROOT).task_backends
