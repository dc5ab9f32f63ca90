"""Metric names, labels, the reference page, and the dashboard and alerts that use them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import prometheus_client
import pytest
from django.db import IntegrityError

from django_jobguard import store
from django_jobguard.monitoring import metrics
from tests.support.prometheus import alert_rules

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: Labels Prometheus itself adds or histograms carry, usable in expressions besides ours.
BUILTIN_LABELS = {"le", "instance", "job"}


def exposed_series() -> dict[str, set[str]]:
    """Every series name a scrape can show, with the labels its family carries."""
    series: dict[str, set[str]] = {}
    for info in metrics.CATALOGUE:
        labels = set(info.labels)
        if info.type == "counter":
            base = info.name.removesuffix("_total")
            names = [info.name, base + "_created"]
        elif info.type == "histogram":
            names = [info.name + suffix for suffix in ("_bucket", "_count", "_sum", "_created")]
            labels.add("le")
        else:
            names = [info.name]
        for name in names:
            series[name] = labels
    # The dashboard's cache miss ratio reads django-prometheus's cache counters.
    from django_prometheus.cache import metrics as cache_metrics

    for counter in (cache_metrics.django_cache_get_total, cache_metrics.django_cache_misses_total):
        series[counter._name + "_total"] = set(counter._labelnames)
    return series


def test_every_metric_is_named_the_prometheus_way():
    assert len({info.name for info in metrics.CATALOGUE}) == len(metrics.CATALOGUE)
    for info in metrics.CATALOGUE:
        assert re.fullmatch(r"jobguard_[a-z][a-z0-9_]*[a-z0-9]", info.name), info.name
        assert info.documentation.endswith("."), info.name
        if info.type == "counter":
            assert info.name.endswith("_total"), info.name
        elif info.type == "histogram":
            assert info.name.endswith("_seconds"), info.name
        else:
            assert info.type == "gauge" and not info.name.endswith("_total"), info.name


def test_labels_are_bounded():
    for info in metrics.CATALOGUE:
        assert set(info.labels) <= metrics.ALLOWED_LABELS, info
        assert not {"id", "job_id", "key", "idempotency_key", "lock_key", "worker_id"} & set(info.labels)


def test_catalogue_matches_what_the_registry_and_the_collector_expose():
    registered = set(prometheus_client.REGISTRY._names_to_collectors)
    for info in metrics.CATALOGUE:
        if info.type == "gauge" and info.source != "worker":
            continue
        assert info.name in registered or info.name.removesuffix("_total") in registered, info.name
    # The other gauges are computed from the database at scrape time, by the collector.
    gauges = {info.name for info in metrics.CATALOGUE if info.type == "gauge" and info.source != "worker"}
    assert {family.name for family in metrics.QueueCollector().describe()} == gauges
    assert all(name.startswith(metrics.SCRAPE_GAUGE_PREFIXES) for name in gauges)


def test_metric_functions_other_features_call_keep_their_names():
    for name in (
        "job_enqueued",
        "job_succeeded",
        "job_failed",
        "job_dead_lettered",
        "lock_contended",
        "lock_failed",
        "reappeared",
        "lease_lost",
        "duplicate_prevented",
        "unique_conflict",
    ):
        assert callable(getattr(metrics, name)), name


def test_unique_violations_are_told_from_other_integrity_errors():
    assert store.is_unique_violation(
        IntegrityError("UNIQUE constraint failed: testapp_ledgerentry.effect_key")
    )
    assert not store.is_unique_violation(IntegrityError("NOT NULL constraint failed: jobguard_job.task_name"))
    assert not store.is_unique_violation(ValueError("UNIQUE constraint failed"))
    # MariaDB/MySQL (mysqlclient): the server's error number comes first.
    assert store.is_unique_violation(IntegrityError(1062, "Duplicate entry '7' for key 'effect_key'"))
    assert not store.is_unique_violation(IntegrityError(1048, "Column 'task_name' cannot be null"))

    class UniqueViolation(Exception):
        sqlstate = "23505"

    error = IntegrityError("duplicate key value violates unique constraint")
    error.__cause__ = UniqueViolation()
    assert store.is_unique_violation(error)


def test_reference_page_lists_every_metric_exactly():
    page = (DOCS / "reference" / "metrics.md").read_text()
    table = metrics.reference_table()
    assert table in page, "docs/reference/metrics.md is out of date; replace its table with:\n\n" + table


# -- the dashboard and the alert rules ---------------------------------------------------


def expression_problems(expr: str, series: dict[str, set[str]]) -> list[str]:
    """Names that are not real metrics, and labels none of the expression's metrics carry."""
    problems = []
    names = set(re.findall(r"\b(?:jobguard|django_cache)_[a-z0-9_]+", expr))
    if not names:
        problems.append(f"names no jobguard metric: {expr}")
    unknown = names - set(series)
    problems += [f"{name} is not a metric (in {expr})" for name in sorted(unknown)]
    labels = set().union(*(series.get(name, set()) for name in names)) | BUILTIN_LABELS
    used: set[str] = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        used |= {label.strip() for label in group.split(",") if label.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        used |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    for call in re.findall(r"label_values\([^,]+,\s*([a-zA-Z_]+)\)", expr):
        used.add(call)
    problems += [
        f"label {label!r} is on none of {sorted(names)} (in {expr})" for label in sorted(used - labels)
    ]
    return problems


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((DOCS / "monitoring" / "grafana-dashboard.json").read_text())
    expressions = []

    def walk(panels: list[dict]) -> None:
        for panel in panels:
            expressions.extend(target["expr"] for target in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            expressions.append(query["query"])
    return expressions


def test_dashboard_expressions_name_real_metrics_and_labels():
    series = exposed_series()
    expressions = dashboard_expressions()
    assert len(expressions) >= 20
    problems = [problem for expr in expressions for problem in expression_problems(expr, series)]
    assert not problems, "\n".join(problems)
    used = {name for expr in expressions for name in re.findall(r"\bjobguard_[a-z0-9_]+", expr)}
    # Every metric has a panel (histograms through their buckets, counters by their _total).
    for info in metrics.CATALOGUE:
        assert any(name.startswith(info.name.removesuffix("_total")) for name in used), info.name


def test_alert_rules_name_real_metrics_and_cover_the_failure_modes():
    series = exposed_series()
    rules = alert_rules()
    problems = [problem for rule in rules for problem in expression_problems(rule["expr"], series)]
    assert not problems, "\n".join(problems)
    assert {rule["alert"] for rule in rules} >= {
        "JobguardBacklogGrowing",
        "JobguardOldestJobTooOld",
        "JobguardDeadLetterQueueGrowing",
        "JobguardRetryRateSpike",
        "JobguardLockContention",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("rate(jobguard_jobs_sucseeded_total[5m])", "jobguard_jobs_sucseeded_total is not a metric"),
        ("sum by (task) (jobguard_queue_depth)", "label 'task' is on none of ['jobguard_queue_depth']"),
        ('jobguard_queue_depth{job_id="7"}', "label 'job_id' is on none"),
        ("up == 0", "names no jobguard metric"),
    ],
)
def test_the_expression_check_catches_mistakes(expr, problem):
    problems = expression_problems(expr, exposed_series())
    assert any(problem in p for p in problems), problems


def test_a_scrape_without_database_access_still_serves_the_rest(caplog):
    # No django_db mark: pytest-django forbids queries, as a broken database would.
    page = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "jobguard_queue_stats_up 0.0" in page
    assert "jobguard_queue_depth{" not in page
    assert "python_info" in page
    assert any(
        record.getMessage().startswith("queue_stats_failed alias=default") for record in caplog.records
    )


def test_every_alert_rule_links_a_runbook_that_exists():
    rules = alert_rules()
    runbooks = DOCS / "runbooks"
    linked = set()
    for rule in rules:
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith("docs/runbooks/") and url.endswith(".md"), (rule["alert"], url)
        page = runbooks / url.removeprefix("docs/runbooks/")
        assert page.is_file(), f"{rule['alert']}: {url} does not exist"
        # The runbook names the alert that sends people to it.
        assert rule["alert"] in page.read_text(), f"{page.name} does not mention {rule['alert']}"
        linked.add(page.name)
    assert {"growing-dead-letter-queue.md", "retry-storm.md", "replay.md"} <= linked


def test_undeclared_queue_labels_past_the_cap_count_as_other():
    from django.conf import settings
    from django.test import override_settings

    with override_settings(JOBGUARD={**settings.JOBGUARD, "METRICS_MAX_UNDECLARED_QUEUES": 3}):
        labels = [metrics.queue_label(f"tenant-{n}") for n in range(6)]
        assert labels == ["tenant-0", "tenant-1", "tenant-2", "other", "other", "other"]
        assert metrics.queue_label("tenant-1") == "tenant-1"  # a name once given keeps it
        assert metrics.queue_label("default") == "default"  # declared queues always keep theirs
        assert metrics.queue_label("slow") == "slow"
