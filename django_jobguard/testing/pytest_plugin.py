"""pytest fixtures of the test kit: ``jobguard``, ``jobguard_settings`` and ``jobguard_worker``.

Enable it in the project's top ``conftest.py``::

    pytest_plugins = ["django_jobguard.testing.pytest_plugin"]

Needs pytest-django. Nothing is imported from Django or django-jobguard until a fixture runs,
so loading the plugin costs nothing. ``@pytest.mark.jobguard(mode="inline")`` picks a test's
mode. Every test, with the fixture or not, fails if it leaves a ``frozen_time()`` clock running.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .kit import JobguardKit
    from .worker_process import WorkerProcess


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        'jobguard(mode): the test kit\'s mode for this test, "manual" or "inline" (django_jobguard.testing)',
    )


def _mode(request: pytest.FixtureRequest) -> str | None:
    marker = request.node.get_closest_marker("jobguard")
    if marker is None:
        return None
    mode = marker.kwargs.get("mode", marker.args[0] if marker.args else None)
    return str(mode) if mode is not None else None


@pytest.fixture
def jobguard(request: pytest.FixtureRequest) -> Iterator[JobguardKit]:
    """The test kit for this test: ``jobguard.assert_enqueued(...)``, ``jobguard.run_jobs()``, ...

    Its mode is the marker's (``@pytest.mark.jobguard(mode="inline")``), else the settings'.
    """
    from .kit import JobguardKit

    kit = JobguardKit(_mode(request)).start()
    try:
        yield kit
    finally:
        kit.close()


@pytest.fixture
def jobguard_settings() -> Iterator[Callable[..., None]]:
    """Override ``JOBGUARD`` keys for this test, the others kept: ``jobguard_settings(RETRY={...})``."""
    from .kit import jobguard_settings as override

    applied: list[Any] = []

    def apply(**overrides: Any) -> None:
        change = override(**overrides)
        change.enable()
        applied.append(change)

    yield apply
    for change in reversed(applied):
        change.disable()


@pytest.fixture
def jobguard_worker(transactional_db: None, tmp_path: Path) -> Iterator[WorkerProcess]:
    """A real ``jobguard_worker`` process on the test database, started, and stopped (SIGTERM) after.

    The test's rows must be committed for it to see them: the fixture makes the test a
    ``transaction=True`` one. Its log: ``jobguard_worker.log()``; wait on what it does with
    ``jobguard_worker.wait_until(predicate, timeout=...)``. A worker that does not exit 0 when
    stopped fails the test.
    """
    from .worker_process import WorkerProcess

    worker = WorkerProcess(tmp_path / "jobguard-worker.log").start()
    try:
        yield worker
    finally:
        code = worker.stop()
        if code != 0:
            pytest.fail(
                f"the jobguard_worker process exited with code {code}; its log ends:\n{worker.log()[-3000:]}"
            )


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A ``frozen_time()`` clock left running fails the test that left it (and is stopped)."""
    clock = sys.modules.get("django_jobguard.testing.clock")
    if clock is not None and clock.active_clocks():
        clock.stop_all_clocks()  # raises ClockLeftRunningError, naming the clock
