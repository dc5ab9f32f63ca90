"""The Makefile's targets take what the README says they take."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(*args: str) -> str:
    """The commands ``make -n ARGS`` would run (nothing runs)."""
    return subprocess.run(
        ["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_make_console_listens_on_port_8000_by_default() -> None:
    assert "manage.py runserver 127.0.0.1:8000;" in dry_run("console")


def test_make_console_takes_its_port_and_address_from_variables() -> None:
    commands = dry_run("console", "PORT=8001", "ADDR=0.0.0.0")
    assert "manage.py runserver 0.0.0.0:8001;" in commands
    assert "127.0.0.1:8000" not in commands
