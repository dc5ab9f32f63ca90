#!/usr/bin/env python
"""Two commits of django-jobguard in one invocation, interleaved: is the new one as fast?

    benchmarks/bench_compare.py OLD NEW [--runs 3] [--jobs 5000] [--configs plain,atomic | all]
    benchmarks/bench_compare.py v0.1.0 HEAD --configs all      # any change on the claim, ack or enqueue path
    benchmarks/bench_compare.py 047ab6a worker --runs 3 --jobs 1000 --db-prefix jg_perf --redis-dbs 8,9,10
    benchmarks/bench_compare.py 42b071a main --count-sql --runs 1

Each commit is checked out into its own ``git worktree add --detach`` under a temporary
directory. The harness (this tree's ``benchmarks/``) drives each commit's product code:
the workers run with a directory holding only that commit's ``django_jobguard`` first on
``sys.path``, through ``manage.py jobguard_worker`` (the commits may lay out their modules
differently), each commit against a database of its own, migrated by its own migrations.

The throughput workload (no-op jobs, 2 worker processes x 2 threads, metrics on, fencing on)
runs in each configuration of ``--configs`` (``CONFIGS``: plain, atomic, idempotency, keyed,
workflow, traced; ``all`` for every one; plain and atomic by default), old, new, old, new, ...
round by round, after one unmeasured warm-up run each. A configuration a commit cannot run
(it predates ``Limit``, workflows or tracing: a probe imports them from its code) is shown as
"-" for that commit, with a note. The table gives the processing rate and the worker CPU per job
as median [min-max] of the runs, and new/old: the ratio of the medians and the median of
each round's own ratio (old and new measured back to back). With ``--count-sql`` the workers
connect through a counting proxy, and the table adds their round trips and statements per job
(a claim's batch size moves them a little; the host's speed hardly does). Exit status 1 if a run
failed its checks (a job lost or run twice).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._report import table  # noqa: E402
from benchmarks._systems import (  # noqa: E402
    CONCURRENCY,
    WORKER_PROCESSES,
    BenchError,
    Jobguard,
    Servers,
    log,
    run_checked,
)
from benchmarks._workloads import throughput_run  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    """One compared configuration: the driver's task variant and what its processes are given."""

    name: str
    variant: str  # benchmarks/drivers/jobguard.py's VARIANTS
    description: str
    needs: str = ""  # the capability (PROBE) a commit must have to run it
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the enqueuer and the workers
    settings: str = ""  # JSON merged into JOBGUARD
    metrics: bool = True
    lock_backend: str = "database"


CONFIGS = {
    config.name: config
    for config in (
        Config("plain", "plain", "`@task()`, non-atomic (its ack batched with others)"),
        Config("atomic", "atomic", "`@task(atomic=True)` (the handler and its ack in one transaction)"),
        Config("idempotency", "idempotency", "`@task()` enqueued with an idempotency key of its own per job"),
        Config(
            "keyed",
            "keyed",
            '`@task(concurrency=Limit(1, key="bench:{i}"))`: a key per job, so the limit never binds '
            "and the figure is the limited claim's cost",
            needs="keyed",
            env=(("BENCH_KEYED", "1"),),
        ),
        Config(
            "workflow",
            "workflow",
            "`@task()` jobs enqueued as `chain(noop.s(i), noop.s(i + 1))`: each first step's ack "
            "releases the second, each second step's finishes its chain",
            needs="workflow",
        ),
        Config(
            "traced",
            "plain",
            '`@task()` with `JOBGUARD["OPENTELEMETRY"]` on (an SDK tracer provider, if installed, '
            "whose exporter drops every span)",
            needs="traced",
            settings='{"OPENTELEMETRY": true}',
        ),
    )
}

#: What ``--configs`` selects when not given: the usage and cost of the two original rows.
DEFAULT_CONFIGS = "plain,atomic"

#: The warm-up's configuration (every commit can run it).
WARMUP_CONFIG = "atomic"

