#!/usr/bin/env python
"""Run the timing-sensitive tiers several times in a row on a machine kept busy, and count failures.

    python tests/stress.py [--runs 5] [--tiers processes,reliability,browser] [--hogs 2]
                           [-- extra pytest arguments]

``make test-stress`` runs it (``STRESS_ARGS="--runs 1 --tiers processes"`` to narrow it). The
suite's database and Redis come from the same variables as ``make test``
(``JOBGUARD_TEST_DATABASE_URL``, ``JOBGUARD_TEST_REDIS_URL``); without them, SQLite.

While the tiers run, ``--hogs`` busy processes (a Python loop each, one per core by default)
compete with the workers for the CPU, as on a loaded CI host: a test that waits a fixed
time, or asserts the order of a race the code allows, fails here first. The hogs are
killed however this script ends. The table at the end lists every test that failed in any
run, with its count, and the wall time of each run; the exit code is 1 if anything failed.
A failure found here is fixed at its cause: nothing is re-run to make it pass.

T3's PostgreSQL restart step runs only with ``--reliability-pg-restart-cmd`` (given after
``--``), so by default nothing restarts a server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The tiers whose outcome depends on timing: real worker processes, the fault suite, the browser.
TIERS: dict[str, list[str]] = {
    "processes": ["tests/processes", "tests/backends/test_worker_processes.py"],
    "reliability": ["tests/reliability"],
    "browser": ["tests/browser", "-m", "browser"],
}

HOG = "while True:\n    pass\n"


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def failed_tests(report: Path) -> tuple[list[str], int]:
    """The ids of the tests that failed or errored in a JUnit report, and how many ran."""
    if not report.exists():
        return ["<pytest wrote no report>"], 0
    failed, ran = [], 0
    # The report is pytest's own, written a moment ago in a private directory.
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314
        if case.find("skipped") is not None:
            continue
        ran += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return failed, ran


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="Rounds of every tier (default 5).")
    parser.add_argument("--tiers", default=",".join(TIERS), help=f"Comma list of {', '.join(TIERS)}.")
    parser.add_argument(
        "--hogs", type=int, default=os.cpu_count() or 2, help="Busy processes (default: cores)."
    )
    parser.add_argument("pytest_args", nargs="*", help="After --: passed to every pytest run.")
    options = parser.parse_args()
    tiers = [tier.strip() for tier in options.tiers.split(",") if tier.strip()]
    unknown = [tier for tier in tiers if tier not in TIERS]
    if unknown or options.runs < 1 or options.hogs < 0:
        parser.error(f"unknown tiers {unknown}" if unknown else "--runs must be 1 or more, --hogs 0 or more")

    database = "PostgreSQL" if os.environ.get("JOBGUARD_TEST_DATABASE_URL") else "SQLite"
    redis = " + Redis" if os.environ.get("JOBGUARD_TEST_REDIS_URL") else ""
    print(f"stress: {options.runs} run(s) of {', '.join(tiers)} on {database}{redis}, {options.hogs} hog(s)")
    failures: Counter[str] = Counter()
    walls: dict[str, list[float]] = {tier: [] for tier in tiers}
    counts: dict[str, int] = {}
    started = time.monotonic()
    hogs = start_hogs(options.hogs)
    try:
        with tempfile.TemporaryDirectory(prefix="jobguard-stress-") as directory:
            for run in range(1, options.runs + 1):
                for tier in tiers:
                    report = Path(directory) / f"{tier}-{run}.xml"
                    command = [
                        sys.executable,
                        "-m",
                        "pytest",
                        "-q",
                        "-p",
                        "no:cacheprovider",
                        f"--junitxml={report}",
                        *TIERS[tier],
                        *options.pytest_args,
                    ]
                    began = time.monotonic()
                    code = subprocess.call(command, cwd=ROOT)
                    walls[tier].append(time.monotonic() - began)
                    failed, ran = failed_tests(report)
                    if code not in (0, 5) and not failed:
                        failed = [f"<pytest exited {code} in the {tier} tier>"]
                    failures.update(failed)
                    counts[tier] = max(counts.get(tier, 0), ran)
                    print(
                        f"stress: run {run}/{options.runs} {tier}: {ran} ran, {len(failed)} failed, "
                        f"{walls[tier][-1]:.0f} s",
                        flush=True,
                    )
    finally:
        stop_hogs(hogs)

    print()
    print(f"{database}{redis}, {options.hogs} hog(s):")
    print("| tier | tests | runs | wall time per run (s) |")
    print("| --- | --- | --- | --- |")
    for tier in tiers:
        times = ", ".join(f"{wall:.0f}" for wall in walls[tier])
        print(f"| {tier} | {counts.get(tier, 0)} | {len(walls[tier])} | {times} |")
    print()
    if failures:
        print("| failures | test |")
        print("| --- | --- |")
        for test, count in failures.most_common():
            print(f"| {count} of {options.runs} | {test} |")
    print(f"stress: {sum(failures.values())} failures in {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
