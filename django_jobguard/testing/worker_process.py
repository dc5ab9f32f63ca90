"""A real ``jobguard_worker`` process on the test's database, for tests that need one.

Started by the ``jobguard_worker`` pytest fixture (or by hand: ``WorkerProcess(log_path).start()``)
with the project's settings, the alias pointed at the test database (:data:`BOOTSTRAP`).
The test needs committed rows (``transaction=True``, ``TransactionTestCase``): a worker in
another process cannot see a ``TestCase``'s transaction, and the database must be one a
second process can open (not SQLite in memory).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import JobguardTestingError

__all__ = ["BOOTSTRAP", "WorkerProcess"]

#: Seconds a worker may take to start (its first beat row) on a loaded machine.
START_TIMEOUT_SECONDS = 120.0
#: Seconds a stopping worker gets to finish (SIGTERM), then it is killed.
STOP_TIMEOUT_SECONDS = 60.0
#: How often wait_until() asks again, in seconds.
POLL_SECONDS = 0.05
#: The worker process's entry (``python -c BOOTSTRAP ALIAS NAME ARGS...``): the project's
#: settings with the alias pointed at the test database before Django starts, then
#: ``jobguard_worker ARGS``. Not a module of this package: importing the package needs Django set up.
BOOTSTRAP = (
    "import sys, django\n"
    "from django.conf import settings\n"
    "settings.DATABASES[sys.argv[1]]['NAME'] = sys.argv[2]\n"
    "django.setup()\n"
    "from django.core.management import execute_from_command_line\n"
    "execute_from_command_line(['jobguard_worker', 'jobguard_worker', *sys.argv[3:]])\n"
)


class WorkerProcess:
    """One ``jobguard_worker`` subprocess on the test's database."""

    def __init__(self, log_path: Path, *args: str, using: str | None = None) -> None:
        self.log_path = log_path
        self.args = list(args)
        self.using = using
        self.worker_id = f"testing-worker:{uuid.uuid4().hex[:8]}"
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> WorkerProcess:
        """Start the worker and wait until its first beat is in the database."""
        from django.db import connections

        from ..conf import get_settings

        alias = self.using = self.using or get_settings().database_alias
        connection = connections[alias]
        name = str(connection.settings_dict["NAME"])
        if connection.vendor == "sqlite" and (name == ":memory:" or "mode=memory" in name):
            raise JobguardTestingError(
                "jobguard_worker needs a database another process can open, and the test database "
                f"of {alias!r} is SQLite in memory: set DATABASES[{alias!r}]['TEST']['NAME'] to a file."
            )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
        command = [
            sys.executable,
            "-c",
            BOOTSTRAP,
            alias,
            name,
            "--worker-id",
            self.worker_id,
            *self.args,
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # noqa: S603 - a fixed command line of our own
                command, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.wait_until(self._beating, timeout=timeout, message="the worker to start (its first beat)")
        return self

    def _beating(self) -> bool:
        from ..models import WorkerBeat

        return WorkerBeat.objects.using(self.using).filter(worker_id=self.worker_id).exists()

    def log(self) -> str:
        """What the worker wrote so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_until(self, predicate: Callable[[], Any], *, timeout: float = 60.0, message: str = "") -> Any:
        """Wait for ``predicate()`` to be true (its value is returned); an error after ``timeout`` seconds.

        An error at once if the worker exited meanwhile, with the end of its log.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.process is not None and self.process.poll() is not None:
                raise JobguardTestingError(
                    f"the worker exited with code {self.process.returncode} while waiting for "
                    f"{message or predicate!r}; its log ends:\n{self.log()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise JobguardTestingError(
                    f"waited {timeout:g} s for {message or predicate!r}; "
                    f"the worker's log ends:\n{self.log()[-3000:]}"
                )
            time.sleep(POLL_SECONDS)

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int:
        """Stop the worker as a supervisor would (SIGTERM); its exit code (killed after ``timeout`` s)."""
        process = self.process
        if process is None:
            raise JobguardTestingError("this worker was never started")
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.exit_code = process.returncode
        return self.exit_code
