"""``JobguardTestMixin``: the kit in Django's own test classes (``TestCase`` and the others)."""

from __future__ import annotations

from typing import Any

from .kit import JobguardKit

__all__ = ["JobguardTestMixin"]


class JobguardTestMixin:
    """Gives each test ``self.jobguard`` (a :class:`JobguardKit`) and checks its end.

    ``class OrderTests(JobguardTestMixin, TestCase):``; set ``jobguard_mode = "inline"`` on the
    class for inline mode (None: ``JOBGUARD["TESTING"]["MODE"]``). A ``frozen_time()`` clock
    left running, or an enqueue inline mode could not run (another thread's), fails the test.
    """

    jobguard_mode: str | None = None
    jobguard: JobguardKit

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.jobguard = JobguardKit(self.jobguard_mode).start()
        self.addCleanup(self.jobguard.close)  # type: ignore[attr-defined]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.jobguard_mode not in (None, "manual", "inline"):
            raise TypeError(
                f'{cls.__name__}.jobguard_mode must be None, "manual" or "inline", not {cls.jobguard_mode!r}'
            )
