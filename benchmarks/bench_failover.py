"""What a PostgreSQL failover costs: the failover scenario at full size, synchronous and asynchronous.

Runs ``tests/support/failover.py`` (its own primary and standby on 127.0.0.1:5460-5469, built
with the newest ``/usr/lib/postgresql/*/bin``, removed afterwards; 4 worker processes of
concurrency 4 and an enqueuer on the multi-host settings; the primary stopped with ``-m
immediate`` once a quarter of the jobs finished; the standby promoted) ``--runs`` times per
replication mode, and prints each figure's median (min-max):

    python benchmarks/bench_failover.py --jobs 20000 --runs 1

Results are printed and written to ``benchmarks/results/failover-<UTC time>.json`` and
``failover-latest.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

#: The figures the table shows, in order.
FIGURES = (
    "jobs",
    "acked_enqueues",
    "acked_enqueues_lost",
    "atomic_effects_doubled",
    "atomic_succeeded_without_effect",
    "plain_reruns",
    "enqueue_retries",
    "unfinished",
    "promote_seconds",
    "promotion_to_first_completion_seconds",
    "promotion_to_all_finished_seconds",
    "old_primary_only_enqueues",
    "old_primary_only_effects",
    "old_primary_only_completions",
    "loss_window_ms",
    "elapsed_seconds",
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (half arrive mid-run)")
    parser.add_argument("--runs", type=int, default=1, help="runs per replication mode")
    parser.add_argument(
        "--modes", default="synchronous,asynchronous", help="comma-separated: synchronous, asynchronous"
    )
    parser.add_argument(
        "--lags",
        default="0,1",
        help="comma-separated seconds the standby hears nothing before the primary dies (a lagging standby)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from tests.support import failover, pg_replica

    reason = pg_replica.missing_reason()
    if reason:
        sys.exit(reason)
    runs: dict[str, list[dict[str, Any]]] = {}
    for replication in args.modes.split(","):
        for lag in (float(text) for text in args.lags.split(",")):
            mode = f"{replication[:5]} lag {lag:g}s"
            for index in range(args.runs):
                with tempfile.TemporaryDirectory(prefix="jobguard-failover-bench-") as work:
                    figures = failover.run(
                        Path(work),
                        jobs=args.jobs,
                        synchronous=replication == "synchronous",
                        timeout=1800,
                        standby_lag=lag,
                    )
                figures["unfinished"] = args.jobs - figures["statuses"].get("succeeded", 0)
                print(f"{mode} run {index + 1}: {json.dumps(figures, default=str)}", flush=True)
                runs.setdefault(mode, []).append(figures)
    modes = list(runs)
    print()
    print(f"{'figure':<40}" + "".join(f"{mode:>20}" for mode in modes))
    for name in FIGURES:
        cells = []
        for mode in modes:
            values = [run[name] for run in runs[mode] if run.get(name) is not None]
            if not values:
                cells.append("-")
            elif len(values) == 1:
                cells.append(f"{values[0]}")
            else:
                cells.append(f"{statistics.median(values)} ({min(values)}-{max(values)})")
        print(f"{name:<40}" + "".join(f"{cell:>20}" for cell in cells))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps({"jobs": args.jobs, "runs": runs}, indent=2, default=str)
    (RESULTS / f"failover-{stamp}.json").write_text(text)
    (RESULTS / "failover-latest.json").write_text(text)


if __name__ == "__main__":
    main()
