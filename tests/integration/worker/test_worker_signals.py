"""The worker's signal handler must not deadlock the thread it interrupts."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import signal
    import django

    django.setup()
    from django_jobguard.worker import Worker

    worker = Worker(burst=True)
    worker._install_signal_handlers()
    # A signal that lands while the main thread is inside Event.clear() (it holds the
    # Event's lock): the handler must return, and the Events must still be set.
    with worker.slots._freed._cond:
        signal.raise_signal(signal.SIGINT)
    with worker._wake._cond:
        signal.raise_signal(signal.SIGINT)
    assert worker._stopping and worker._forced and worker.slots.closed
    assert worker.slots.wait_freed(10) and worker._wake.wait(10)
    print("ok")
    """
)


def test_a_signal_landing_while_the_main_thread_holds_an_event_lock_does_not_deadlock():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    # A separate process: the old handler would hang it for good, which the timeout turns
    # into a failure instead of a stuck test run.
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
