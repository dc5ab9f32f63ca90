#!/usr/bin/env python
"""Benchmark django-jobguard against its peers on this machine: ``make bench``.

One command installs what it needs (the peers go into ``benchmarks/.venv-peers``, never
into the project's dependencies), creates its databases (``jg_bench*`` on the PostgreSQL
at 127.0.0.1:5432) and uses Redis databases 5-7 at 127.0.0.1:6379. It prints a table
and writes JSON to ``benchmarks/results/``. Each figure is the median of ``--runs`` runs
(3 by default) with min and max; runs of different systems are interleaved round by
round so that drift in the machine's load spreads over all of them.

    make bench                                  # the full suite (about half an hour)
    make bench BENCH_ARGS=--quick               # small sizes, a few minutes
    make bench BENCH_ARGS="--workloads throughput --systems jobguard,dtdb"
    make bench BENCH_ARGS=--profile             # where django-jobguard's worker CPU goes

See docs/explanation/performance.md for the method and the latest figures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PEERS_VENV = BENCH / ".venv-peers"
PEERS_REQUIREMENTS = BENCH / "requirements-peers.txt"
RESULTS = BENCH / "results"

sys.path.insert(0, str(ROOT))
from benchmarks._profile import profile  # noqa: E402
from benchmarks._report import Report, Results  # noqa: E402
from benchmarks._systems import (  # noqa: E402
    CONCURRENCY,
    HEADLINE,
    NON_ATOMIC,
    SYSTEM_LABELS,
    BenchError,
    CeleryDefault,
    CeleryRedis,
    DjangoTasksDB,
    Jobguard,
    Procrastinate,
    Servers,
    System,
    log,
)
from benchmarks._workloads import (  # noqa: E402
    FULL,
    QUICK,
    SAFETY_CONFIGS,
    WORKLOADS,
    Sizes,
    bulk_run,
    deep_run,
    enqueue_bound_run,
    fill_backlog,
    latency_run,
    memory_run,
    pgbench_run,
    throughput_run,
)


def _version_of(python: str, module: str) -> str:
    proc = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({module!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or "?"


def ensure_peers_venv(skip_install: bool) -> str:
    """Create ``benchmarks/.venv-peers`` with the pinned peers and the project's own Django and psycopg."""
    import django
    import psycopg

    pins = [f"Django=={django.__version__}", f"psycopg[binary]=={psycopg.__version__}"]
    return ensure_venv(PEERS_VENV, PEERS_REQUIREMENTS, pins, skip_install)


def ensure_venv(venv: Path, requirements: Path, pins: list[str], skip_install: bool) -> str:
    """Create ``venv`` with ``requirements`` and ``pins`` (again only when they change); its python."""
    python = str(venv / "bin" / "python")
    if skip_install:
        if not Path(python).exists():
            raise BenchError(f"--skip-install, but {venv} does not exist")
        return python
    stamp_text = requirements.read_text() + "\n".join(pins) + sys.version
    stamp = hashlib.sha256(stamp_text.encode()).hexdigest()
    stamp_file = venv / ".bench-stamp"
    if Path(python).exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return python
    log(f"installing {requirements.name} into {venv.relative_to(ROOT)} (once)")
    if not Path(python).exists():
        # The base interpreter, not this virtualenv's, so nothing of the project leaks in.
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    subprocess.run([*pip, "-r", str(requirements), *pins], check=True)
    stamp_file.write_text(stamp)
    return python


def machine(servers: Servers, peers_python: str | None) -> dict[str, Any]:
    import django
    import psycopg

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{kib / 1024 / 1024:.0f} GiB"
    pg_settings = dict(
        servers.query(
            "postgres",
            "SELECT name, setting FROM pg_settings WHERE name IN ('synchronous_commit', 'fsync', "
            "'shared_buffers', 'autovacuum', 'max_connections')",
        )
    )
    client = servers.redis(servers.locks_db)
    redis_info = client.info("server")
    redis_conf = client.config_get("save") | client.config_get("appendonly")
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "os": platform.platform(),
        "load_average_at_start": os.getloadavg(),
        "postgresql": servers.query("postgres", "SHOW server_version")[0][0],
        "postgresql_settings": pg_settings,
        "redis": redis_info.get("redis_version"),
        "redis_persistence": redis_conf,
        "python": platform.python_version(),
        "django": django.__version__,
        "psycopg": psycopg.__version__,
        "django_jobguard": _version_of(sys.executable, "django-jobguard"),
    }
    if peers_python:
        info["peer_packages"] = {
            package: _version_of(peers_python, package)
            for package in ("django-tasks", "django-tasks-db", "celery", "kombu", "redis", "procrastinate")
        }
    return info


