"""Options and fixtures of the reliability suite (loaded from ``tests/conftest.py``).

``--reliability-seed N`` replays a run's random choices (which worker is killed when,
which fault point fires, which enqueue is rolled back); every artifact records its
seed. ``--reliability-soak`` multiplies job counts and chaos time by 5.
``--reliability-outbox-full`` runs T14 (the outbox under SIGKILLs) at the issue's full size.
``--reliability-pg-restart-cmd CMD`` enables T3's PostgreSQL restart step (it restarts
the server the suite runs on: never point it at a shared server).
"""

from __future__ import annotations

import dataclasses
import platform
import random
import secrets
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SOAK_FACTOR = 5


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("reliability", "fault-injection suite (tests/reliability)")
    group.addoption(
        "--reliability-seed",
        type=int,
        default=None,
        help="Seed of the chaos (kills, fault points, rolled-back enqueues); random by default.",
    )
    group.addoption(
        "--reliability-soak",
        action="store_true",
        default=False,
        help=f"Soak size: {SOAK_FACTOR}x the jobs and chaos time of each scenario.",
    )
    group.addoption(
        "--reliability-outbox-full",
        action="store_true",
        default=False,
        help="T14 at the outbox issue's size: 50,000 messages over 1,000 keys, 20 SIGKILLs per destination.",
    )
    group.addoption(
        "--reliability-pg-restart-cmd",
        default=None,
        help=(
            "Shell command that restarts the PostgreSQL server under test, for T3's restart "
            "step (e.g. 'pg_ctlcluster 15 main restart'). Skipped without it."
        ),
    )


_SEED: int | None = None


def session_seed(config: pytest.Config) -> int:
    global _SEED
    if _SEED is None:
        given = config.getoption("--reliability-seed")
        _SEED = int(given) if given is not None else secrets.randbelow(1_000_000)
    return _SEED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _SEED is not None:
        terminalreporter.write_line(
            f"reliability: seed {_SEED}; figures in artifacts/reliability/; "
            f"re-run with --reliability-seed={_SEED}"
        )


@dataclasses.dataclass
class Scenario:
    """One scenario run: its id, seed, random source, history and figures."""

    id: str
    seed: int
    scale: float
    soak: bool
    rng: random.Random
    history: Any
    request: pytest.FixtureRequest
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    skipped_steps: dict[str, str] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.time)

    def size(self, base: int) -> int:
        return max(1, round(base * self.scale))

    def finish(self, **figures: Any) -> dict[str, Any]:
        """Run the invariant queries, write the artifact; returns the invariant violations."""
        from . import harness

        self.figures.update(figures)
        violations = harness.invariant_violations()
        self.figures["invariant_violations"] = {name: len(ids) for name, ids in violations.items()}
        self.figures["invariant_violation_ids"] = {name: ids[:20] for name, ids in violations.items() if ids}
        self.write()
        return violations

    def write(self) -> Path:
        from . import harness

        node = self.request.node
        command = (
            f"JOBGUARD_TEST_DATABASE_URL=... python -m pytest '{node.nodeid}' --reliability-seed={self.seed}"
            + (" --reliability-soak" if self.soak else "")
        )
        return harness.write_artifact(
            self.id,
            {
                "scenario": self.id,
                "test": node.nodeid,
                "seed": self.seed,
                "soak": self.soak,
                "command": command,
                "parameters": self.parameters,
                "figures": self.figures,
                "skipped_steps": self.skipped_steps,
                "duration_seconds": round(time.time() - self.started, 2),
                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "python": platform.python_version(),
                "argv": shlex.join(sys.argv[1:]),
            },
        )


@pytest.fixture
def scenario(request: pytest.FixtureRequest, tmp_path: Path, transactional_db: None) -> Iterator[Scenario]:
    """A scenario with its history and, on PostgreSQL, the transition trigger installed."""
    from django.db import connection

    from . import harness

    marker = request.node.get_closest_marker("scenario")
    scenario_id = marker.args[0] if marker else request.node.name
    seed = session_seed(request.config)
    soak = bool(request.config.getoption("--reliability-soak"))
    pg = connection.vendor == "postgresql"
    if pg:
        harness.install_transition_trigger()
    run = Scenario(
        id=scenario_id,
        seed=seed,
        scale=SOAK_FACTOR if soak else 1.0,
        soak=soak,
        rng=harness.env_seed(seed, scenario_id),
        history=harness.History(tmp_path / "history"),
        request=request,
    )
    try:
        yield run
    finally:
        if pg:
            connection.close()  # a scenario may have left it broken (terminated, restarted)
            harness.drop_transition_trigger()


@pytest.fixture
def observer(transactional_db: None) -> Iterator[Any]:
    """A separate autocommit psycopg connection for watching the database during chaos."""
    from . import harness

    conn = harness.observer_connection()
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def stub() -> Iterator[Any]:
    """The loopback provider stub, counting requests per idempotency key."""
    from .harness import ProviderStub

    with ProviderStub() as provider:
        yield provider
