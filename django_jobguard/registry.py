"""Task name → Task, and discovery of the ``tasks.py`` modules of installed apps."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .exceptions import InvalidTaskError, UnknownTaskError

if TYPE_CHECKING:
    from .task import Task

__all__ = ["TaskRegistry", "autodiscover", "registry"]


class TaskRegistry:
    """The tasks this process knows. The worker runs nothing that is not in here."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
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
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

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
