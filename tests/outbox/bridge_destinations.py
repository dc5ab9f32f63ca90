"""The "jobs" destination with a pause after its enqueue committed, for the bridge's crash tests.

``PausingJobsDestination`` enqueues as the built-in one does; then, the first time it sends a
message whose call has a ``marker`` argument starting with "pause", it writes
``<PAUSE_DIR>/<message id>`` and waits there (before the relay records the delivery) until its
process is killed. A later send of the same message finds the file and
returns at once: that is the send the test checks makes no second job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from django_jobguard.outbox.destinations.base import Envelope
from django_jobguard.outbox.destinations.jobs import JobsDestination

#: Seconds a paused send waits for the kill before it gives up (the test fails meanwhile).
PAUSE_SECONDS = 600.0


class PausingJobsDestination(JobsDestination):
    backend: ClassVar[str] = "tests-pausing-jobs"

    def __init__(self, name: str, pause_dir: str) -> None:
        super().__init__(name)
        self.pause_dir = Path(pause_dir)

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> PausingJobsDestination:
        unknown = set(options) - {"PAUSE_DIR"}
        if unknown or not isinstance(options.get("PAUSE_DIR"), str):
            raise ValueError(
                f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}] takes PAUSE_DIR (a directory) only"
            )
        return cls(name, options["PAUSE_DIR"])

    def send(self, envelope: Envelope) -> None:
        super().send(envelope)  # the job is committed in the jobs database from here on
        kwargs = envelope.payload.get("kwargs") or {}
        if not str(kwargs.get("marker", "")).startswith("pause"):
            return
        marker = self.pause_dir / envelope.id
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return  # sent before: this is the resend
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        # Until the test kills this process (or releases the send), within a generous deadline.
        release = self.pause_dir / f"{envelope.id}.release"
        deadline = time.monotonic() + PAUSE_SECONDS
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
