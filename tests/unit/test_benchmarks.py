"""The benchmark harness's own logic: percentiles, medians, the exactly-once check, targets."""

from __future__ import annotations

import re
from typing import Any

import pytest

from benchmarks._report import Report, Results
from benchmarks._systems import BenchError, Record, ServerWork, System, verify
from benchmarks._workloads import QUICK, percentile


class CannedSystem(System):
    """A system whose store holds the given records (the check under test reads nothing else)."""

    key = "jobguard"

    def __init__(self, records: list[Record]) -> None:
        self._records = records

    def records(self) -> list[Record]:
        return self._records


def record(index: int, runs: int = 1, succeeded: bool = True) -> Record:
    return Record(index, 1.0, 2.0 + index, 3.0 + index, runs, succeeded)


def test_percentile_interpolates_between_closest_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 95) == 7.0


def test_results_summarise_runs_as_median_min_max() -> None:
    results = Results()
    for value in (900.0, 1100.0, 1000.0):
        results.add("throughput", "jobguard", "n=10", {"processing_rate": value})
    assert results.stat("throughput", "jobguard", "n=10", "processing_rate") == {
        "median": 1000.0,
        "min": 900.0,
        "max": 1100.0,
        "runs": 3,
    }
    assert results.stat("throughput", "dtdb", "n=10", "processing_rate") is None


def test_verify_accepts_every_job_run_exactly_once() -> None:
    records = verify(CannedSystem([record(i) for i in range(5)]), 5)
    assert sorted(r.index for r in records) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([record(0), record(1)], "1 jobs missing"),
        ([record(0), record(1, runs=2), record(2)], "1 run more than once (e.g. [1])"),
        ([record(0), record(1, succeeded=False), record(2)], "1 not succeeded"),
        ([record(0), record(1), record(1), record(2)], "1 duplicated rows"),
    ],
)
def test_verify_refuses_lost_duplicated_or_failed_jobs(records: list[Record], message: str) -> None:
    with pytest.raises(BenchError) as excinfo:
        verify(CannedSystem(records), 3)
    assert message in str(excinfo.value)


def test_verify_leaves_warm_up_jobs_out() -> None:
    from benchmarks._common import WARMUP_INDEX

    records = verify(CannedSystem([record(0), record(WARMUP_INDEX + 1, runs=3)]), 1)
    assert [r.index for r in records] == [0]


def test_report_checks_the_issue_targets_on_medians() -> None:
    results = Results()
    n = f"n={QUICK.throughput[0]}"
    results.add("throughput", "jobguard", f"{n} atomic, metrics", {"processing_rate": 900.0})
    results.add("throughput", "jobguard", f"{n} atomic, metrics", {"total_cpu_ms_per_job": 0.5})
    results.add("throughput", "jobguard", f"{n} non-atomic, metrics", {"processing_rate": 1300.0})
    results.add("throughput", "jobguard", f"{n} non-atomic, metrics", {"total_cpu_ms_per_job": 0.4})
    results.add("throughput", "dtdb", n, {"processing_rate": 100.0})
    results.add("throughput", "celery_default", n, {"processing_rate": 400.0})
    results.add("throughput", "celery", n, {"processing_rate": 100.0})  # the tuned row sets no target
    report = Report(results, QUICK, ["jobguard", "dtdb", "celery_default", "celery"])
    text = report.build(["throughput"])
    assert "### Targets (issue 19)" in text
    assert (
        "- FAIL: processing rate (non-atomic) >= 4x Celery+Redis (default) (n=1000): 3.25x (target >= 4x)"
        in text
    )
    assert "- FAIL: processing rate (atomic) >= 2.5x Celery+Redis (default) (n=1000): 2.25x" in text
    assert "- PASS: processing rate (atomic) >= 8x django-tasks-db (n=1000): 9.00x (target >= 8x)" in text
    assert "- FAIL: total CPU per job (non-atomic) <= 0.35 ms (n=1000): 0.40ms" in text
    assert "- PASS: total CPU per job (atomic) <= 0.6 ms (n=1000): 0.50ms" in text
    assert "Celery+Redis (tuned)" not in "".join(t["target"] for t in report.targets)
    dtdb_row = next(line for line in text.splitlines() if line.startswith("| django-tasks-db"))
    assert "| 100 (100-100)" in dtdb_row
    assert "| 9.00x" in dtdb_row
    assert any(line.startswith("| django-jobguard, non-atomic") for line in text.splitlines())


