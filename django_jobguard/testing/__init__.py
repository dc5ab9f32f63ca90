"""The test kit: assert what was enqueued, run it in the test, move the clock.

::

    from django_jobguard.testing import assert_enqueued, run_jobs, frozen_time

    def test_checkout_sends_the_receipt(client):
        client.post("/checkout/", {...})
        assert_enqueued(send_receipt, kwargs={"order_id": 1})
        summary = run_jobs()
        assert summary.succeeded == 1

Modes (``JOBGUARD["TESTING"]["MODE"]``, or per test): *manual*, the default, stores jobs and
runs them when the test calls :func:`run_jobs`; *inline* runs them when the enqueuing
transaction commits (in a ``TestCase`` too), never before, and never after a rollback.
:func:`run_jobs` runs the due jobs on the test's thread through the worker's own pipeline:
idempotency, locks, retries and their classification, dead letters, workflows, flow limits.
:func:`frozen_time` makes backoffs, delays, leases and schedules pass without sleeping.
pytest fixtures: ``pytest_plugins = ["django_jobguard.testing.pytest_plugin"]``; Django's test
classes: :class:`JobguardTestMixin`. See docs/how-to/test-your-tasks.md.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from . import modes as _modes
from ._state import mode
from .assertions import assert_enqueued, enqueued_jobs, refute_enqueued
from .case import JobguardTestMixin
from .clock import FrozenClock, active_clocks, frozen_time
from .errors import ClockLeftRunningError, InlineThreadError, JobguardTestingError
from .kit import JobguardKit, jobguard_settings
from .runner import RunSummary, drain, run_jobs

__all__ = [
    "ClockLeftRunningError",
    "FrozenClock",
    "InlineThreadError",
    "JobguardKit",
    "JobguardTestMixin",
    "JobguardTestingError",
    "RunSummary",
    "active_clocks",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "frozen_time",
    "inline",
    "jobguard_settings",
    "manual",
    "mode",
    "refute_enqueued",
    "run_jobs",
]


def inline() -> AbstractContextManager[None]:
    """Inline mode inside the block: ``with inline(): ...`` (jobs run when their transaction commits)."""
    return mode("inline")


def manual() -> AbstractContextManager[None]:
    """Manual mode inside the block: jobs are stored; the test runs them with :func:`run_jobs`."""
    return mode("manual")


_modes.install()
