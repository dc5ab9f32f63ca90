"""A retry storm against a dependency that is down for a minute, with and without a breaker.

Worker processes (``--processes`` x ``jobguard_worker --concurrency 4``) serve a task that
calls a dependency; jobs arrive at ``--rate`` a second throughout. The dependency fails every
call (after 10 ms) for ``--outage`` seconds, then answers again. The task retries transient
failures (backoff 1 s doubling to 10 s, jitter 1 s, 8 attempts). Two runs:

- ``no breaker``: the task's named limit has no breaker and no retry budget;
- ``breaker + budget``: ``"breaker": True, "retry_budget": True`` (the defaults: opens at 50 %
  of at least 20 calls in 60 s, open 30 s, 5 probes; retries at most 20 % of first attempts,
  at least 10, per 60 s).

Reported per run (medians of ``--runs``): calls that reached the dependency while it was down,
how many of those were retries, jobs dead-lettered, the most calls in any second of the
outage, and the seconds from recovery until every job had succeeded.

    python benchmarks/bench_breaker.py --db-url postgres://postgres@127.0.0.1:5432/jg_breaker_bench
    python benchmarks/bench_breaker.py --db-url mysql://root@127.0.0.1:3306/jg_breaker_bench

The database is created and migrated if missing, and emptied before each run. Prints a table.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "no breaker": {"bench-dep": {"concurrency": 1000}},
    "breaker + budget": {"bench-dep": {"concurrency": 1000, "breaker": True, "retry_budget": True}},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--db-url",
        "--pg-url",
        dest="db_url",
        default="postgres://postgres@127.0.0.1:5432/jg_breaker_bench",
        help="postgres:// or mysql:// URL",
    )
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the dependency is down")
    parser.add_argument("--rate", type=float, default=20.0, help="jobs enqueued per second")
    parser.add_argument("--processes", type=int, default=4, help="worker processes")
    parser.add_argument("--runs", type=int, default=1, help="runs of each (the median is reported)")
    return parser.parse_args()


def setup(args: argparse.Namespace) -> dict[str, str]:
    from benchmarks._database import setup_django

    return setup_django(
        args.db_url,
        BENCH_BREAKER="1",
        BENCH_JOBGUARD=json.dumps({"LIMITS": CONFIGS["no breaker"]}),
        BENCH_OUTAGE_FROM="0",
        BENCH_OUTAGE_UNTIL="0",
    )


def storm(env: dict[str, str], limits: dict[str, object], args: argparse.Namespace) -> dict[str, float]:
    """One run: workers up, the outage, jobs at ``args.rate``/s until it is over plus 10 s."""
    from django.db import connection
    from django.utils.dateparse import parse_datetime

    from benchmarks._common import paced
    from benchmarks._database import empty
    from benchmarks.jobguard_app.tasks_breaker import call_dependency
    from django_jobguard.models import DeadLetter, Job

    empty(["jobguard_job", "jobguard_flowrate", "jobguard_breaker", "jobguard_breakerevent"])
    began = time.time() + 8  # the workers start first
    down_until = began + args.outage
    run_env = {
        **env,
        "BENCH_JOBGUARD": json.dumps({"LIMITS": limits}),
        "BENCH_OUTAGE_FROM": str(began),
        "BENCH_OUTAGE_UNTIL": str(down_until),
    }
    command = [
        sys.executable,
        "-m",
        "django",
        "jobguard_worker",
        "--queue",
        "bench-dep",
        "--concurrency",
        "4",
    ]
    workers = [
        subprocess.Popen(command, cwd=ROOT, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(args.processes)
    ]
    try:
        time.sleep(max(0.0, began - time.time()))
        total = int(args.rate * (args.outage + 10))
        enqueuer = threading.Thread(
            target=lambda: [call_dependency.enqueue(i) for i in paced(range(total), args.rate)]
        )
        enqueuer.start()
        enqueuer.join()
        connection.close()  # the thread's connection is its own; this one waited idle
        while Job.objects.filter(status__in=["queued", "running"]).exists():
            time.sleep(0.2)
        drained = time.time() - down_until
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
    calls: list[tuple[float, bool]] = []
    for history in Job.objects.values_list("attempt_history", flat=True):
        for n, entry in enumerate(history):
            at = parse_datetime(entry["started_at"])
            if at is not None and began <= at.timestamp() < down_until:
                calls.append((at.timestamp(), n > 0))
    per_second = Counter(int(at - began) for at, _ in calls)
    return {
        "calls_down": len(calls),
        "retries_down": sum(1 for _, retry in calls if retry),
        "peak": max(per_second.values(), default=0),
        "dead": DeadLetter.objects.count(),
        "jobs": total,
        "drained": drained,
    }


def main() -> None:
    args = parse_args()
    env = setup(args)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    results: dict[str, list[dict[str, float]]] = {name: [] for name in CONFIGS}
    for _ in range(args.runs):
        for name, limits in CONFIGS.items():
            results[name].append(storm(env, limits, args))
    headers = (
        "run",
        "jobs",
        "calls while down",
        "of them retries",
        "peak calls/s",
        "dead-lettered",
        "drained after",
    )
    rows = []
    for name, runs in results.items():
        rows.append(
            (
                name,
                f"{median([r['jobs'] for r in runs]):,.0f}",
                f"{median([r['calls_down'] for r in runs]):,.0f}",
                f"{median([r['retries_down'] for r in runs]):,.0f}",
                f"{median([r['peak'] for r in runs]):,.0f}",
                f"{median([r['dead'] for r in runs]):,.0f}",
                f"{median([r['drained'] for r in runs]):,.1f} s",
            )
        )
    print(
        f"outage {args.outage:g} s, {args.rate:g} jobs/s, {args.processes} processes x 4, "
        f"median of {args.runs} run(s)"
    )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
