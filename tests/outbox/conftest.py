from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_jobguard.conf import get_settings

FILE_BACKEND = "tests.outbox.destinations.FileDestination"


def outbox_settings(tmp_path: Path, **relay: Any) -> dict[str, Any]:
    """JOBGUARD["OUTBOX"] for a test: "events" holds (the default), "feed" skips; zero backoff."""
    retry = {"base": 0.0, "max": 0.0, "jitter": 0.0}
    return {
        "DESTINATIONS": {
            "events": {"BACKEND": FILE_BACKEND, "PATH": str(tmp_path / "events.jsonl"), "RETRY": retry},
            "feed": {
                "BACKEND": FILE_BACKEND,
                "PATH": str(tmp_path / "feed.jsonl"),
                "ON_FAILURE": "skip",
                "MAX_ATTEMPTS": 3,
                "RETRY": retry,
            },
        },
        **relay,
    }


@pytest.fixture
def outbox(tmp_path: Path, settings: Any) -> Iterator[Path]:
    """The test's outbox destinations; yields the directory their files are written in."""
    with override_settings(JOBGUARD={**settings.JOBGUARD, "OUTBOX": outbox_settings(tmp_path)}):
        assert "events" in get_settings().outbox.destinations
        yield tmp_path