#: Run in each commit's code: which configurations it can run (JSON: capability -> missing
#: piece, "" when present), and whether the OpenTelemetry SDK is there for the traced one.
PROBE = """
import importlib.util, json, django
django.setup()
import django_jobguard
from django_jobguard.conf import get_settings
found = {}
try:
    from django_jobguard import Limit  # noqa: F401
    found["keyed"] = ""
except ImportError:
    found["keyed"] = "no `Limit` in its django_jobguard"
try:
    from django_jobguard import chain  # noqa: F401
    found["workflow"] = "" if hasattr(django_jobguard.Task, "s") else "no `Task.s()` to build a chain"
except (ImportError, AttributeError):
    found["workflow"] = "no `chain` in its django_jobguard"
if not hasattr(get_settings(), "opentelemetry"):
    found["traced"] = 'no `JOBGUARD["OPENTELEMETRY"]` setting'
elif importlib.util.find_spec("opentelemetry") is None:
    found["traced"] = "opentelemetry-api is not installed"
else:
    found["traced"] = ""
found["sdk"] = importlib.util.find_spec("opentelemetry.sdk") is not None
print(json.dumps(found))
"""

METRICS = [
    ("processing_rate", "processing jobs/s", 0),
    ("worker_cpu_ms_per_job", "worker CPU ms/job", 3),
    ("total_cpu_ms_per_job", "worker + servers CPU ms/job", 3),
    ("round_trips_per_job", "worker round trips/job", 3),
    ("statements_per_job", "worker statements/job", 3),
]


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


class Checkout:
    """One commit in a detached worktree, and a directory exposing only its ``django_jobguard``."""

    def __init__(self, ref: str, tmp: Path, name: str) -> None:
        self.ref = ref
        self.sha = git("rev-parse", "--verify", f"{ref}^{{commit}}")
        self.name = name
        self.worktree = tmp / f"{name}-tree"
        self.code = tmp / f"{name}-code"

    def __enter__(self) -> Checkout:
        git("worktree", "add", "--detach", "--quiet", str(self.worktree), self.sha)
        self.code.mkdir()
        (self.code / "django_jobguard").symlink_to(self.worktree / "django_jobguard")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.worktree)],
            capture_output=True,
            check=False,
        )

    @property
    def label(self) -> str:
        return f"{self.name} {self.ref} ({self.sha[:9]})"


def check_code(system: Jobguard, checkout: Checkout) -> None:
    """The system's processes import django_jobguard from the commit's worktree, not from this tree."""
    out = run_checked(
        [system.python, "-c", "import os, django_jobguard as m; print(os.path.realpath(m.__file__))"],
        system.env(),
        cwd=system.cwd,
    ).strip()
    if not out.startswith(str(checkout.worktree.resolve())):
        raise BenchError(f"{checkout.label}: django_jobguard comes from {out}, not from {checkout.worktree}")


def probe(system: Jobguard, checkout: Checkout) -> dict[str, Any]:
    """What the commit's code can run (PROBE's answer), from a process of its own."""
    out = run_checked([system.python, "-c", PROBE], system.env(), cwd=system.cwd)
    found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    missing = [k for k, v in found.items() if k != "sdk" and v]
    log(f"{checkout.label}: {'cannot run ' + ', '.join(missing) if missing else 'runs every configuration'}")
    return found


def select(text: str) -> list[Config]:
    """The configurations ``--configs`` names (comma-separated, or ``all``), in CONFIGS order."""
    names = list(CONFIGS) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise ValueError(f"unknown configuration(s) {', '.join(unknown) or '(none given)'}")
    return [config for name, config in CONFIGS.items() if name in names]


