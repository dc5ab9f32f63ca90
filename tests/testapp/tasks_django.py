"""Tasks written against Django's Tasks API (django.tasks or the backport), run by jobguard.

Not a ``tasks.py``: nothing imports this module in a worker until a job names one of its
tasks, so the worker's resolution of a Django task by its module path is exercised.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

task: Any = import_string(f"{settings.TASKS_ROOT}.task")

#: Django 6.1 and the backport pass @task's extra keywords to the backend's task_class.
TASK_TAKES_OPTIONS = any(
    p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(task).parameters.values()
)


@task
def add(a: int, b: int) -> int:
    return a + b


@task(priority=5, queue_name="slow")
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task(takes_context=True)
def whoami(context: Any) -> dict[str, Any]:
    result = context.task_result
    return {"attempt": context.attempt, "id": result.id, "status": str(result.status)}


@task(takes_context=True)
def fails_until(context: Any, succeed_on: int) -> int:
    if context.attempt < succeed_on:
        raise ValueError(f"attempt {context.attempt} fails on purpose")
    return context.attempt


@task
def always_fails() -> None:
    raise ValueError("always fails on purpose")


@task
def returns_set() -> Any:
    return {1, 2}


@task
async def add_async(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task(takes_context=True, backend="short")
def sleep_once(context: Any, marker_dir: str, seconds: float) -> int:
    """Writes ``<attempt>.started``; sleeps on the first attempt only (the one a test kills)."""
    Path(marker_dir, f"{context.attempt}.{os.getpid()}.started").write_text("")
    if context.attempt == 1:
        time.sleep(seconds)
    return context.attempt


def not_a_task() -> str:
    """A plain function: a job naming it must be refused, never run."""
    Path(os.environ.get("JOBGUARD_TEST_MARKER", "/nonexistent"), "not_a_task.ran").write_text("")
    return "ran"


if TASK_TAKES_OPTIONS:

    class RetryMe(Exception):
        """Classified transient by retry_on below."""

    @task(max_attempts=2, retry_on=(RetryMe,), lock="thing:{thing_id}", atomic=True)
    def with_options(thing_id: int) -> int:
        raise RetryMe(f"thing {thing_id} not ready")

    @task(idempotency_key="thing:{thing_id}", max_attempts=1)
    def keyed(thing_id: int) -> int:
        return thing_id

    @task(idempotent=True, max_attempts=1)
    def natural(thing_id: int) -> int:
        return thing_id
