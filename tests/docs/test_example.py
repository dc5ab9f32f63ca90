"""The README's first command: the example shop's demo, run on a fresh copy of the project."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.processes, pytest.mark.slow]


def manage(project: Path, *args: str, stderr: bool = False) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "JOBGUARD_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout + result.stderr if stderr else result.stdout


def test_the_example_shop_charges_once_dead_letters_the_declined_card_and_audits_clean(
    tmp_path: Path,
) -> None:
    project = tmp_path / "example_project"
    shutil.copytree(
        ROOT / "example_project", project, ignore=shutil.ignore_patterns("db.sqlite3*", "__pycache__")
    )
    manage(project, "migrate", "--verbosity", "0")
    out = manage(project, "shop_demo")
    assert re.search(r"^  payments\s+succeeded\s+2$", out, re.M), out
    assert re.search(r"^  payments\s+dead\s+1$", out, re.M), out
    assert re.search(r"^  emails\s+succeeded\s+3$", out, re.M), out
    assert "duplicate enqueues stopped by idempotency keys: 3" in out
    assert "payments recorded: 2, provider charges: 2" in out
    assert "order summaries invalidated after their payment committed: 2 of 3" in out
    assert re.search(r"dead letter #\d+: shop\.tasks\.charge_order .* -> permanent_error", out), out
    assert "consistency audit: nothing found" in out
    assert "jobguard audit: nothing found" in manage(project, "jobguard_audit")
    # The example follows the docs' checklist: no jobguard check has anything to say, with the
    # durations the demo just recorded either.
    checked = manage(project, "check", "--database", "default", stderr=True)
    assert "(jobguard." not in checked, checked
    assert "System check identified no issues" in checked, checked