def configure(system: Jobguard, config: Config) -> None:
    system.configure(config.variant, config.metrics, config.lock_backend)
    system.extra_env = dict(config.env)
    system.extra_settings = config.settings


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cell(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    s = summary(values)
    return f"{s['median']:,.{digits}f} [{s['min']:,.{digits}f}-{s['max']:,.{digits}f}]"


def report(
    checkouts: list[Checkout],
    configs: list[Config],
    runs: dict[tuple[str, str], list[dict[str, float]]],
    jobs: int,
    notes: list[str],
) -> tuple[str, list[dict[str, Any]]]:
    old, new = checkouts
    rows, data = [], []
    for config in configs:
        a, b = runs[(config.name, old.name)], runs[(config.name, new.name)]
        for metric, heading, digits in METRICS:
            va = [r[metric] for r in a if metric in r]
            vb = [r[metric] for r in b if metric in r]
            if not va and not vb and metric != "processing_rate":
                continue  # not measured in this invocation (the counts need --count-sql)
            ratio = statistics.median(vb) / statistics.median(va) if va and vb else None
            # Round k's old and new ran back to back: their ratio leaves out drift between rounds.
            paired = [y / x for x, y in zip(va, vb, strict=False) if x]
            rows.append(
                [
                    config.name,
                    heading,
                    cell(va, digits),
                    cell(vb, digits),
                    f"{ratio:.3f}" if ratio else "-",
                    cell(paired, 3) if paired else "-",
                ]
            )
            data.append(
                {
                    "config": config.name,
                    "metric": metric,
                    "old": va,
                    "new": vb,
                    "ratio_of_medians": ratio,
                    "paired_ratios": paired,
                }
            )
    headers = [
        "tasks",
        "figure",
        f"old: {old.ref} ({old.sha[:9]})",
        f"new: {new.ref} ({new.sha[:9]})",
        "new/old (medians)",
        "new/old per round",
    ]
    counts = [len(v) for v in runs.values() if v]
    text = (
        f"### {old.ref} vs {new.ref}: {jobs:,} no-op jobs, {WORKER_PROCESSES} worker processes x "
        f"{CONCURRENCY}, median [min-max] of {min(counts, default=0)} interleaved runs\n\n"
        + table(headers, rows)
    )
    if notes:
        text += "\n\n" + "\n".join(f"- {note}" for note in notes)
    return text, data


def _calls_per_job(paths: list[Path], jobs: int) -> tuple[dict[str, float], dict[str, float]]:
    """Calls per job and own CPU microseconds per job by function (``path:function``, the path
    from its package on), all workers summed."""
    import pstats

    calls: dict[str, float] = {}
    own: dict[str, float] = {}
    for path in paths:
        if not path.exists():
            continue
        for (filename, _line, function), row in pstats.Stats(str(path)).stats.items():  # type: ignore[attr-defined]
            parts = Path(filename).parts
            anchor = next((i for i, part in enumerate(parts) if part in ("django_jobguard", "django")), None)
            where = "/".join(parts[anchor:]) if anchor is not None else Path(filename).name
            key = f"{where}:{function}"
            calls[key] = calls.get(key, 0.0) + row[1] / jobs  # row[1]: all calls, recursive ones too
            own[key] = own.get(key, 0.0) + row[2] * 1e6 / jobs  # row[2]: time in the function itself
    return calls, own


def calls_report(
    systems: list[tuple[Checkout, Jobguard]],
    configs: list[Config],
    capable: dict[str, dict[str, Any]],
    workdir: Path,
    args: argparse.Namespace,
) -> str:
    """``--calls``: one profiled run per commit and configuration; calls per job, old against new."""
    sections = []
    for config in configs:
        counted: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
        for checkout, system in systems:
            if config.needs and capable[checkout.name].get(config.needs, ""):
                continue
            configure(system, config)
            log(f"  calls: {config.name} {checkout.label} under cProfile")
            values = throughput_run(system, workdir, args.jobs, profile=True)
            counted[checkout.name] = _calls_per_job([Path(p) for p in values["profiles"]], args.jobs)  # type: ignore[arg-type]
        if len(counted) != 2:
            continue
        (old, old_us), (new, new_us) = counted["old"], counted["new"]
        changed = sorted(set(old) | set(new), key=lambda k: -abs(new.get(k, 0.0) - old.get(k, 0.0)))
        rows = []
        for k in changed[: args.calls]:
            before, after = old.get(k, 0.0), new.get(k, 0.0)
            rows.append([k, f"{before:.2f}", f"{after:.2f}", f"{after - before:+.2f}"])
        total_old, total_new = sum(old.values()), sum(new.values())
        sections.append(
            f"\n\n### Python calls per job in the workers, {config.name} (cProfile, one run each)\n\n"
            f"All functions: {total_old:.1f} old, {total_new:.1f} new ({total_new - total_old:+.1f}). "
            f"The {args.calls} that changed most:\n\n" + table(["function", "old", "new", "change"], rows)
        )
        slower = sorted(set(old_us) | set(new_us), key=lambda k: -(new_us.get(k, 0.0) - old_us.get(k, 0.0)))
        rows = []
        for k in slower[: args.calls]:
            before, after = old_us.get(k, 0.0), new_us.get(k, 0.0)
            rows.append([k, f"{before:.2f}", f"{after:.2f}", f"{after - before:+.2f}"])
        sections.append(
            f"\n\nOwn CPU time, microseconds per job under cProfile (its overhead inflates call-heavy "
            f"code; one run, so noisy): {sum(old_us.values()):.1f} old, {sum(new_us.values()):.1f} new. "
            f"The {args.calls} that grew most:\n\n" + table(["function", "old us", "new us", "change"], rows)
        )
    return "".join(sections)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("old", help="the old commit (any git revision)")
    parser.add_argument("new", help="the new commit")
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=f"comma-separated configurations ({', '.join(CONFIGS)}) or all (default {DEFAULT_CONFIGS})",
    )
    parser.add_argument("--runs", type=int, default=3, help="measured runs per commit and configuration")
    parser.add_argument("--jobs", type=int, default=5000, help="no-op jobs per run (default 5000)")
    parser.add_argument("--warmup", type=int, default=1000, help="jobs of each commit's unmeasured warm-up")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379", help="Redis server")
    parser.add_argument("--redis-dbs", default="5,6,7", help="Redis databases: locks, broker, records")
    parser.add_argument("--db-prefix", default="jg_bench", help="prefix of the databases it creates")
    parser.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument(
        "--count-sql",
        action="store_true",
        help="the workers connect through a counting proxy: round trips and statements per job "
        "(what they send does not depend on the host's load, so this runs on a busy host too)",
    )
    parser.add_argument(
        "--calls",
        type=int,
        default=0,
        metavar="N",
        help="after the rounds, one run per commit and configuration under cProfile: Python calls per "
        "job in the workers, old against new, and the N functions whose calls per job changed most "
        "(counts, not times: they do not depend on the host's load)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.jobs < 1:
        parser.error("--runs and --jobs must be positive")
    try:
        args.configs = ",".join(config.name for config in select(args.configs))
    except ValueError as exc:
        parser.error(f"--configs: {exc}; known: {', '.join(CONFIGS)}, or all")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dbs = tuple(int(x) for x in args.redis_dbs.split(","))
    if len(dbs) != 3:
        raise SystemExit("--redis-dbs takes three numbers")
    servers = Servers(args.pg_url, args.redis_url, args.db_prefix, dbs)  # type: ignore[arg-type]
    started = time.monotonic()
    load = os.getloadavg()
    configs = select(args.configs)
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    errors: list[str] = []
    notes: list[str] = []
    counter = None
    if args.count_sql:
        from urllib.parse import urlsplit

        from benchmarks._wire_count import WireCounter

        pg = urlsplit(args.pg_url)
        counter = WireCounter(pg.hostname or "127.0.0.1", pg.port or 5432).start()
    with tempfile.TemporaryDirectory(prefix="jg-compare-") as tmp:
        workdir = Path(tmp)
        old = Checkout(args.old, workdir, "old")
        new = Checkout(args.new, workdir, "new")
        with old, new:
            systems = []
            capable: dict[str, dict[str, Any]] = {}
            for checkout in (old, new):
                system = Jobguard(servers, sys.executable, suffix=f"_cmp_{checkout.name}", code=checkout.code)
                check_code(system, checkout)
                capable[checkout.name] = probe(system, checkout)
                log(f"setting up {checkout.label} in database {system.dbname}")
                system.setup()
                systems.append((checkout, system))
            for config in configs:
                for checkout in (old, new):
                    missing = capable[checkout.name].get(config.needs, "") if config.needs else ""
                    if missing:
                        notes.append(f"{config.name}: {checkout.label} cannot run it ({missing}): shown as -")
            for checkout, system in systems:
                if args.warmup:
                    log(f"warm-up: {checkout.label}, {args.warmup} jobs (not measured)")
                    configure(system, CONFIGS[WARMUP_CONFIG])
                    throughput_run(system, workdir, args.warmup)
            for r in range(args.runs):
                log(f"round {r + 1}/{args.runs}")
                for config in configs:
                    for checkout, system in systems:
                        if config.needs and capable[checkout.name].get(config.needs, ""):
                            continue
                        configure(system, config)
                        try:
                            values = throughput_run(system, workdir, args.jobs, counter=counter)
                        except BenchError as exc:
                            errors.append(f"{config.name} {checkout.label}: {exc}")
                            log(f"  FAILED {config.name} {checkout.label}: {str(exc)[:2000]}")
                            continue
                        runs.setdefault((config.name, checkout.name), []).append(values)
                        log(
                            f"  {config.name} {checkout.label}: {values['processing_rate']:,.0f} jobs/s, "
                            f"worker CPU {values['worker_cpu_ms_per_job']:.3f} ms/job"
                        )
            calls_text = calls_report(systems, configs, capable, workdir, args) if args.calls else ""
        for config in configs:
            for checkout in (old, new):
                runs.setdefault((config.name, checkout.name), [])
        text, data = report([old, new], configs, runs, args.jobs, notes)
        text += calls_text
    servers.close()
    stamp = datetime.datetime.now(datetime.UTC)
    sdk = all(found.get("sdk") for found in capable.values())
    described = "; ".join(
        f"**{config.name}**: {config.description}"
        + (
            " (no opentelemetry-sdk installed: the API's no-op tracer)"
            if config.name == "traced" and not sdk
            else ""
        )
        for config in configs
    )
    header = (
        f"## django-jobguard, commit against commit, {stamp:%Y-%m-%d %H:%M} UTC\n\n"
        f"Command: `benchmarks/bench_compare.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
        f"{os.cpu_count()} cores, load average at start {', '.join(f'{x:.2f}' for x in load)}; "
        f"took {(time.monotonic() - started) / 60:.1f} min. Configurations, each with metrics on, "
        f"database locks (unused) and fencing on: {described}. "
        f"Each commit is migrated into its own database (`{args.db_prefix}_cmp_old`, `_cmp_new`)."
    )
    document = header + "\n\n" + text
    if errors:
        document += "\n\n### Errors\n\n" + "\n".join(f"- {e[:500]}" for e in errors)
    print(document)
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"compare-{stamp:%Y%m%dT%H%M%SZ}.json"
    path.write_text(
        json.dumps(
            {
                "old": {"ref": old.ref, "sha": old.sha},
                "new": {"ref": new.ref, "sha": new.sha},
                "args": vars(args),
                "load_average_at_start": load,
                "figures": data,
                "configs": [dataclasses.asdict(config) for config in configs],
                "capabilities": capable,
                "notes": notes,
                "errors": errors,
                "table": document,
            },
            indent=2,
        )
        + "\n"
    )
    log(f"wrote {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
