#!/usr/bin/env python
"""Payload encryption's cost: CPU per job with encryption on and off, 1 KiB and 100 KiB payloads.

    benchmarks/bench_encryption.py                          # both parts, medians of 5 runs
    benchmarks/bench_encryption.py --runs 3 --jobs 1000     # smaller
    benchmarks/bench_encryption.py --no-worker              # the in-process part only
    benchmarks/bench_encryption.py --database-url postgres://postgres@127.0.0.1:5432/jg_bench_encryption

Two parts, on and off interleaved run by run (on, off, off, on, ...), medians [min-max]:

- **fields** (in process, no database): what encryption adds to one job's stored fields,
  through the functions the write and read paths call: the arguments (a ``payload`` string of
  the size given and a small number) and keyword arguments sealed as the store writes them at
  enqueue and opened by the worker, and the result sealed by the worker, against the JSON
  encoding and decoding they get anyway; one row adds a failed attempt (a progress message,
  its error and traceback sealed). Microseconds per job.
- **worker** (PostgreSQL): ``--jobs`` jobs of ``bench.payload`` (``jobguard_app/tasks_encryption.py``)
  enqueued one by one in this process while one ``jobguard_worker --concurrency 1`` process,
  started for the run, given one job (not counted) and left to go idle first, drains them;
  ``JOBGUARD["ENCRYPTION"]["ALL_TASKS"]`` on or off, the same key configured either way. CPU
  per job is the enqueuing process's CPU (around the enqueue loop) plus the worker process's
  (from /proc, from idle to the last job done), over the jobs; every job is checked (succeeded,
  its arguments and result stored sealed when on and in clear when off).

The target: on within 5 % of off at 1 KiB, end to end. Exit status 1 if a run failed its checks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The key both modes configure (only ALL_TASKS differs): benchmarks only, not a secret.
KEY = "bench1:" + "QkVOQ0gtT05MWS1OT1QtQS1TRUNSRVQtMzItQllURVM"
SIZES = {"1 KiB": 1024, "100 KiB": 100 * 1024}


def payload(size: int, i: int) -> str:
    """``size`` characters, different per job (an incompressible-looking, printable string)."""
    seed = f"{i:08d}-card-4242-4242-4242-4242-address-1-rue-de-la-paix-"
    return (seed * (size // len(seed) + 1))[:size]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


# -- part 1: the fields, in process ---------------------------------------------------------------


def fields_per_job(size: int, on: bool, repeat: int, failed: bool = False) -> float:
    """Microseconds of CPU per job for its stored fields, encoded (and sealed and opened, when
    ``on``) by the functions the write and read paths call: the store's JSON of the arguments
    at enqueue, the worker's parse and opening of them, and its JSON of the result. ``failed``:
    one failed attempt as well (a progress message, the error text and the traceback sealed)."""
    from django_jobguard.encryption.payloads import (
        ARGS,
        KWARGS,
        PROGRESS,
        RESULT,
        open_json,
        seal_history_entry,
        seal_json_text,
        seal_text,
    )
    from django_jobguard.store.common import payload_json

    row = {"args": [7, payload(size, 1)], "kwargs": {"currency": "EUR", "customer": 42}, "encrypt": on}
    result = {"i": 7, "n": size}
    error, traceback = "declined", "Traceback (most recent call last): ..." * 4

    def one_job() -> None:
        stored_args, stored_kwargs = payload_json(row, "args"), payload_json(row, "kwargs")
        args, kwargs = json.loads(stored_args), json.loads(stored_kwargs)  # the claim's parse
        if on:
            args, kwargs = open_json(args, ARGS, "job.args"), open_json(kwargs, KWARGS, "job.kwargs")
        result_json = json.dumps(result)
        if on:
            result_json = seal_json_text(result, RESULT, result_json)
        if failed:
            entry = {"error": error, "traceback": traceback}
            if on:
                seal_text("charging", PROGRESS)
                entry["error"], entry["traceback"] = seal_history_entry(error, traceback)
            json.dumps([entry])

    one_job()  # warm: the cipher objects are built once per process
    start = time.process_time()
    for _ in range(repeat):
        one_job()
    return (time.process_time() - start) / repeat * 1e6


# -- part 2: enqueue and a real worker on PostgreSQL ----------------------------------------------


def jobguard_setting(on: bool) -> dict[str, Any]:
    return {"ENCRYPTION": {"KEYS": [], "KEYS_ENV": "JOBGUARD_ENCRYPTION_KEYS", "ALL_TASKS": on}}


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle(pid: int, settle: float = 0.5, timeout: float = 120) -> float:
    """Wait until process ``pid`` spends (almost) no CPU over ``settle`` seconds; its CPU then."""
    deadline = time.monotonic() + timeout
    before = proc_cpu(pid)
    while time.monotonic() < deadline:
        time.sleep(settle)
        now = proc_cpu(pid)
        if now - before < 0.02:
            return now
        before = now
    raise RuntimeError("the worker never went idle")


def e2e_run(env: dict[str, str], size: int, jobs: int, on: bool) -> dict[str, float]:
    """One worker process started for the run and left to go idle; then ``jobs`` enqueued here
    while it drains them: the enqueue's CPU (this process) and the worker's, from /proc."""
    from django.conf import settings

    from benchmarks._database import empty
    from benchmarks.jobguard_app.tasks_encryption import payload as task
    from django_jobguard.conf import reload
    from django_jobguard.encryption import is_encrypted
    from django_jobguard.models import Job

    empty(["jobguard_job", "jobguard_idempotencykey"])
    settings.JOBGUARD = {**settings.JOBGUARD, **jobguard_setting(on)}
    reload()
    data = [payload(size, i) for i in range(jobs)]
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "jobguard_worker", "--concurrency", "1", "--skip-checks"],
        cwd=ROOT,
        env={**env, "BENCH_JOBGUARD": json.dumps(jobguard_setting(on))},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # One job first, not counted: what each process does once (the first job imports the
        # cipher, 12 ms: 6 µs a job over 2,000) is not a cost per job.
        task.enqueue(-1, data[0], currency="EUR")
        deadline = time.monotonic() + 120
        while not Job.objects.filter(status="succeeded").exists():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the worker did not run the first job")
            time.sleep(0.1)
        worker_before = idle(worker.pid)
        wall = time.perf_counter()
        start = time.process_time()
        for i in range(jobs):
            task.enqueue(i, data[i], currency="EUR")
        enqueue_cpu = time.process_time() - start
        jobs += 1  # the first one, checked with the others
        deadline = time.monotonic() + 1800
        while Job.objects.filter(status="succeeded").count() < jobs:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("the worker did not drain the jobs")
            time.sleep(0.2)
        wall = time.perf_counter() - wall
        worker_cpu = proc_cpu(worker.pid) - worker_before
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    rows = list(Job.objects.values_list("status", "args", "result"))
    failed = [row for row in rows if row[0] != "succeeded"]
    if len(rows) != jobs or failed:
        raise RuntimeError(f"{len(failed)} of {len(rows)} jobs did not succeed (expected {jobs})")
    if any(is_encrypted(args) != on or is_encrypted(result) != on for _, args, result in rows):
        raise RuntimeError(f"values stored {'in clear' if on else 'sealed'} with encryption {on}")
    measured = jobs - 1
    return {
        "enqueue_us": enqueue_cpu / measured * 1e6,
        "worker_us": worker_cpu / measured * 1e6,
        "total_us": (enqueue_cpu + worker_cpu) / measured * 1e6,
        "jobs_per_s": measured / wall,
    }


def interleaved(runs: int, measure: Callable[[bool], Any]) -> dict[bool, list[Any]]:
    """``measure(on)`` ``runs`` times each, in the order on, off, off, on, on, off, ..."""
    out: dict[bool, list[Any]] = {True: [], False: []}
    for run in range(runs):
        for on in (True, False) if run % 2 == 0 else (False, True):
            out[on].append(measure(on))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="Runs of each mode (default 5); medians.")
    parser.add_argument("--jobs", type=int, default=2000, help="Jobs per worker run at 1 KiB (default 2000).")
    parser.add_argument("--jobs-large", type=int, default=300, help="Jobs per run at 100 KiB (default 300).")
    parser.add_argument(
        "--repeat", type=int, default=2000, help="Jobs per in-process measure (default 2000)."
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jg_bench_encryption"
        ),
        help="The PostgreSQL database the worker part uses (created if missing; its jobs are deleted).",
    )
    parser.add_argument("--no-worker", action="store_true", help="The in-process part only.")
    args = parser.parse_args()

    from benchmarks._database import setup_django

    os.environ["JOBGUARD_ENCRYPTION_KEYS"] = KEY
    env = setup_django(args.database_url, BENCH_ENCRYPTION="1", JOBGUARD_ENCRYPTION_KEYS=KEY)
    status = 0

    print("## Fields: CPU per job for its stored fields (µs), in process\n")
    print("| payload | off | on | on - off |")
    print("| --- | --- | --- | --- |")
    cases = [(label, size, False) for label, size in SIZES.items()]
    cases.append(("1 KiB, a failed attempt too", 1024, True))
    for label, size, failed in cases:
        repeat = args.repeat if size <= 1024 else max(args.repeat // 20, 50)
        found = interleaved(
            args.runs,
            lambda on, size=size, repeat=repeat, failed=failed: fields_per_job(size, on, repeat, failed),
        )
        delta = statistics.median(found[True]) - statistics.median(found[False])
        print(f"| {label} | {spread(found[False])} | {spread(found[True])} | {delta:+.1f} |")
    sys.stdout.flush()
    if args.no_worker:
        return status

    print("\n## Worker: CPU per job (µs), enqueue in process + one worker process, PostgreSQL\n")
    e2e_run(env, 1024, 200, False)  # warm-up, not counted: the database's caches, this process's ORM
    print("| payload | metric | off | on | on / off |")
    print("| --- | --- | --- | --- | --- |")
    for label, size in SIZES.items():
        jobs = args.jobs if size <= 1024 else args.jobs_large
        try:
            found = interleaved(args.runs, lambda on, size=size, jobs=jobs: e2e_run(env, size, jobs, on))
        except RuntimeError as exc:
            print(f"| {label} | failed: {exc} | | | |")
            status = 1
            continue
        for metric in ("total_us", "enqueue_us", "worker_us", "jobs_per_s"):
            off = [run[metric] for run in found[False]]
            on_ = [run[metric] for run in found[True]]
            ratio = statistics.median(on_) / statistics.median(off) if statistics.median(off) else 0.0
            print(f"| {label} ({jobs} jobs) | {metric} | {spread(off)} | {spread(on_)} | {ratio:.3f} |")
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
