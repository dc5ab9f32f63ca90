"""Medians, min and max of the runs; the Markdown tables, ratios and pass/fail targets."""

from __future__ import annotations

import collections
import statistics
from typing import Any

from benchmarks._systems import CONCURRENCY, SYSTEM_LABELS, WORKER_PROCESSES, ServerWork
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
#: ... and of its non-atomic runs (NON_ATOMIC).
NON_ATOMIC_LABEL = "non-atomic, metrics"


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
                "### Targets (issue 19)\n\n"
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
            lines = [(key, f"n={n}", SYSTEM_LABELS[key]) for key in self.systems if key != "jobguard"]
            if "jobguard" in self.systems:
                lines[:0] = [
                    ("jobguard", ours, "django-jobguard, atomic=True"),
                    ("jobguard", f"n={n} {NON_ATOMIC_LABEL}", "django-jobguard, non-atomic"),
                ]
            for key, config, label in lines:
                rows.append(
                    [
                        label,
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
                        fmt(r.median("throughput", key, config, "worker_rss_mib"), 0),
                    ]
                )
            headers = [
                "system",
                "enqueue jobs/s (one by one)",
                "enqueue CPU ms/job",
                "processing jobs/s",
                "ours (atomic)/peer processing",
                "ours/peer enqueue",
                "worker CPU ms/job",
                "PostgreSQL / Redis CPU ms/job",
                "worker + servers CPU ms/job",
                "worker RSS MiB/process",
            ]
            sections.append(
                f"### Throughput: {n:,} no-op jobs, {WORKER_PROCESSES} worker processes x {CONCURRENCY}\n\n"
                + table(headers, rows)
            )
        n0 = f"n={self.sizes.throughput[0]}"
        atomic = r.median("throughput", "jobguard", f"{n0} {OURS}", "processing_rate")
        plain = r.median("throughput", "jobguard", f"{n0} {NON_ATOMIC_LABEL}", "processing_rate")
        celery = r.median("throughput", "celery_default", n0, "processing_rate")
        dtdb = r.median("throughput", "dtdb", n0, "processing_rate")
        # Issue 19's targets are stated against Celery's default worker, not the tuned one.
        for ours_rate, what, peer, peer_key, need in (
            (plain, "non-atomic", celery, "celery_default", 4.0),
            (atomic, "atomic", celery, "celery_default", 2.5),
            (atomic, "atomic", dtdb, "dtdb", 8.0),
        ):
            if ours_rate and peer:
                name = f"processing rate ({what}) >= {need:g}x {SYSTEM_LABELS[peer_key]} ({n0})"
                self.target(name, ours_rate / peer, need, ">=", "x")
        for what, config, limit in ((NON_ATOMIC_LABEL, "non-atomic", 0.35), (OURS, "atomic", 0.6)):
            total = r.median("throughput", "jobguard", f"{n0} {what}", "total_cpu_ms_per_job")
            self.target(f"total CPU per job ({config}) <= {limit:g} ms ({n0})", total, limit, "<=", "ms")
        ceiling = r.median("ceiling", "postgresql", "pgbench", "commit_rate")
        if atomic and ceiling:
            name = "processing rate (atomic) below PostgreSQL's single-row commit rate"
            self.target(name, atomic / ceiling, 1.0, "<=", "x")
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
        for pct, limit in ((50, 2.0), (99, 5.0)):
            self.target(
                f"enqueue-to-start p{pct} <= {limit:g} ms (LISTEN/NOTIFY)",
                r.median("latency", "jobguard", config, f"latency_p{pct}_ms"),
                limit,
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

    def enqueue(self) -> str:
        r = self.results
        config = f"n={self.sizes.enqueue_jobs}"
        stat = r.stat("enqueue", "jobguard", config, "enqueue_rate")
        if not stat:
            return ""
        rows = [
            [
                cell(r.stat("enqueue", "jobguard", config, "pgbench_insert_tps")),
                cell(stat),
                cell(r.stat("enqueue", "jobguard", config, "enqueue_vs_pgbench"), 2),
                cell(r.stat("enqueue", "jobguard", config, "bulk_enqueue_rate")),
                cell(r.stat("enqueue", "jobguard", config, "bulk_vs_single"), 1),
            ]
        ]
        self.target(
            "enqueue one by one within 10% of pgbench -c1 with the same INSERT",
            r.median("enqueue", "jobguard", config, "enqueue_vs_pgbench"),
            0.9,
            ">=",
            "x",
        )
        self.target(
            "bulk_enqueue >= 20x one-by-one enqueue",
            r.median("enqueue", "jobguard", config, "bulk_vs_single"),
            20.0,
            ">=",
            "x",
        )
        headers = [
            "pgbench -c1, our INSERT (tps)",
            "enqueue() one by one (jobs/s)",
            "enqueue / pgbench",
            f"bulk_enqueue, calls of 1,000, {self.sizes.bulk:,} jobs (jobs/s)",
            "bulk / one by one",
        ]
        return (
            f"### Enqueue against its bound: {self.sizes.enqueue_jobs:,} jobs one by one (atomic task), "
            "pgbench -c1 sending the INSERT captured from a real enqueue, same run\n\n" + table(headers, rows)
        )

    def deep(self) -> str:
        r = self.results
        shallow, deep = self.sizes.deep_depths
        spread, served = self.sizes.deep_queues
        labels = [
            f"{shallow:,} queued, 1 queue",
            f"{deep:,} queued, 1 queue",
            f"{deep:,} queued over {spread} queues, {served} served",
        ]
        rows = []
        for label in labels:
            paired = r.stat("deep", "jobguard", f"paired {label}", "ratio")
            rows.append(
                [
                    label,
                    cell(r.stat("deep", "jobguard", label, "processing_rate")),
                    cell(paired, 2) if paired else "1.00x (base)" if label == labels[0] else "-",
                    cell(r.stat("deep", "jobguard", label, "worker_cpu_ms_per_job"), 2),
                    fmt(r.median("deep", "jobguard", label, "postgres_cpu_ms_per_job"), 2),
                ]
            )
            if paired and label != labels[0]:
                self.target(
                    f"deep backlog: {label} within 10% of {labels[0]}", paired["median"], 0.9, ">=", "x"
                )
        headers = [
            "due set",
            "processing jobs/s",
            f"vs {labels[0]} (per round)",
            "worker CPU ms/job",
            "PostgreSQL CPU ms/job",
        ]
        return (
            f"### Deep backlog: {self.sizes.deep_jobs:,} jobs drained (`--max-jobs`) from a due set that "
            f"stays this deep ({OURS}); claim plans in benchmarks/results/explain-*.txt\n\n"
            + table(headers, rows)
            + "\n\nWhat PostgreSQL did per job, and where the time of its backends' transactions went "
            "(shares of `pg_stat_activity` samples every 10 ms of backends active or idle in a "
            "transaction; client: inside a transaction, waiting for the worker's next statement):\n\n"
            + self._deep_server_work(labels)
        )

    def _deep_server_work(self, labels: list[str]) -> str:
        def median(label: str, metric: str) -> float | None:
            return self.results.median("deep", "jobguard", label, metric)

        def share(label: str, category: str) -> str:
            value = median(label, f"wait_{category}")
            return "-" if value is None else f"{value:.0%}"

        categories = ServerWork.CATEGORIES
        rows = [
            [
                label,
                fmt(median(label, "wal_bytes_per_job"), 0),
                fmt(median(label, "wal_fpi_per_job"), 2),
                fmt(median(label, "blocks_hit_per_job"), 1),
                fmt(median(label, "blocks_read_per_job"), 2),
                fmt(median(label, "backend_writes_per_job"), 2),
                *(share(label, c) for c in categories),
            ]
            for label in labels
        ]
        headers = [
            "due set",
            "WAL bytes/job",
            "full-page images/job",
            "buffer hits/job",
            "blocks read/job",
            "writes by backends/job",
            *(f"{c.replace('_', ' ')} %" for c in categories),
        ]
        return table(headers, rows)

    def memory(self) -> str:
        r = self.results
        config = f"n={self.sizes.memory_jobs}"
        ratio_stat = r.stat("memory", "jobguard", config, "rss_end_vs_mark")
        self.target(
            f"worker RSS after {self.sizes.memory_jobs:,} jobs within 10% of {self.sizes.memory_mark:,}",
            ratio_stat["median"] if ratio_stat else None,
            1.1,
            "<=",
            "x",
        )
        rows = [
            [
                cell(r.stat("memory", "jobguard", config, "rss_mark_mib"), 1),
                cell(r.stat("memory", "jobguard", config, "rss_end_mib"), 1),
                cell(ratio_stat, 3),
            ]
        ]
        headers = [
            f"RSS MiB/process after {self.sizes.memory_mark:,}",
            f"after {self.sizes.memory_jobs:,}",
            "ratio",
        ]
        return (
            f"### Memory: worker RSS per process, {WORKER_PROCESSES} processes x {CONCURRENCY}, "
            f"{self.sizes.memory_jobs:,} jobs (bulk-enqueued, {OURS}), one run\n\n" + table(headers, rows)
        )

    def defaults(self) -> str:
        r = self.results
        labels = ["no flags"] + [f"--concurrency {c}" for c in self.sizes.concurrencies]
        medians = {label: r.median("defaults", "jobguard", label, "processing_rate") for label in labels}
        measured = {label: rate for label, rate in medians.items() if rate and label != "no flags"}
        best = max(measured, key=lambda label: measured[label]) if measured else None
        rows = [
            [
                label + (" (best)" if label == best else ""),
                cell(r.stat("defaults", "jobguard", label, "processing_rate")),
                ratio(medians[label], measured[best] if best else None),
                cell(r.stat("defaults", "jobguard", label, "worker_cpu_ms_per_job"), 2),
            ]
            for label in labels
        ]
        if best and medians["no flags"]:
            self.target(
                f"jobguard_worker with no flags >= 80% of the best ({best})",
                medians["no flags"] / measured[best],
                0.8,
                ">=",
                "x",
            )
        return (
            f"### Fast defaults: `jobguard_worker` with no flags against `--concurrency`, "
            f"{self.sizes.safety_jobs:,} no-op jobs, {WORKER_PROCESSES} processes ({OURS})\n\n"
            + table(["worker flags", "processing jobs/s", "vs best", "worker CPU ms/job"], rows)
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
