"""The errors the test kit raises when it is used in a way that cannot work."""

from __future__ import annotations

from ..exceptions import JobguardError

__all__ = ["ClockLeftRunningError", "InlineThreadError", "JobguardTestingError"]


class JobguardTestingError(JobguardError):
    """The test kit was used in a way that cannot work (the message says what to do instead)."""


class InlineThreadError(JobguardTestingError):
    """Inline mode was asked to run jobs on a thread the test does not own."""


class ClockLeftRunningError(JobguardTestingError):
    """A ``frozen_time()`` clock was still running when the test ended."""
