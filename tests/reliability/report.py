"""Print the headline figures of the last reliability run as a Markdown table.

Usage: ``python -m tests.reliability.report`` (reads ``artifacts/reliability/*.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "reliability"


def _recovery(f: dict[str, Any]) -> str:
    r = f.get("recovery") or {}
    if not r.get("orphaned_jobs"):
        return ""
    return (
        f"recovery max {r['max_seconds']} s (bound {r['bound_seconds']} s) "
        f"over {r['orphaned_jobs']} orphaned jobs"
    )


def headline(scenario: str, f: dict[str, Any]) -> str:
    """The figures that matter for one scenario, in one line."""
    common = (
        f"lost {f.get('lost')}, unexpected {f.get('unexpected')}, "
        f"duplicated executions {f.get('duplicated_executions')}, "
        f"duplicate effects {f.get('duplicate_effects')}"
    )
    parts: list[str] = []
    if scenario == "T0":
        parts = [common, f"{f['statuses']}", f"{f['jobs_per_second']} jobs/s"]
    elif scenario == "T1":
        ext = f["external"]
        parts = [
            common,
            f"{f['enqueued']} enqueued, {f['enqueue_failed']} rolled back",
            f"{f['statuses']}",
            f"worker deaths {f['worker_deaths']}",
            f"recovered {f['recovered']}",
            _recovery(f),
            f"external: {ext['requests']} requests for {ext['keys']} keys, "
            f"duplicate effects {ext['duplicate_effects']}",
            f"terminal {f['terminal_seconds_after_last_kill']} s after the last kill",
        ]
    elif scenario == "T2":
        parts = [
            f"live jobs re-claimed {f['live_jobs_reclaimed']} of {len(f['live_job_claims'])}",
            f"frozen jobs returned in {f['frozen_returned']['max_seconds']} s, "
            f"re-claimed in {f['frozen_reclaim_max_seconds']} s "
            f"(bound {f['frozen_returned']['bound_seconds']} s)",
            f"stale acks refused {f['frozen_stale_refusals']}",
        ]
    elif scenario == "T3":
        parts = [
            common,
            f"{f['backends_terminated']} connections terminated in {f['terminations']} rounds",
            f"{f['statuses']}",
            f"workers alive {f['workers_alive_at_end']}/3, started {f['workers_started']}",
        ]
    elif scenario == "T4":
        parts = [
            f"{f['repetitions']} repetitions",
            f"stale accepted {f['stale_accepted'] or 0}",
            f"refused {f['stale_refused']}",
            f"jobs with one ledger row {f['jobs_with_one_ledger_row']}",
        ]
    elif scenario in ("T5", "T5-restart"):
        parts = [
            f"runs without lock {f['runs_without_lock']}",
            f"lost updates {f['lost_updates']}",
            f"stale writes accepted {f['stale_writes_accepted']}",
            f"handlers started while Redis was down {f.get('handlers_started_while_redis_down', '-')}",
            f"paused holder's accesses refused {f.get('paused_holder_refusals', '-')}",
            f"fenced accesses refused {f['fenced_accesses_refused']}",
            f"fencing tokens reused {f['fencing_tokens_reused']}",
        ]
    elif scenario == "T6":
        parts = [
            f"premature re-claims {f['premature_reclaims']}",
            f"early starts {f['early_starts']} of {f['scheduled_claims_checked']} claims",
            f"clock offsets {f['observed_clock_offsets']}",
        ]
    elif scenario == "T8":
        parts = [
            f"healthy {f['healthy_succeeded']}/{f['healthy_total']}",
            f"poison {f['poison_outcome']}",
            f"worker deaths {f['worker_deaths']}",
        ]
    elif scenario == "T11":
        parts = [
            common,
            f"SIGTERM {f['sigterm']}",
            f"double SIGINT {f['double_sigint']}",
            f"handed back with attempt refunded {f['long_jobs_handed_back_with_attempt_refunded']}",
        ]
    elif scenario == "T3-idle":
        parts = [
            f"{f['connections_cut']} idle connections cut; "
            f"attempts of the next jobs {f['attempts_after_cut']}"
        ]
    elif scenario.startswith("T14"):
        parts = [
            f"{f['expected']} messages: lost {f['lost']}, unknown {f['unknown']}",
            f"order violations {f['order_violations']}",
            f"duplicates {f['duplicates']} (same id), under another id {f['duplicates_under_another_id']}",
            f"SIGKILLs {f['sigkills']}" if "sigkills" in f else f"restarts {f.get('restarts')}",
        ]
    elif scenario == "T13":
        parts = [f"invariant violations {f['invariant_violations_found']}", f"steps {f['steps']}"]
    else:
        parts = [json.dumps(f)[:200]]
    violations = f.get("invariant_violations") or {}
    parts.append(f"invariant rows {sum(violations.values())}")
    return "; ".join(p for p in parts if p)


def main() -> int:
    rows = []
    for path in sorted(ARTIFACTS.glob("*.json"), key=lambda p: (len(p.stem), p.stem)):
        data = json.loads(path.read_text())
        rows.append(
            f"| {data['scenario']} | {data['seed']} | {data['duration_seconds']} | "
            f"{headline(data['scenario'], data['figures'])} |"
        )
    sys.stdout.write("| id | seed | seconds | figures |\n| --- | --- | --- | --- |\n")
    sys.stdout.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
