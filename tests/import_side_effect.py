"""A module that must never be imported by a worker: importing it leaves a file behind.

Not in an installed app, so a job row naming it (``tests.import_side_effect.anything``) is
refused before any import (tests/backends/test_contract.py).
"""

import os
from pathlib import Path

Path(os.environ.get("JOBGUARD_TEST_MARKER", "."), "imported").touch()


def anything() -> None:
    """Never called."""