def describe(info: dict[str, Any], command: str, runs: int, quick: bool, minutes: float) -> str:
    """The heading of a report: when, on what machine, with which command."""
    pg = info["postgresql_settings"]
    redis_conf = info["redis_persistence"]
    return (
        f"## django-jobguard benchmarks, {info['date']}\n\n"
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory']}, {info['os']}; "
        f"PostgreSQL {info['postgresql']} (synchronous_commit={pg.get('synchronous_commit')}, "
        f"fsync={pg.get('fsync')}, shared_buffers={pg.get('shared_buffers')} x 8 kB); "
        f"Redis {info['redis']} (save={redis_conf.get('save')!r}, "
        f"appendonly={redis_conf.get('appendonly')}); "
        f"Python {info['python']}, Django {info['django']}, psycopg {info['psycopg']}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in info['load_average_at_start'])}.\n\n"
        f"Command: `benchmarks/bench_peers.py {command}`; {runs} runs per figure, median (min-max); "
        f"{'quick sizes' if quick else 'full sizes'}; took {minutes:.1f} min."
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per figure (default 3)")
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEM_LABELS),
        help=f"comma-separated subset of {','.join(SYSTEM_LABELS)}",
    )
    parser.add_argument("--sizes", default="", help="throughput sizes, e.g. 5000,20000")
    parser.add_argument("--backlog-rows", type=int, default=0, help="finished rows for the backlog workload")
    parser.add_argument(
        "--deep-depth",
        type=int,
        default=0,
        help="queued jobs of the deep workload's deep due set (1,000,000)",
    )
    parser.add_argument(
        "--deep-jobs",
        type=int,
        default=0,
        help="jobs the deep workload drains per run, and so the shallow due set's depth (5,000); "
        "more gives longer drains, steadier on a busy host",
    )
    parser.add_argument("--memory-jobs", type=int, default=0, help="jobs of the memory workload (1,000,000)")
    parser.add_argument("--profile", action="store_true", help="profile django-jobguard's worker instead")
    parser.add_argument(
        "--jobguard",
        default="",
        metavar="JSON",
        help="extra JOBGUARD settings for django-jobguard, e.g. '{\"BATCH_SIZE\": 16}' (tuning experiments)",
    )
    parser.add_argument(
        "--db-options",
        default="",
        metavar="JSON",
        help="django-jobguard's DATABASES OPTIONS, e.g. '{\"server_side_binding\": true}' (experiments)",
    )
    parser.add_argument("--skip-install", action="store_true", help="use benchmarks/.venv-peers as it is")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server")
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379", help="Redis server (see --redis-dbs)"
    )
    parser.add_argument(
        "--redis-dbs",
        default=os.environ.get("BENCH_REDIS_DBS", "5,6,7"),
        help="the three Redis databases: locks, Celery's broker and results, Celery's run records "
        "(default 5,6,7 or $BENCH_REDIS_DBS)",
    )
    parser.add_argument("--db-prefix", default="jg_bench", help="prefix of the databases it creates")
    parser.add_argument("--warmup", type=int, default=None, help="jobs of the unmeasured warm-up run")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        args.redis_dbs = tuple(int(x) for x in args.redis_dbs.split(","))
    except ValueError:
        parser.error("--redis-dbs takes three integers, e.g. 5,6,7")
    if len(args.redis_dbs) != 3:
        parser.error("--redis-dbs takes three integers, e.g. 5,6,7")
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    for name in args.systems.split(","):
        if name not in SYSTEM_LABELS:
            parser.error(f"unknown system {name!r}; choose from {', '.join(SYSTEM_LABELS)}")
    return args


