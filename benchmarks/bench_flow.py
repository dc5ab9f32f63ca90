"""Flow control's cost and accuracy, with real worker processes on PostgreSQL or MariaDB/MySQL.

Three runs, each draining jobs enqueued beforehand with ``--processes`` workers
(``jobguard_worker --concurrency 4``) and timing from the workers' start to the last ack:

- ``unlimited``: a queue with no limit (its claims are the plain one-statement claim);
- ``keyed``: ``concurrency=Limit(1, key="account:{account}")`` over ``--keys`` accounts, the
  same number of jobs (the limited claim: counted, fair across keys, one turn at a time);
- ``rate``: ``rate=Rate("200/s", burst=10)``, ``--rate-seconds`` worth of jobs with four
  processes: the achieved start rate (claims on the database clock) against the declared one;
- ``pickup``: ``--cold`` jobs of as many keys enqueued at 100/s, their p95 wait from enqueue
  to start, alone and beside a hot key whose ``--hot`` jobs stand before them in the queue;
  then its parts: from the enqueue's return to the claim (the workers' share), and from the
  enqueue to the handler's start.

    python benchmarks/bench_flow.py --db-url postgres://postgres@127.0.0.1:5432/jg_flow_bench
    python benchmarks/bench_flow.py --db-url mysql://root@127.0.0.1:3306/jg_flow_bench

With ``--count-sql`` the unlimited and keyed runs report what the workers sent per completed
job instead of their throughput: round trips (query strings) and statements (each statement
of a multi-statement string on its own).

The database is created and migrated if missing, and emptied before each run. Prints a table.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from benchmarks._wire_count import WireCounter


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--db-url",
        "--pg-url",
        dest="db_url",
        default="postgres://postgres@127.0.0.1:5432/jg_flow_bench",
        help="postgres:// or mysql:// URL",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs of the unlimited and keyed runs")
    parser.add_argument("--keys", type=int, default=1_000, help="accounts of the keyed run (limit 1 each)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes of those runs")
    parser.add_argument("--rate-seconds", type=float, default=60.0, help="length of the rate run")
    parser.add_argument("--runs", type=int, default=1, help="runs of each (the median is reported)")
    parser.add_argument("--hot", type=int, default=10_000, help="jobs of the hot key in the pickup run")
    parser.add_argument("--cold", type=int, default=1_000, help="cold keys (one job each) in the pickup run")
    parser.add_argument(
        "--count-sql",
        action="store_true",
        help="count the workers' round trips and statements per job in the unlimited and keyed runs "
        "(their throughput is then not reported: counting slows the workers a little)",
    )
    parser.add_argument(
        "--workloads",
        default="unlimited,keyed,rate,pickup",
        help="which runs, comma-separated (default: all four)",
    )
    return parser.parse_args()


def setup(args: argparse.Namespace) -> dict[str, str]:
    from benchmarks._database import setup_django

    return setup_django(args.db_url, BENCH_FLOW="1")


def drain(
    env: dict[str, str],
    task: object,
    jobs: int,
    keys: int,
    processes: int,
    queue: str,
    counter: WireCounter | None = None,
) -> dict[str, float]:
    """Enqueue ``jobs`` (account = i % keys), start the workers, time the drain.

    With ``counter``, the workers connect through it, and the result has what they sent per
    job: round trips and statements.
    """
    from benchmarks._database import empty
    from django_jobguard.models import Job

    empty(["jobguard_job", "jobguard_flowrate"])
    for start in range(0, jobs, 1000):
        task.bulk_enqueue(((), {"i": i, "account": i % keys}) for i in range(start, min(start + 1000, jobs)))  # type: ignore[attr-defined]
    command = [sys.executable, "-m", "django", "jobguard_worker", "--queue", queue, "--concurrency", "4"]
    if counter is not None:
        url = urlsplit(env["BENCH_DATABASE_URL"])
        env = {
            **env,
            "BENCH_DATABASE_URL": url._replace(netloc=f"{url.username}@127.0.0.1:{counter.port}").geturl(),
        }
        counter.reset()
    began = time.perf_counter()
    workers = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(processes)
    ]
    try:
        while Job.objects.filter(queue_name=queue).exclude(status="succeeded").exists():
            time.sleep(0.05)
        elapsed = time.perf_counter() - began
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
    starts = sorted(
        t.timestamp() for t in Job.objects.filter(queue_name=queue).values_list("started_at", flat=True)
    )
    result = {
        "elapsed": elapsed,
        "rate": jobs / elapsed,
        "start_rate": (len(starts) - 1) / (starts[-1] - starts[0]),
    }
    if counter is not None:
        result["round_trips"] = counter.round_trips / jobs
        result["statements"] = counter.statements / jobs
    return result


def pickup(env: dict[str, str], task: object, hot: int, cold: int, rate: float) -> dict[str, float]:
    """The p95 wait of ``cold`` jobs of as many keys, enqueued at ``rate``/s while ``hot`` jobs
    of one key (limit 1) stand before them in the queue, in seconds: ``pickup`` from the
    enqueue (its transaction's start) to the claim that leased the job; ``worker`` from the
    enqueue's return (after its commit) to that claim; ``handler`` from the enqueue to the
    handler's start (``task`` returns its clock)."""
    from benchmarks._common import paced
    from benchmarks._database import empty
    from django_jobguard.models import Job

    empty(["jobguard_job", "jobguard_flowrate"])
    for start in range(0, hot, 1000):
        task.bulk_enqueue(((), {"i": i, "account": -1}) for i in range(start, min(start + 1000, hot)))  # type: ignore[attr-defined]
    command = [
        sys.executable,
        "-m",
        "django",
        "jobguard_worker",
        "--queue",
        "flow-pickup",
        "--concurrency",
        "4",
    ]
    workers = [
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    returned: dict[int, float] = {}
    try:
        time.sleep(3)  # the workers start (and the hot key's first job runs)
        for i in paced(range(cold), rate):
            pk = task.enqueue(i=i, account=i).pk  # type: ignore[attr-defined]
            returned[pk] = time.time()
        while Job.objects.filter(pk__in=list(returned)).exclude(status="succeeded").exists():
            time.sleep(0.05)
        hot_left = Job.objects.filter(queue_name="flow-pickup").exclude(status="succeeded").count()
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
    if hot and not hot_left:
        print(f"warning: the hot key drained before the cold jobs did ({hot} jobs): raise --hot")
    rows = Job.objects.filter(pk__in=list(returned)).values_list("pk", "enqueued_at", "started_at", "result")

    def p95(values: list[float]) -> float:
        return sorted(values)[int(0.95 * (len(values) - 1))]

    return {
        "pickup": p95([(started - enqueued).total_seconds() for _, enqueued, started, _ in rows]),
        "worker": p95([started.timestamp() - returned[pk] for pk, _, started, _ in rows]),
        "handler": p95([float(began) - enqueued.timestamp() for _, enqueued, _, began in rows]),
    }


def main() -> None:
    args = parse_args()
    env = setup(args)
    from benchmarks.jobguard_app import tasks_flow

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    runs: dict[str, list[dict[str, float]]] = {"unlimited": [], "keyed": [], "rate": []}
    calm: list[dict[str, float]] = []
    beside_hot: list[dict[str, float]] = []
    chosen = {name.strip() for name in args.workloads.split(",")}
    counter: WireCounter | None = None
    if args.count_sql:
        from benchmarks._wire_count import WireCounter

        url = urlsplit(args.db_url)
        if url.scheme not in ("postgres", "postgresql"):
            raise SystemExit("--count-sql reads the PostgreSQL wire protocol: give a postgres:// URL")
        counter = WireCounter(url.hostname or "127.0.0.1", url.port or 5432).start()
    for _ in range(args.runs):
        if chosen & {"unlimited", "keyed"}:
            runs["unlimited"].append(
                drain(
                    env,
                    tasks_flow.flow_plain,
                    args.jobs,
                    args.keys,
                    args.processes,
                    "flow-plain",
                    counter,
                )
            )
        if "keyed" in chosen:
            runs["keyed"].append(
                drain(
                    env,
                    tasks_flow.flow_keyed,
                    args.jobs,
                    args.keys,
                    args.processes,
                    "flow-keyed",
                    counter,
                )
            )
        if "rate" in chosen:
            rated = int(200 * args.rate_seconds)
            runs["rate"].append(drain(env, tasks_flow.flow_rated, rated, args.keys, 4, "flow-rated"))
        if "pickup" in chosen:
            calm.append(pickup(env, tasks_flow.flow_clocked, 0, args.cold, 100.0))
            beside_hot.append(pickup(env, tasks_flow.flow_clocked, args.hot, args.cold, 100.0))
    rows: list[tuple[str, str, str, str]] = []
    if args.count_sql and runs["unlimited"]:
        sizes = f"{args.jobs:,} jobs, {args.processes} processes"
        for unit in ("round_trips", "statements"):
            plain = median([r[unit] for r in runs["unlimited"]])
            label = unit.replace("_", " ")
            rows.append((f"unlimited queue, {label} per job", sizes, f"{plain:.3f}", "1.00x"))
            if runs["keyed"]:
                keyed = median([r[unit] for r in runs["keyed"]])
                rows.append(
                    (
                        f"keyed, {args.keys:,} keys x limit 1, {label} per job",
                        sizes,
                        f"{keyed:.3f}",
                        f"{keyed / plain:.2f}x",
                    )
                )
    elif runs["unlimited"]:
        unlimited = median([r["rate"] for r in runs["unlimited"]])
        rows.append(
            (
                "unlimited queue",
                f"{args.jobs:,} jobs, {args.processes} processes",
                f"{unlimited:,.0f} jobs/s",
                "100 %",
            )
        )
    if runs["keyed"] and not args.count_sql:
        keyed = median([r["rate"] for r in runs["keyed"]])
        # Each round's keyed run against the unlimited run just before it: the host's drift
        # between rounds moves both.
        shares = [k["rate"] / u["rate"] for u, k in zip(runs["unlimited"], runs["keyed"], strict=True)]
        rows.append(
            (
                f"keyed, {args.keys:,} keys x limit 1",
                f"{args.jobs:,} jobs, {args.processes} processes",
                f"{keyed:,.0f} jobs/s",
                f"{100 * keyed / unlimited:.0f} % of unlimited "
                f"(rounds: {', '.join(f'{100 * share:.0f}' for share in shares)} %)",
            )
        )
        drained = median([r["start_rate"] for r in runs["keyed"]])
        plain = median([r["start_rate"] for r in runs["unlimited"]])
        rows.append(
            (
                "the same, first start to last",
                "without the workers' start",
                f"{drained:,.0f} vs {plain:,.0f} starts/s",
                f"{100 * drained / plain:.0f} % of unlimited",
            )
        )
    if runs["rate"]:
        achieved = median([r["start_rate"] for r in runs["rate"]])
        rows.append(
            (
                "rate 200/s, burst 10",
                f"{int(200 * args.rate_seconds):,} jobs, 4 processes",
                f"{achieved:,.1f} starts/s",
                f"{100 * (achieved - 200) / 200:+.1f} % off the rate",
            )
        )
    if calm:
        still, hot = [r["pickup"] for r in calm], [r["pickup"] for r in beside_hot]
        rows.append(
            (
                f"cold keys' p95 pickup, {args.cold:,} keys at 100/s",
                "no hot key",
                f"{1000 * median(still):,.1f} ms",
                f"runs: {', '.join(f'{1000 * v:,.1f}' for v in still)} ms",
            )
        )
        # A p95 of about 2 ms moves by half a millisecond between runs on a small host: the
        # ratio within each round (the two runs back to back) drifts less than the medians.
        paired = median([b / a for a, b in zip(still, hot, strict=True)])
        rows.append(
            (
                f"cold keys' p95 pickup, {args.cold:,} keys at 100/s",
                f"beside a hot key of {args.hot:,} jobs",
                f"{1000 * median(hot):,.1f} ms",
                f"{100 * (median(hot) - median(still)) / median(still):+.0f} % "
                f"(each round against its run without: median {100 * (paired - 1):+.0f} %; "
                f"runs: {', '.join(f'{1000 * v:,.1f}' for v in hot)} ms)",
            )
        )
        # Most of the pickup is the enqueue's own statement and commit, which a hot key does
        # not touch: the part from its return to the claim is the workers' alone.
        for part, label in (
            ("worker", "  from the enqueue's return to the claim"),
            ("handler", "  to the handler's start"),
        ):
            a, b = median([r[part] for r in calm]), median([r[part] for r in beside_hot])
            pairs = median([y[part] / x[part] for x, y in zip(calm, beside_hot, strict=True)])
            rows.append(
                (
                    label,
                    "no hot key -> beside it",
                    f"{1000 * a:,.2f} -> {1000 * b:,.2f} ms",
                    f"{1000 * (b - a):+.2f} ms (each round: median {100 * (pairs - 1):+.0f} %)",
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(("run", "size", "result", "vs"), widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