def test_deep_and_defaults_targets_use_paired_rounds_and_the_best_concurrency() -> None:
    results = Results()
    shallow, deep = QUICK.deep_depths
    base = f"{shallow:,} queued, 1 queue"
    for label, rate in ((base, 1000.0), (f"{deep:,} queued, 1 queue", 950.0)):
        results.add("deep", "jobguard", label, {"processing_rate": rate})
    results.add("deep", "jobguard", f"paired {deep:,} queued, 1 queue", {"ratio": 0.95})
    for label, rate in (("no flags", 500.0), ("--concurrency 1", 500.0), ("--concurrency 4", 1000.0)):
        results.add("defaults", "jobguard", label, {"processing_rate": rate})
    text = Report(results, QUICK, ["jobguard"]).build(["deep", "defaults"])
    assert f"- PASS: deep backlog: {deep:,} queued, 1 queue within 10% of {base}: 0.95x" in text
    assert "- FAIL: jobguard_worker with no flags >= 80% of the best (--concurrency 4): 0.50x" in text
    assert "| --concurrency 4 (best)" in text


def test_backlog_target_takes_the_median_of_each_rounds_ratio() -> None:
    # Rounds of (empty, full) rates measured back to back. The ratio of the medians pairs
    # round 1's empty table with round 2's full one; each round's own ratio does not.
    results = Results()
    empty = f"n={QUICK.backlog_jobs} empty table"
    full = f"n={QUICK.backlog_jobs} {QUICK.backlog_rows:,} finished rows"
    for empty_rate, full_rate in ((1000.0, 700.0), (700.0, 680.0), (1000.0, 990.0)):
        results.add("backlog", "jobguard", empty, {"processing_rate": empty_rate})
        results.add("backlog", "jobguard", full, {"processing_rate": full_rate})
        results.add("backlog", "jobguard", "paired", {"ratio": full_rate / empty_rate})
    text = Report(results, QUICK, ["jobguard"]).build(["backlog"])
    assert "- PASS: backlog processing rate within 10% of the empty table: 0.97x (target >= 0.9x)" in text
    assert "backlog / empty, medians: 0.70x; per round, median (min-max): 0.97 (0.70-0.99)" in text


def test_backlog_target_falls_back_to_the_ratio_of_medians_without_pairs() -> None:
    results = Results()
    results.add("backlog", "jobguard", f"n={QUICK.backlog_jobs} empty table", {"processing_rate": 1000.0})
    full = f"n={QUICK.backlog_jobs} {QUICK.backlog_rows:,} finished rows"
    results.add("backlog", "jobguard", full, {"processing_rate": 850.0})
    text = Report(results, QUICK, ["jobguard"]).build(["backlog"])
    assert "- FAIL: backlog processing rate within 10% of the empty table: 0.85x (target >= 0.9x)" in text


def _checkouts() -> list[Any]:
    from benchmarks import bench_compare as compare

    old, new = compare.Checkout.__new__(compare.Checkout), compare.Checkout.__new__(compare.Checkout)
    for checkout, name in ((old, "old"), (new, "new")):
        checkout.ref, checkout.sha, checkout.name = name, "0123456789abcdef", name
    return [old, new]


def test_compare_reports_medians_and_each_rounds_own_ratio(tmp_path) -> None:
    from benchmarks import bench_compare as compare

    configs = compare.select(compare.DEFAULT_CONFIGS)
    rates = {"old": [1000.0, 500.0, 1000.0], "new": [1100.0, 550.0, 900.0]}
    runs = {
        (config.name, name): [
            {"processing_rate": rate, "worker_cpu_ms_per_job": 0.5, "total_cpu_ms_per_job": 1.0}
            for rate in rates[name]
        ]
        for config in configs
        for name in ("old", "new")
    }
    text, data = compare.report(_checkouts(), configs, runs, 1000, [])
    row = next(line for line in text.splitlines() if line.startswith("| atomic") and "processing" in line)
    assert "1,000 [500-1,000]" in row
    assert "900 [550-1,100]" in row
    # The ratio of the medians pairs round 1's old with round 3's new; each round's own
    # new/old (1.1, 1.1, 0.9) does not.
    assert "| 0.900 " in row
    assert "1.100 [0.900-1.100]" in row
    figures = {(d["config"], d["metric"]): d for d in data}
    assert figures[("plain", "worker_cpu_ms_per_job")]["ratio_of_medians"] == 1.0


def test_compare_selects_plain_and_atomic_by_default_and_every_configuration_with_all() -> None:
    from benchmarks import bench_compare as compare

    assert [c.name for c in compare.select(compare.DEFAULT_CONFIGS)] == ["plain", "atomic"]
    assert [c.name for c in compare.select("all")] == list(compare.CONFIGS)
    assert [c.name for c in compare.select("traced, keyed")] == ["keyed", "traced"]
    with pytest.raises(ValueError, match="unknown configuration"):
        compare.select("plain,fast")


