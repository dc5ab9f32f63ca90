"""Task name → Task, the flow-control plan the registered tasks declare, and discovery of the
``tasks.py`` modules of installed apps."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .conf import get_settings
from .exceptions import InvalidTaskError, UnknownTaskError
from .flow import FlowPlan, TaskLimits, build_plan

if TYPE_CHECKING:
    from .task import Task

__all__ = ["Resolver", "TaskRegistry", "autodiscover", "registry", "unknown_task_error"]

#: Discovered modules an unknown task's error names at most (then how many more).
MODULES_NAMED = 12

#: Finds a task the registry does not hold by name, or None: for example the Django Tasks
#: backend, which finds a Django task by its module path (``backends.backend.resolve_task``).
Resolver = Callable[[str], "Task | None"]


class TaskRegistry:
    """The tasks this process knows. The worker runs nothing that is not in here."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._resolvers: list[Resolver] = []
        self._lock = threading.Lock()

    def register(self, task: Task) -> None:
        """Add ``task``; a second, different function under the same name is an error."""
        with self._lock:
            existing = self._tasks.get(task.name)
            if existing is not None and _origin(existing) != _origin(task):
                raise InvalidTaskError(
                    f"Task name {task.name!r} is already registered for another function; "
                    "pass name=... to @task to tell them apart."
                )
            self._tasks[task.name] = task

    def unregister(self, name: str) -> None:
        with self._lock:
            self._tasks.pop(name, None)

    def get(self, name: str) -> Task:
        """The task registered as ``name``; :class:`UnknownTaskError` if there is none."""
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTaskError(f"No task is registered as {name!r} in this process.") from None

    def find(self, name: str) -> Task | None:
        """The task registered as ``name``, or None (resolvers are not asked)."""
        return self._tasks.get(name)

    def add_resolver(self, resolver: Resolver) -> None:
        """Let :meth:`resolve` ask ``resolver`` for names no task is registered under (once)."""
        with self._lock:
            if resolver not in self._resolvers:
                self._resolvers.append(resolver)

    def remove_resolver(self, resolver: Resolver) -> None:
        with self._lock:
            if resolver in self._resolvers:
                self._resolvers.remove(resolver)

    def resolve(self, name: str) -> Task | None:
        """The task the worker runs for a job named ``name``: registered, or found by a resolver.

        None means no task: the worker dead-letters the job as unknown and never runs it.
        """
        task = self._tasks.get(name)
        if task is not None:
            return task
        for resolver in list(self._resolvers):
            task = resolver(name)
            if task is not None:
                return task
        return None

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def flow_plan(self) -> FlowPlan | None:
        """The flow-control limits the registered tasks and the settings declare; None if none are.

        A worker builds it once at its start and hands it to every claim (``store.claim(flow=...)``):
        the store knows no task.
        """
        conf = get_settings()
        tasks = []
        for name in self.names():
            task = self.find(name)
            if task is not None and getattr(task, "limited", False):
                queue = task.queue_name or conf.default_queue
                tasks.append(TaskLimits(task.name, queue, task.concurrency, task.rate, task.limit))
        queues = {name: q.concurrency for name, q in conf.queues.items() if q.concurrency is not None}
        return build_plan(queues, conf.limits, tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)


def _origin(task: Task) -> tuple[str, str]:
    func = task.func
    return (getattr(func, "__module__", ""), getattr(func, "__qualname__", repr(func)))


registry = TaskRegistry()


def autodiscover() -> None:
    """Import the ``tasks`` module of every installed app, as the admin does with ``admin.py``."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")


def unknown_task_error(name: str) -> str:
    """The dead letter's error for a job whose task ``name`` this process does not know.

    Says where tasks are looked for (the ``tasks`` module of every installed app, and what
    those import) and what to do, for the module the default name (``module.function``)
    points at.
    """
    from django.apps import apps

    app_names = [config.name for config in apps.get_app_configs()]
    found = [f"{app}.tasks" for app in app_names if f"{app}.tasks" in sys.modules]
    shown = ", ".join(found[:MODULES_NAMED]) + (
        f" and {len(found) - MODULES_NAMED} more" if len(found) > MODULES_NAMED else ""
    )
    text = (
        f"no task is registered as {name!r} in this worker; it was never run. A worker knows the "
        "tasks defined in the modules it imports at start: the tasks module of each app in "
        f"INSTALLED_APPS ({shown or 'none here'}), and the modules those import."
    )
    module = name.rpartition(".")[0]
    owner = max(
        (app for app in app_names if module == app or module.startswith(f"{app}.")), key=len, default=None
    )
    if module in sys.modules:
        text += (
            f" {module} is imported here but has no task of that name: it was renamed or removed "
            "(give @task a stable name= to rename a function safely)."
        )
    elif owner is not None:
        text += (
            f" {module} is not one of them: move the task into {owner}.tasks, or import {module} "
            f"from {owner}.tasks (or from the ready() of {owner}'s AppConfig)."
        )
    elif module:
        text += (
            f" {module} belongs to no installed app: add its app to INSTALLED_APPS, or move the "
            "task into an app's tasks module."
        )
    return text + (
        " If the process that enqueued it knows the task, this worker runs older code or other "
        "settings: deploy the same code and settings, restart it, then replay the dead letter."
    )
