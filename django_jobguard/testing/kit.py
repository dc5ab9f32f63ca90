"""``JobguardKit``: the helpers bound to one test, which the pytest fixture and the mixin hand out.

Starting a kit makes the test's thread the one inline mode runs jobs on and applies the mode
the test asked for; closing it (the test's end) takes the mode back, stops a clock left running
and raises what went wrong where it could not be raised (:class:`ClockLeftRunningError`, an
:class:`InlineThreadError` met on another thread).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from django.test import override_settings

from . import _state
from .assertions import assert_enqueued, enqueued_jobs, refute_enqueued
from .clock import frozen_time, stop_all_clocks
from .errors import JobguardTestingError
from .runner import RunSummary, drain, run_jobs

__all__ = ["JobguardKit", "jobguard_settings"]


def jobguard_settings(**overrides: Any) -> override_settings:
    """``override_settings`` of some ``JOBGUARD`` keys, the others kept: ``jobguard_settings(RETRY={...})``.

    A group given whole replaces that group (as ``JOBGUARD`` itself would).
    """
    from django.conf import settings

    current = dict(getattr(settings, "JOBGUARD", None) or {})
    return override_settings(JOBGUARD={**current, **overrides})


class JobguardKit:
    """The test kit for one test: ``kit.assert_enqueued(...)``, ``kit.run_jobs()``, ``kit.frozen_time()``."""

    assert_enqueued = staticmethod(assert_enqueued)
    refute_enqueued = staticmethod(refute_enqueued)
    enqueued_jobs = staticmethod(enqueued_jobs)
    frozen_time = staticmethod(frozen_time)

    def __init__(self, mode: str | None = None) -> None:
        if mode is not None and mode not in _state.MODES:
            raise JobguardTestingError(f'mode must be "manual" or "inline", not {mode!r}')
        self.mode = mode
        self._stack = contextlib.ExitStack()
        self._previous_owner: threading.Thread | None = None
        self.started = False

    def start(self) -> JobguardKit:
        """The test begins: its thread owns inline runs; its mode applies."""
        self._previous_owner = _state.owner()
        _state.set_owner(threading.current_thread())
        _state.problems.clear()
        if self.mode is not None:
            self._stack.enter_context(_state.mode(self.mode))
        self.started = True
        return self

    def close(self) -> None:
        """The test ends: modes and settings back; a clock left running or a kept error raises."""
        if not self.started:
            return
        self.started = False
        try:
            self._stack.close()
        finally:
            _state.set_owner(self._previous_owner)
            try:
                stop_all_clocks()
            finally:
                _state.raise_problems()

    def run_jobs(self, **options: Any) -> RunSummary:
        """Run the due jobs here (see :func:`~django_jobguard.testing.run_jobs`)."""
        return run_jobs(**options)

    def drain(self, queue: str, **options: Any) -> RunSummary:
        """Run the due jobs of one queue (see :func:`~django_jobguard.testing.drain`)."""
        return drain(queue, **options)

    @contextlib.contextmanager
    def inline(self) -> Iterator[None]:
        """Inline mode inside the block: jobs run when their transaction commits."""
        with _state.mode("inline"):
            yield

    @contextlib.contextmanager
    def manual(self) -> Iterator[None]:
        """Manual mode inside the block: jobs are stored; the test runs them with run_jobs()."""
        with _state.mode("manual"):
            yield

    def settings(self, **overrides: Any) -> None:
        """Override ``JOBGUARD`` keys until the test ends (the other keys kept)."""
        self._stack.enter_context(jobguard_settings(**overrides))