def sizes_for(args: argparse.Namespace) -> Sizes:
    """The workloads' sizes: the full or quick set, with the command line's overrides."""
    sizes = dataclasses.replace(QUICK if args.quick else FULL)
    if args.sizes:
        sizes.throughput = [int(x) for x in args.sizes.split(",")]
    if args.warmup is not None:
        sizes.warmup_jobs = args.warmup
    if args.backlog_rows:
        sizes.backlog_rows = args.backlog_rows
    if args.deep_depth:
        sizes.deep_depths = (sizes.deep_depths[0], args.deep_depth)
    if args.deep_jobs:
        # The shallow run drains its whole due set, as with the defaults.
        sizes.deep_jobs = args.deep_jobs
        sizes.deep_depths = (args.deep_jobs, sizes.deep_depths[1])
    if args.memory_jobs:
        sizes.memory_jobs = args.memory_jobs
    return sizes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sizes_for(args)
    for option, variable in ((args.jobguard, "BENCH_JOBGUARD"), (args.db_options, "BENCH_DB_OPTIONS")):
        if option:
            json.loads(option)  # fail here, not in every worker
            os.environ[variable] = option
    workloads = args.workloads.split(",")
    keys = [k for k in SYSTEM_LABELS if k in args.systems.split(",")]
    peers_needed = any(k != "jobguard" for k in keys) or args.profile
    peers_python = ensure_peers_venv(args.skip_install) if peers_needed else None
    servers = Servers(args.pg_url, args.redis_url, args.db_prefix, args.redis_dbs)
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    info = machine(servers, peers_python)
    started = time.monotonic()

    with tempfile.TemporaryDirectory(prefix="jg-bench-") as tmp:
        workdir = Path(tmp)
        if args.profile:
            text = profile(servers, workdir, sizes.throughput[0], peers_python)
            path = results_dir / f"profile-{stamp}.txt"
            path.write_text(text + "\n")
            print(text)
            log(f"wrote {path}")
            servers.close()
            return 0

        systems: dict[str, System] = {}
        for key in keys:
            python = sys.executable if key == "jobguard" else str(peers_python)
            system = {
                "jobguard": Jobguard,
                "dtdb": DjangoTasksDB,
                "celery": CeleryRedis,
                "celery_default": CeleryDefault,
                "procrastinate": Procrastinate,
            }[key](servers, python)
            log(f"setting up {system.label}")
            system.setup()
            systems[key] = system
        results = Results()
        for system in systems.values():
            if sizes.warmup_jobs:
                log(f"warm-up: {system.label}, {sizes.warmup_jobs} jobs (not measured)")
                throughput_run(system, workdir, sizes.warmup_jobs)

        def measure(
            workload: str, key: str, config: str, run: Callable[[], dict[str, float]]
        ) -> dict[str, float] | None:
            label = SYSTEM_LABELS.get(key, key)
            try:
                values = run()
            except BenchError as exc:
                results.errors.append(f"{workload} {label} {config}: {exc}")
                log(f"  FAILED {workload} {label} {config}: {str(exc)[:2000]}")
                return None
            results.add(workload, key, config, values)
            shown = ", ".join(f"{k}={v:,.2f}" for k, v in values.items() if isinstance(v, float))
            log(f"  {workload} {label} {config}: {shown}")
            return values

        for r in range(args.runs):
            log(f"round {r + 1}/{args.runs}")
            if "ceiling" in workloads:
                measure(
                    "ceiling", "postgresql", "pgbench", lambda: pgbench_run(servers, sizes.pgbench_seconds)
                )
            if "throughput" in workloads:
                for n in sizes.throughput:
                    for key, system in systems.items():
                        configs: list[tuple[str, tuple[str, bool, str] | None]] = [(f"n={n}", None)]
                        if isinstance(system, Jobguard):
                            configs = [
                                (f"n={n} atomic, metrics", HEADLINE),
                                (f"n={n} non-atomic, metrics", NON_ATOMIC),
                            ]
                        for config, shape in configs:
                            if isinstance(system, Jobguard) and shape:
                                system.configure(*shape)
                            measure(
                                "throughput", key, config, lambda s=system, n=n: throughput_run(s, workdir, n)
                            )
            if "bulk" in workloads:
                for key, system in systems.items():
                    if key in ("jobguard", "procrastinate"):
                        if isinstance(system, Jobguard):
                            system.configure(*HEADLINE)
                        measure(
                            "bulk", key, f"n={sizes.bulk}", lambda s=system: bulk_run(s, workdir, sizes.bulk)
                        )
            if "latency" in workloads:
                config = f"n={sizes.latency_jobs} @{sizes.latency_rate:g}/s"
                for key, system in systems.items():
                    if isinstance(system, Jobguard):
                        system.configure(*HEADLINE)
                    measure(
                        "latency",
                        key,
                        config,
                        lambda s=system: latency_run(s, workdir, sizes.latency_jobs, sizes.latency_rate),
                    )
            if "backlog" in workloads and "jobguard" in systems:
                empty = systems["jobguard"]
                assert isinstance(empty, Jobguard)
                full = Jobguard(servers, sys.executable, suffix="_backlog")
                if r == 0:
                    full.setup()
                fill_backlog(servers, full, sizes.backlog_rows)
                pair = [
                    (empty, f"n={sizes.backlog_jobs} empty table"),
                    (full, f"n={sizes.backlog_jobs} {sizes.backlog_rows:,} finished rows"),
                ]
                # Each round measures both tables back to back, in alternating order, so the
                # host's drift between rounds cancels out of the round's ratio.
                rates = {}
                for system, config in pair if r % 2 == 0 else pair[::-1]:
                    system.configure(*HEADLINE)
                    values = measure(
                        "backlog",
                        "jobguard",
                        config,
                        lambda s=system: throughput_run(s, workdir, sizes.backlog_jobs),
                    )
                    if values:
                        rates[system is full] = values["processing_rate"]
                if len(rates) == 2:
                    results.add("backlog", "jobguard", "paired", {"ratio": rates[True] / rates[False]})
            if "enqueue" in workloads and "jobguard" in systems:
                ours = systems["jobguard"]
                assert isinstance(ours, Jobguard)
                ours.configure(*HEADLINE)
                measure(
                    "enqueue",
                    "jobguard",
                    f"n={sizes.enqueue_jobs}",
                    lambda s=ours, save=results_dir / f"enqueue-insert-{stamp}.sql": enqueue_bound_run(
                        s, workdir, sizes.enqueue_jobs, sizes.bulk, sizes.pgbench_seconds, save=save
                    ),
                )
            if "deep" in workloads and "jobguard" in systems:
                shallow, deep = sizes.deep_depths
                spread, served = sizes.deep_queues
                shapes = [
                    (f"{shallow:,} queued, 1 queue", shallow, 1, 1),
                    (f"{deep:,} queued, 1 queue", deep, 1, 1),
                    (f"{deep:,} queued over {spread} queues, {served} served", deep, spread, served),
                ]
                if r == 0:
                    deep_systems = [
                        Jobguard(servers, sys.executable, suffix=f"_deep{k}") for k in range(len(shapes))
                    ]
                    for system in deep_systems:
                        system.setup()
                rates = {}
                order = list(zip(shapes, deep_systems, strict=True))
                for (label, depth, queues, serve), system in order if r % 2 == 0 else order[::-1]:
                    system.configure(*HEADLINE)
                    explain = (
                        results_dir / f"explain-{stamp}-deep{shapes.index((label, depth, queues, serve))}.txt"
                    )
                    values = measure(
                        "deep",
                        "jobguard",
                        label,
                        lambda s=system, d=depth, q=queues, v=serve, e=(explain if r == 0 else None): (
                            deep_run(s, workdir, sizes.deep_jobs, d, q, v, explain=e)
                        ),
                    )
                    if values:
                        rates[label] = values["processing_rate"]
                base = shapes[0][0]
                for label, *_ in shapes[1:]:
                    if base in rates and label in rates:
                        results.add(
                            "deep", "jobguard", f"paired {label}", {"ratio": rates[label] / rates[base]}
                        )
            if "memory" in workloads and "jobguard" in systems and r == 0:
                # Once, not every round: a million jobs take a quarter of an hour, and RSS
                # does not drift with the host's load as rates do.
                ours = systems["jobguard"]
                assert isinstance(ours, Jobguard)
                ours.configure(*HEADLINE)
                measure(
                    "memory",
                    "jobguard",
                    f"n={sizes.memory_jobs}",
                    lambda s=ours: memory_run(s, workdir, sizes.memory_jobs, sizes.memory_mark),
                )
            if "defaults" in workloads and "jobguard" in systems:
                ours = systems["jobguard"]
                assert isinstance(ours, Jobguard)
                ours.configure(*HEADLINE)
                # Rotated each round: the first slot runs just after another workload's writes
                # (a checkpoint, autovacuum), and must not always be the same configuration.
                order = (0, *sizes.concurrencies)
                shift = r % len(order)
                for concurrency in order[shift:] + order[:shift]:
                    ours.concurrency = concurrency
                    label = f"--concurrency {concurrency}" if concurrency else "no flags"
                    measure(
                        "defaults",
                        "jobguard",
                        label,
                        lambda s=ours: throughput_run(s, workdir, sizes.safety_jobs),
                    )
                ours.concurrency = CONCURRENCY
            if "safety" in workloads and "jobguard" in systems:
                ours = systems["jobguard"]
                assert isinstance(ours, Jobguard)
                for label, variant, metrics, lock_backend in SAFETY_CONFIGS:
                    ours.configure(variant, metrics, lock_backend)
                    measure(
                        "safety",
                        "jobguard",
                        label,
                        lambda s=ours: throughput_run(s, workdir, sizes.safety_jobs),
                    )
                ours.configure(*HEADLINE)
        servers.close()

    built = Report(results, sizes, keys)
    text = built.build(workloads)
    targets = built.targets
    command = " ".join(argv if argv is not None else sys.argv[1:])
    header = describe(info, command, args.runs, args.quick, (time.monotonic() - started) / 60)
    header += "\n\nSettings:\n\n" + "\n".join(
        f"- {system.label}: {system.settings()}" for system in systems.values()
    )
    document = header + "\n\n" + text
    if results.errors:
        document += "\n\n### Errors\n\n" + "\n".join(f"- {e[:500]}" for e in results.errors)
    print(document)
    data = {
        "meta": info | {"args": vars(args), "sizes": dataclasses.asdict(sizes)},
        "settings": {key: system.settings() for key, system in systems.items()},
        "results": results.as_list(),
        "targets": targets,
        "errors": results.errors,
        "table": document,
    }
    path = results_dir / f"bench-{stamp}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    (results_dir / "latest.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    log(f"wrote {path}")
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
