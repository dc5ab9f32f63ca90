"""What tracing costs a project that leaves it off: the untraced claim-and-ack path's bound.

With ``JOBGUARD["OPENTELEMETRY"]`` off nothing imports OpenTelemetry, but the path still runs
what tracing added to it: two setting reads on enqueue, one more (NULL) column in the job's
INSERT, one branch per job in the executor, one per duration observed (the exemplar source)
and one per job log record (the trace fields). This script measures, in one process on
PostgreSQL:

- ``per job``: the client's CPU time per no-op job, enqueue plus claim-and-ack (a burst of
  one worker in this process), median of ``--runs``;
- each added operation's cost (``timeit``, the median of 7 repeats), times how often a job
  runs it (counted by profiling one burst);
- the sum of those against ``per job``: an upper bound on the untraced slowdown (the target
  is 2 %). A whole-system A/B (``benchmarks/bench_compare.py <commit before tracing> main``) cannot
  resolve 2 %: its rounds differ by ±10 % on this machine.

    python benchmarks/bench_untraced.py --pg-url postgres://postgres@127.0.0.1:5432/jg_untraced
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import time
import timeit
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/jg_untraced")
    parser.add_argument("--jobs", type=int, default=2_000, help="no-op jobs per run")
    parser.add_argument("--runs", type=int, default=5, help="runs (the median is reported)")
    return parser.parse_args()


def setup(url: str) -> None:
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.jobguard_settings")
    from benchmarks._database import create_if_missing

    create_if_missing(url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def one_run(jobs: int) -> float:
    """Client CPU seconds per job: enqueue one by one, then drain with a worker in this process."""
    from benchmarks.jobguard_app.tasks import noop
    from django_jobguard.models import Job
    from django_jobguard.worker import Worker

    Job.objects.all().delete()
    started = time.process_time()
    for number in range(jobs):
        noop.enqueue(number)
    Worker(burst=True, install_signal_handlers=False, concurrency=1, poll_interval=0.05).run()
    spent = time.process_time() - started
    assert Job.objects.filter(status="succeeded").count() == jobs, "not every job succeeded"
    return spent / jobs


def calls_per_job(jobs: int) -> Counter[str]:
    """How often one job reaches each place tracing added a check to (one profiled burst)."""
    from benchmarks.jobguard_app.tasks import noop
    from django_jobguard import enqueue, log
    from django_jobguard.models import Job
    from django_jobguard.monitoring import metrics
    from django_jobguard.worker import Worker
    from django_jobguard.worker.executor import Executor

    watched = {
        enqueue.prepare.__code__: "setting read (prepare)",
        enqueue._enqueue.__code__: "setting read (enqueue)",  # noqa: SLF001 - measured, not called
        Executor._run_one.__code__: "executor branch",  # noqa: SLF001
        metrics.job_succeeded.__code__: "exemplar check",
        log.job_fields.__code__: "trace-fields check",
    }
    counts: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in watched:
            counts[watched[frame.f_code]] += 1

    Job.objects.all().delete()
    for number in range(jobs):
        sys.setprofile(profile)
        try:
            noop.enqueue(number)
        finally:
            sys.setprofile(None)
    import threading

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        Worker(burst=True, install_signal_handlers=False, concurrency=1, poll_interval=0.05).run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    counts["INSERT column (NULL)"] = jobs
    return Counter({name: count / jobs for name, count in counts.items()})


def op_costs() -> dict[str, float]:
    """Seconds per execution of each operation tracing added to the untraced path."""
    from prometheus_client import CollectorRegistry, Histogram

    from django_jobguard.conf import get_settings

    conf = get_settings()
    assert not conf.opentelemetry, "run with OPENTELEMETRY off: this measures the untraced path"

    class Executor:
        traced = None

    histogram = Histogram("bench_untraced_seconds", "scratch", registry=CollectorRegistry())
    source = None
    fields: dict[str, Any] = {}

    def best(statement: str, env: dict[str, Any], number: int = 200_000) -> float:
        timer = timeit.Timer(statement, globals=env)
        return statistics.median(timer.repeat(repeat=7, number=number)) / number

    costs = {
        "setting read": best("if conf.opentelemetry:\n    pass", {"conf": conf}),
        "executor branch": best("if ex.traced is not None:\n    pass", {"ex": Executor()}),
        "trace-fields check": best(
            "if source is not None:\n    fields.update(source())", {"source": source, "fields": fields}
        ),
        # The exemplar check and the argument observe() now takes, against observe() before.
        "exemplar check": best(
            "exemplar = source() if source is not None else None\nh.observe(0.001, exemplar)",
            {"source": source, "h": histogram},
            50_000,
        )
        - best("h.observe(0.001)", {"h": histogram}, 50_000),
    }
    # One NULL parameter more per inserted row: the driver's binding and the row's width, on an
    # in-memory table (PostgreSQL's share of the cost is the server's, not this process's).
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a, b, c, d, e, f, g, h, i, j, k, l, m, n, o)")
    fourteen = "INSERT INTO t (a, b, c, d, e, f, g, h, i, j, k, l, m, n) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    fifteen = "INSERT INTO t VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
    row = ("bench.noop", "default", "[1]", "{}", 0, 3, 60.0, None, "", "", "queued", 0, "", "")
    # Reported as measured: a difference below the timer's noise may come out negative.
    costs["INSERT column (NULL)"] = best(
        "db.execute(sql, row)", {"db": db, "sql": fifteen, "row": (*row, None)}, 50_000
    ) - best("db.execute(sql, row)", {"db": db, "sql": fourteen, "row": row}, 50_000)
    return costs


def main() -> None:
    args = parse_args()
    setup(args.pg_url)
    per_job = statistics.median(one_run(args.jobs) for _ in range(args.runs))
    calls = calls_per_job(min(args.jobs, 500))
    costs = op_costs()
    rows = [
        ("setting read (prepare)", calls["setting read (prepare)"], costs["setting read"]),
        ("setting read (enqueue)", calls["setting read (enqueue)"], costs["setting read"]),
        ("INSERT column (NULL)", calls["INSERT column (NULL)"], costs["INSERT column (NULL)"]),
        ("executor branch", calls["executor branch"], costs["executor branch"]),
        ("exemplar check", calls["exemplar check"], costs["exemplar check"]),
        ("trace-fields check", calls["trace-fields check"], costs["trace-fields check"]),
    ]
    total = sum(count * max(cost, 0.0) for _, count, cost in rows)  # noise counts as nothing
    print(
        f"\nno-op job, enqueue + claim + ack, 1 worker thread in-process; {args.jobs} jobs x {args.runs} runs"
    )
    print(f"client CPU per job (median): {per_job * 1e6:,.1f} µs\n")
    print("| added to the untraced path | per job | ns each | ns per job |")
    print("| --- | --- | --- | --- |")
    for name, count, cost in rows:
        print(f"| {name} | {count:.2f} | {cost * 1e9:,.1f} | {count * cost * 1e9:,.1f} |")
    print(f"| **all** | | | **{total * 1e9:,.1f}** |")
    print(f"\nbound on the untraced slowdown: {total / per_job:.4%} of a job's client CPU (target: 2 %)")


if __name__ == "__main__":
    main()
