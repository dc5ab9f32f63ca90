"""Limits on outbox destinations in real jobguard_worker processes: a failing destination gets
probes, not a storm; a concurrency of 1 holds across two workers; a rate holds over a window.

The receiver is the file destination (tests/outbox/destinations.py) with a trace: each send
attempt, failing ones too, writes a line as it starts and one as it ends, whatever worker sent it.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from django_jobguard.models import Breaker, OutboxMessage
from django_jobguard.outbox import publish
from tests.conftest import WorkerProcesses, wait_for
from tests.outbox.conftest import FILE_BACKEND
from tests.outbox.destinations import check_order, most_at_once, read

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RELAY = {"RELAY_LEASE": 10.0, "RELAY_POLL_INTERVAL": 0.05, "RELAY_CONCURRENCY": 4, "RELAY_BATCH_SIZE": 20}
#: No backoff between a message's attempts: without a breaker, a destination that is down gets
#: a storm of them (every delivery thread of every worker, back to back).
ZERO_RETRY = {"base": 0.0, "max": 0.0, "jitter": 0.0}


def _declare(settings: Any, limits: dict[str, Any], destinations: dict[str, Any]) -> dict[str, str]:
    """Declare ``limits`` and ``destinations`` here and for the workers; their environment."""
    settings.JOBGUARD = {
        **settings.JOBGUARD,
        "LIMITS": {**settings.JOBGUARD.get("LIMITS", {}), **limits},
        "OUTBOX": {"DESTINATIONS": destinations, **RELAY},
    }
    return {
        "JOBGUARD_TEST_LIMITS": json.dumps(limits),
        "JOBGUARD_TEST_OUTBOX": json.dumps({"DESTINATIONS": destinations, **RELAY}),
    }


def _file(path: Path, **options: Any) -> dict[str, Any]:
    return {"BACKEND": FILE_BACKEND, "PATH": str(path), "RETRY": ZERO_RETRY, **options}


def _stop(workers: WorkerProcesses, procs: list[Any]) -> None:
    for proc in procs:
        workers.wait_started(proc)
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, workers.log(proc)


def _undelivered(destination: str) -> int:
    return OutboxMessage.objects.filter(destination=destination).exclude(state="delivered").count()


def test_a_failing_destination_opens_its_breaker_gets_probes_not_a_storm_and_closes_on_recovery(
    workers: WorkerProcesses, tmp_path: Path, settings: Any
) -> None:
    open_for = 1.0
    breaker = {"failure_rate": 1.0, "min_calls": 3, "window": 60, "open_for": open_for, "probes": 1}
    hook, other, trace = tmp_path / "hook.jsonl", tmp_path / "other.jsonl", tmp_path / "trace.jsonl"
    env = _declare(
        settings,
        {"hook-endpoint": {"breaker": breaker}},
        {
            "hook": _file(hook, LIMIT="hook-endpoint", MAX_ATTEMPTS=10_000),
            "other": _file(other),
        },
    )
    down = tmp_path / "down"
    down.touch()
    for n in range(40):
        publish("hook", {"n": n, "transient_while": str(down), "trace": str(trace)}, key=f"k{n % 4}")
        publish("other", {"n": n}, key=f"k{n % 4}")
    procs = [workers.start("--queue", "outbox-none", env=env) for _ in range(2)]

    wait_for(lambda: Breaker.objects.filter(name="hook-endpoint", state="open").exists(), 120, message="open")
    # Opened after min_calls failures, give or take the sends already under way on each thread.
    assert len(read(trace)) // 2 <= 3 + 2 * RELAY["RELAY_CONCURRENCY"]
    # The other destination is not held up by the open breaker.
    wait_for(lambda: _undelivered("other") == 0, 120, message="the other destination delivered")

    # While it is down: a probe per open_for, from one worker at a time.
    started, before = time.monotonic(), len(read(trace)) // 2
    wait_for(lambda: len(read(trace)) // 2 - before >= 4, 120, message="four probes")
    elapsed = time.monotonic() - started
    probes = len(read(trace)) // 2 - before
    assert probes <= elapsed / open_for + 2, f"{probes} attempts in {elapsed:.1f}s: a storm"
    assert read(hook) == []

    down.unlink()
    wait_for(lambda: _undelivered("hook") == 0, 120, message="every message delivered after recovery")
    _stop(workers, procs)

    assert check_order(read(hook)) == (40, 0)
    assert Breaker.objects.get(name="hook-endpoint").state == "closed"
    total = len(read(trace)) // 2
    print(f"breaker test: {total} send attempts for 40 messages ({probes} probes in {elapsed:.1f}s)")


def test_a_concurrency_of_one_holds_across_two_workers(
    workers: WorkerProcesses, tmp_path: Path, settings: Any
) -> None:
    hook, trace = tmp_path / "hook.jsonl", tmp_path / "trace.jsonl"
    env = _declare(
        settings, {"one-at-a-time": {"concurrency": 1}}, {"hook": _file(hook, LIMIT="one-at-a-time")}
    )
    for n in range(48):
        publish("hook", {"n": n, "trace": str(trace), "hold": 0.01}, key=f"k{n % 8}")
    procs = [workers.start("--queue", "outbox-none", env=env) for _ in range(2)]

    wait_for(lambda: _undelivered("hook") == 0, 180, message="every message delivered")
    _stop(workers, procs)

    lines = read(trace)
    assert check_order(read(hook)) == (48, 0)
    # Both workers claim all along (eight delivery threads); the count in the claims' turn lets
    # one key at a time through, to whichever claims first. Unlimited, four sends overlap.
    assert most_at_once(lines) == 1


def test_a_rate_holds_over_a_window_across_two_workers(
    workers: WorkerProcesses, tmp_path: Path, settings: Any
) -> None:
    hook, trace = tmp_path / "hook.jsonl", tmp_path / "trace.jsonl"
    count, per_second, burst = 30, 10, 2
    env = _declare(
        settings,
        {"paced": {"rate": f"{per_second}/s", "burst": burst}},
        {"hook": _file(hook, LIMIT="paced")},
    )
    for n in range(count):
        publish("hook", {"n": n, "trace": str(trace)}, key=f"k{n % 6}")
    procs = [workers.start("--queue", "outbox-none", env=env) for _ in range(2)]

    wait_for(lambda: _undelivered("hook") == 0, 180, message="every message delivered")
    _stop(workers, procs)

    assert check_order(read(hook)) == (count, 0)
    starts = sorted(line["t"] for line in read(trace) if line["phase"] == "start")
    assert len(starts) == count
    # GCRA on the database clock: after the burst, one send per interval. Each window of the
    # receiver's clock holds at most the rate's share of it and the burst, plus two sends of
    # slack for the time between an admission and its send on a busy host. Unlimited, the 30
    # sends take a few milliseconds each.
    interval = 1 / per_second
    for first in range(count):
        for last in range(first + burst + 2, count):
            window = starts[last] - starts[first]
            allowed = window / interval + burst + 2
            assert last - first + 1 <= allowed, f"{last - first + 1} sends in {window:.2f}s"
    span = starts[-1] - starts[0]
    print(f"rate test: {count} sends in {span:.2f}s at {per_second}/s, burst {burst}")
