"""What operators see of flow control: jobguard_status (table and JSON) and the scrape gauges."""

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection

from django_jobguard import metrics, store
from django_jobguard.registry import registry
from django_jobguard.stats import limit_stats
from tests.testapp import tasks_flow

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor == "mysql",
        reason="flow-control limits are not enforced on MariaDB/MySQL yet (jobguard.E032)",
    ),
]

PER_ACCOUNT = f"{tasks_flow.per_account.name}[account:{{account_id}}]"
THREE = f"task:{tasks_flow.three_at_once.name}"


@pytest.fixture
def busy_limits():
    for task in tasks_flow.ALL:
        registry.register(task)
    for _ in range(3):
        tasks_flow.per_account.enqueue(1, 0)
    tasks_flow.per_account.enqueue(2, 0)
    for _ in range(5):
        tasks_flow.three_at_once.enqueue(0)
    claimed = store.claim("default", None, 20, "w", flow=store.flow_plan())
    assert len(claimed) == 2 + 1 + 3
    yield
    for task in tasks_flow.ALL:
        registry.unregister(task.name)


def test_no_limits_no_rows_and_no_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert limit_stats() == []


def test_limit_stats_show_use_full_keys_and_waiting_jobs(busy_limits):
    rows = {row.limit: row for row in limit_stats()}
    keyed = rows[PER_ACCOUNT]
    assert (keyed.kind, keyed.bound, keyed.running, keyed.full_keys, keyed.waiting) == (
        "concurrency",
        "2 per key",
        3,
        1,
        1,
    )
    three = rows[THREE]
    assert (three.bound, three.running, three.full_keys, three.waiting) == ("3", 3, 1, 2)
    shared = rows["limit:flow-shared"]
    assert (shared.running, shared.waiting) == (0, 0)
    rate = rows[f"rate:task:{tasks_flow.rated.name}"]
    assert (rate.kind, rate.bound) == ("rate", "20/s burst 5")


def test_jobguard_status_lists_the_limits(busy_limits):
    out = io.StringIO()
    call_command("jobguard_status", stdout=out)
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.startswith("LIMIT "))
    assert header.split() == ["LIMIT", "KIND", "BOUND", "RUNNING", "FULL", "KEYS", "WAITING"]
    row = next(line for line in lines if line.startswith(THREE + " "))
    assert row.split()[-3:] == ["3", "1", "2"]
    out = io.StringIO()
    call_command("jobguard_status", "--json", stdout=out)
    limits = {row["limit"]: row for row in json.loads(out.getvalue())["limits"]}
    assert limits[PER_ACCOUNT] == {
        "limit": PER_ACCOUNT,
        "kind": "concurrency",
        "bound": "2 per key",
        "running": 3,
        "full_keys": 1,
        "waiting": 1,
    }


def test_the_scrape_reports_the_limit_gauges(busy_limits):
    pytest.importorskip("prometheus_client")
    samples = {
        (family.name, sample.labels.get("limit")): sample.value
        for family in metrics.QueueCollector().collect()
        for sample in family.samples
        if family.name.startswith("jobguard_queue_limit_")
    }
    assert samples[("jobguard_queue_limit_running", PER_ACCOUNT)] == 3
    assert samples[("jobguard_queue_limit_full_keys", PER_ACCOUNT)] == 1
    assert samples[("jobguard_queue_limit_waiting", THREE)] == 2


def test_the_api_lists_the_limits_to_readers_of_jobs(busy_limits):
    from tests.api.support import BASE, as_user

    assert as_user("nobody")[0].get(BASE + "limits/").status_code == 403
    client, _ = as_user("reader", "view_job")
    rows = {row["limit"]: row for row in client.get(BASE + "limits/").json()}
    assert rows[THREE] == {
        "limit": THREE,
        "kind": "concurrency",
        "bound": "3",
        "running": 3,
        "full_keys": 1,
        "waiting": 2,
    }
    assert rows[PER_ACCOUNT]["full_keys"] == 1
