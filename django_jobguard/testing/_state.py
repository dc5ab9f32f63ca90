"""The kit's state in this process: the mode a test chose, the thread it owns, what went wrong."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..conf import get_settings
from ..conf.settings import TESTING_MODES
from .errors import JobguardTestingError

__all__ = [
    "MODES",
    "draining",
    "effective_mode",
    "is_draining",
    "mode",
    "owner",
    "problems",
    "set_owner",
]

#: "manual": jobs are stored and run when the test says (run_jobs()); "inline": run when the
#: enqueuing transaction commits.
MODES = TESTING_MODES

#: Modes chosen by tests (``inline()``, ``manual()``, a mixin's ``jobguard_mode``), innermost last.
_modes: list[str] = []
#: The thread of the test that started the kit (None: none did; inline runs on any thread).
_owner: threading.Thread | None = None
#: Errors met where they could not be raised (an enqueue on a thread the test does not own),
#: raised on the test's thread by the next kit call or the test's end.
problems: list[JobguardTestingError] = []
_local = threading.local()


def effective_mode() -> str:
    """The mode now: the innermost one a test chose, else ``JOBGUARD["TESTING"]["MODE"]``."""
    return _modes[-1] if _modes else get_settings().testing_mode


@contextmanager
def mode(name: str) -> Iterator[None]:
    """Jobs run in mode ``name`` ("manual" or "inline") inside the block."""
    if name not in MODES:
        raise JobguardTestingError(f'mode must be "manual" or "inline", not {name!r}')
    _modes.append(name)
    try:
        yield
    finally:
        _modes.pop()


def owner() -> threading.Thread | None:
    return _owner


def set_owner(thread: threading.Thread | None) -> None:
    """The thread whose test runs the jobs in inline mode (None: any thread)."""
    global _owner
    _owner = thread


def is_draining() -> bool:
    """Whether this thread is inside run_jobs() (a job it runs enqueues: the drain takes it next)."""
    return bool(getattr(_local, "draining", False))


@contextmanager
def draining() -> Iterator[None]:
    previous = is_draining()
    _local.draining = True
    try:
        yield
    finally:
        _local.draining = previous


def raise_problems() -> None:
    """Raise the first error kept for the test's thread (and forget them all)."""
    if problems:
        first = problems[0]
        problems.clear()
        raise first
