"""The tutorial works: every file, command and shell session of it, run in an empty directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial" / "index.md"
DRIVER = Path(__file__).with_name("tutorial_driver.py")

pytestmark = [pytest.mark.processes, pytest.mark.slow]


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "JOBGUARD_"))}
    # This checkout's django_jobguard, not whichever copy the interpreter has installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, str(DRIVER), str(PAGE), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "TUTORIAL OK" in result.stdout
