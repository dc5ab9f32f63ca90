"""Medians, min and max of the runs; the Markdown tables, ratios and pass/fail targets."""

from __future__ import annotations

import collections
import statistics
from typing import Any

from benchmarks._systems import CONCURRENCY, SYSTEM_LABELS, WORKER_PROCESSES
from benchmarks._workloads import SAFETY_CONFIGS, Sizes


class Results:
    """Per-run values keyed by (workload, system, config, metric); summarised as median/min/max."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str, str, str], list[float]] = collections.defaultdict(list)
        self.errors: list[str] = []

    def add(self, workload: str, system: str, config: str, metrics: dict[str, float]) -> None:
        for metric, value in metrics.items():
            if isinstance(value, int | float):
                self.values[(workload, system, config, metric)].append(float(value))

    def stat(self, workload: str, system: str, config: str, metric: str) -> dict[str, float] | None:
        values = self.values.get((workload, system, config, metric))
        if not values:
            return None
        return {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "runs": len(values),
        }

    def median(self, workload: str, system: str, config: str, metric: str) -> float | None:
        stat = self.stat(workload, system, config, metric)
        return stat["median"] if stat else None

    def as_list(self) -> list[dict[str, Any]]:
        return [
            {
                "workload": workload,
                "system": system,
                "config": config,
                "metric": metric,
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "values": values,
            }
            for (workload, system, config, metric), values in self.values.items()
        ]


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def cell(stat: dict[str, float] | None, digits: int = 0) -> str:
    if stat is None:
        return "-"
    return f"{fmt(stat['median'], digits)} ({fmt(stat['min'], digits)}-{fmt(stat['max'], digits)})"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"]
    lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    for row in rows:
        lines.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return "\n".join(lines)


def ratio(ours: float | None, peer: float | None, digits: int = 2) -> str:
    if ours is None or peer is None or peer == 0:
        return "-"
    return f"{ours / peer:.{digits}f}x"


#: The configuration label of django-jobguard's headline runs (see HEADLINE).
OURS = "atomic, metrics"


def server_cpu(results: Results, workload: str, system: str, config: str) -> str:
    """'PostgreSQL / Redis' CPU ms per job, medians."""
    pg = results.median(workload, system, config, "postgres_cpu_ms_per_job")
    redis = results.median(workload, system, config, "redis_cpu_ms_per_job")
    return f"{fmt(pg, 2)} / {fmt(redis, 2)}"


class Report:
    """Builds the Markdown tables of one invocation and checks the issue's targets."""

    def __init__(self, results: Results, sizes: Sizes, systems: list[str]) -> None:
        self.results = results
        self.sizes = sizes
        self.systems = systems
        self.targets: list[dict[str, Any]] = []

    def target(self, name: str, value: float | None, threshold: float, op: str, unit: str = "") -> None:
        if value is None:
            return
        passed = value >= threshold if op == ">=" else value <= threshold
        self.targets.append(
            {"target": name, "value": value, "op": op, "threshold": threshold, "unit": unit, "pass": passed}
        )

    def build(self, workloads: list[str]) -> str:
        sections = [getattr(self, workload)() for workload in workloads]
        if self.targets:
            sections.append(
                "### Targets (issue 7)\n\n"
                + "\n".join(
                    f"- {'PASS' if t['pass'] else 'FAIL'}: {t['target']}: {t['value']:.2f}{t['unit']} "
                    f"(target {t['op']} {t['threshold']:g}{t['unit']})"
                    for t in self.targets
                )
            )
        return "\n\n".join(section for section in sections if section)

    def throughput(self) -> str:
        r = self.results
        sections = []
        for n in self.sizes.throughput:
            ours = f"n={n} {OURS}"
            rows = []
            for key in self.systems:
                config = ours if key == "jobguard" else f"n={n}"
                rows.append(
                    [
                        SYSTEM_LABELS[key],
                        cell(r.stat("throughput", key, config, "enqueue_rate")),
                        fmt(r.median("throughput", key, config, "enqueue_cpu_ms_per_job"), 2),
                        cell(r.stat("throughput", key, config, "processing_rate")),
                        ratio(
                            r.median("throughput", "jobguard", ours, "processing_rate"),
                            r.median("throughput", key, config, "processing_rate"),
                        ),
                        ratio(
                            r.median("throughput", "jobguard", ours, "enqueue_rate"),
                            r.median("throughput", key, config, "enqueue_rate"),
                        ),
                        cell(r.stat("throughput", key, config, "worker_cpu_ms_per_job"), 2),
                        server_cpu(r, "throughput", key, config),
                        fmt(r.median("throughput", key, config, "total_cpu_ms_per_job"), 2),
                    ]
                )
            headers = [
                "system",
                "enqueue jobs/s (one by one)",
                "enqueue CPU ms/job",
                "processing jobs/s",
                "ours/peer processing",
                "ours/peer enqueue",
                "worker CPU ms/job",
                "PostgreSQL / Redis CPU ms/job",
                "worker + servers CPU ms/job",
            ]
            sections.append(
                f"### Throughput: {n:,} no-op jobs, {WORKER_PROCESSES} worker processes x {CONCURRENCY}\n\n"
                + table(headers, rows)
            )
        n0 = f"n={self.sizes.throughput[0]}"
        ours_rate = r.median("throughput", "jobguard", f"{n0} {OURS}", "processing_rate")
        for key, need in (("dtdb", 3.0), ("celery", 2.5)):
            peer = r.median("throughput", key, n0, "processing_rate")
            if ours_rate and peer:
                name = f"processing rate >= {need:g}x {SYSTEM_LABELS[key]} ({n0})"
                self.target(name, ours_rate / peer, need, ">=", "x")
        peer = r.median("throughput", "dtdb", n0, "enqueue_rate")
        ours_enq = r.median("throughput", "jobguard", f"{n0} {OURS}", "enqueue_rate")
        if ours_enq and peer:
            self.target(f"enqueue rate >= 1.5x django-tasks-db ({n0})", ours_enq / peer, 1.5, ">=", "x")
        cpu = r.median("throughput", "jobguard", f"{n0} {OURS}", "worker_cpu_ms_per_job")
        self.target(f"worker CPU per no-op job <= 1.5 ms ({n0})", cpu, 1.5, "<=", "ms")
        ceiling = r.median("ceiling", "postgresql", "pgbench", "commit_rate")
        if ours_rate and ceiling:
            name = "processing rate below PostgreSQL's single-row commit rate"
            self.target(name, ours_rate / ceiling, 1.0, "<=", "x")
        return "\n\n".join(sections)

    def bulk(self) -> str:
        r = self.results
        config = f"n={self.sizes.bulk}"
        single_dtdb = r.median("throughput", "dtdb", f"n={self.sizes.throughput[0]}", "enqueue_rate")
        ours = r.median("bulk", "jobguard", config, "bulk_enqueue_rate")
        rows = []
        for key in self.systems:
            stat = r.stat("bulk", key, config, "bulk_enqueue_rate")
            if stat:
                rows.append(
                    [
                        SYSTEM_LABELS[key],
                        cell(stat),
                        ratio(ours, stat["median"]),
                        ratio(stat["median"], single_dtdb),
                    ]
                )
        if ours and single_dtdb:
            self.target("bulk enqueue >= 5x django-tasks-db enqueue", ours / single_dtdb, 5.0, ">=", "x")
        return f"### Bulk enqueue: {self.sizes.bulk:,} jobs in calls of 1,000\n\n" + table(
            ["system", "jobs/s", "ours/peer", "vs django-tasks-db one by one"], rows
        )

    def latency(self) -> str:
        r = self.results
        config = f"n={self.sizes.latency_jobs} @{self.sizes.latency_rate:g}/s"
        rows = [
            [SYSTEM_LABELS[key]]
            + [cell(r.stat("latency", key, config, f"latency_p{p}_ms"), 1) for p in (50, 95, 99)]
            for key in self.systems
        ]
        self.target(
            "enqueue-to-start p50 <= 10 ms (LISTEN/NOTIFY)",
            r.median("latency", "jobguard", config, "latency_p50_ms"),
            10.0,
            "<=",
            "ms",
        )
        return (
            f"### Latency: idle workers, {self.sizes.latency_jobs} jobs enqueued one at a time at "
            f"~{self.sizes.latency_rate:g}/s, enqueue to start (ms)\n\n"
            + table(["system", "p50", "p95", "p99"], rows)
        )

    def backlog(self) -> str:
        r = self.results
        empty_config = f"n={self.sizes.backlog_jobs} empty table"
        full_config = f"n={self.sizes.backlog_jobs} {self.sizes.backlog_rows:,} finished rows"
        rows = [
            [
                config,
                cell(r.stat("backlog", "jobguard", config, "processing_rate")),
                cell(r.stat("backlog", "jobguard", config, "worker_cpu_ms_per_job"), 2),
                server_cpu(r, "backlog", "jobguard", config),
            ]
            for config in (empty_config, full_config)
        ]
        empty = r.median("backlog", "jobguard", empty_config, "processing_rate")
        full = r.median("backlog", "jobguard", full_config, "processing_rate")
        paired = r.stat("backlog", "jobguard", "paired", "ratio")
        # The target takes the median of each round's ratio (both tables measured back to
        # back) when there is one: the ratio of medians mixes rounds the host ran at
        # different speeds.
        value = paired["median"] if paired else (full / empty if empty and full else None)
        self.target("backlog processing rate within 10% of the empty table", value, 0.9, ">=", "x")
        by_round = f"; per round, median (min-max): {cell(paired, 2)}" if paired else ""
        return (
            f"### Backlog: django-jobguard with finished rows in the table ({OURS})\n\n"
            + table(
                ["table", "processing jobs/s", "worker CPU ms/job", "PostgreSQL / Redis CPU ms/job"], rows
            )
            + f"\n\nbacklog / empty, medians: {ratio(full, empty)}{by_round}"
        )

    def safety(self) -> str:
        r = self.results
        base = SAFETY_CONFIGS[0][0]
        base_rate = r.median("safety", "jobguard", base, "processing_rate")
        base_cpu = r.median("safety", "jobguard", base, "worker_cpu_ms_per_job")
        rows = []
        for label, *_ in SAFETY_CONFIGS:
            cpu = r.median("safety", "jobguard", label, "worker_cpu_ms_per_job")
            rows.append(
                [
                    label,
                    cell(r.stat("safety", "jobguard", label, "enqueue_rate")),
                    cell(r.stat("safety", "jobguard", label, "processing_rate")),
                    ratio(r.median("safety", "jobguard", label, "processing_rate"), base_rate),
                    cell(r.stat("safety", "jobguard", label, "worker_cpu_ms_per_job"), 2),
                    f"{cpu - base_cpu:+.2f}" if cpu is not None and base_cpu is not None else "-",
                    server_cpu(r, "safety", "jobguard", label),
                ]
            )
        headers = [
            "configuration",
            "enqueue jobs/s",
            "processing jobs/s",
            "vs baseline",
            "worker CPU ms/job",
            "worker CPU delta",
            "PostgreSQL / Redis CPU ms/job",
        ]
        return (
            f"### Safety costs: django-jobguard, {self.sizes.safety_jobs:,} no-op jobs, "
            "each feature alone\n\n" + table(headers, rows)
        )

    def ceiling(self) -> str:
        r = self.results
        many = r.stat("ceiling", "postgresql", "pgbench", "commit_rate")
        one = r.stat("ceiling", "postgresql", "pgbench", "commit_rate_1_client")
        rows = [
            [f"{WORKER_PROCESSES * CONCURRENCY} clients (as many as executor threads)", cell(many)],
            ["1 client (one process enqueueing one by one)", cell(one)],
        ]
        return "### Ceiling: PostgreSQL single-row UPDATE commits (pgbench)\n\n" + table(
            ["pgbench", "commits/s"], rows
        )