def test_compare_shows_a_configuration_the_old_commit_cannot_run_as_a_dash_with_its_note() -> None:
    from benchmarks import bench_compare as compare

    configs = compare.select("plain,keyed")
    one = {"processing_rate": 1000.0, "worker_cpu_ms_per_job": 0.5, "total_cpu_ms_per_job": 1.0}
    runs = {("plain", "old"): [one], ("plain", "new"): [one], ("keyed", "old"): [], ("keyed", "new"): [one]}
    note = "keyed: old cannot run it (no `Limit` in its django_jobguard): shown as -"
    text, _ = compare.report(_checkouts(), configs, runs, 1000, [note])
    row = next(line for line in text.splitlines() if line.startswith("| keyed") and "processing" in line)
    assert row.split("|")[3].strip() == "-"
    assert row.split("|")[4].strip() == "1,000 [1,000-1,000]"
    assert row.split("|")[5].strip() == "-"  # no ratio without the old figure
    assert f"- {note}" in text
    assert "median [min-max] of 1 interleaved runs" in text


def test_deep_jobs_drains_more_per_run_and_the_shallow_set_is_that_deep() -> None:
    from benchmarks.bench_peers import parse_args, sizes_for

    sizes = sizes_for(parse_args(["--deep-jobs", "20000"]))
    assert (sizes.deep_jobs, sizes.deep_depths) == (20_000, (20_000, 1_000_000))
    assert sizes_for(parse_args([])).deep_depths == (5_000, 1_000_000)


@pytest.mark.parametrize(
    ("state", "kind", "event", "category"),
    [
        ("active", None, None, "cpu"),
        ("active", "IO", "WALSync", "wal"),
        ("active", "LWLock", "WALWrite", "wal"),
        ("active", "IO", "DataFileRead", "data_io"),
        ("active", "Lock", "transactionid", "lock"),
        ("active", "LWLock", "BufferMapping", "lock"),
        ("idle", "Client", "ClientRead", None),
        ("idle in transaction", "Client", "ClientRead", "client"),
        ("active", "Timeout", "PgSleep", "other"),
    ],
)
def test_deep_runs_sort_backend_samples_into_what_the_backend_was_doing(state, kind, event, category) -> None:
    assert ServerWork.category(state, kind, event) == category


def test_deep_report_shows_the_server_work_per_job_beside_the_rates() -> None:
    results = Results()
    shallow, _ = QUICK.deep_depths
    base = f"{shallow:,} queued, 1 queue"
    results.add(
        "deep",
        "jobguard",
        base,
        {"processing_rate": 1000.0, "wal_bytes_per_job": 812.4, "wal_fpi_per_job": 0.25, "wait_wal": 0.4},
    )
    text = Report(results, QUICK, ["jobguard"]).build(["deep"])
    row = next(line for line in text.splitlines() if line.startswith(f"| {base}") and "812" in line)
    assert "| 0.25 " in row and "| 40% " in row


def _atomic_run(rate: float, commits: float = 1.0) -> dict[str, Any]:
    return {
        "rate": rate,
        "commits_per_job": commits,
        "client_cpu_ms": 0.4,
        "postgres_cpu_ms": 0.3,
        "total_cpu_ms": 0.7,
        "busy": 0.9,
    }


def test_atomic_report_gives_each_rounds_ratio_and_what_the_workers_sent() -> None:
    from benchmarks import bench_atomic

    runs = {
        "jobguard": [_atomic_run(1000.0, 1.1), _atomic_run(600.0, 1.1), _atomic_run(900.0, 1.2)],
        "pgbench": [_atomic_run(2000.0), _atomic_run(1000.0), _atomic_run(2000.0)],
    }
    counted = {
        "round_trips_per_job": 3.1,
        "statements_per_job": 4.1,
        "commits_per_job": 1.12,
        "kinds_per_job": {"BEGIN": 1.0, "EXECUTE ack_0(7)": 0.5, "EXECUTE ack_0(8)": 0.5, "SELECT 1": 0.0001},
    }
    text = bench_atomic.report(runs, counted, ["jobguard", "pgbench"])
    rate_row = next(line for line in text.splitlines() if line.startswith("| jobs/s"))
    assert "900 [600-1,000]" in rate_row
    assert "2,000 [1,000-2,000]" in rate_row
    # Each round against its own pgbench run (0.5, 0.6, 0.45), not the ratio of the medians (0.45).
    assert "0.500, 0.600, 0.450; median **0.500**" in text
    assert "3.100 round trips, 4.100 statements, 1.120 commits" in text
    assert "| `BEGIN` " in text
    assert re.search(r"\| `EXECUTE ack_0\(N\)` +\| 1\.000 ", text)  # one statement, whichever job's id
    assert "SELECT 1" not in text  # under a thousandth of a statement per job: counted as the rest
    assert re.search(r"\| everything else +\| 0\.000 ", text)
