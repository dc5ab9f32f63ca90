"""What operators see of flow control: jobguard_status (table and JSON) and the scrape gauges."""

import io
import json

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse

from django_jobguard import breakers, store
from django_jobguard.conf import get_settings
from django_jobguard.models import Breaker, BreakerEvent
from django_jobguard.monitoring import metrics
from django_jobguard.monitoring.stats import limit_stats
from django_jobguard.registry import registry
from tests.support.factories import force_login, make_superuser
from tests.testapp import tasks_flow

pytestmark = [
    pytest.mark.django_db,
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
    claimed = store.claim("default", None, 20, "w", flow=registry.flow_plan())
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


# -- breakers and retry budgets ------------------------------------------------------------------

DEP = "flow-dep"


@pytest.fixture
def tripped():
    """flow-dep's breaker opened by six failed calls, with two of its jobs waiting."""
    for task in tasks_flow.ALL:
        registry.register(task)
    tasks_flow.call_dependency.enqueue(1)
    tasks_flow.call_dependency.enqueue(2)
    spec = get_settings().limits[DEP].breaker
    for _ in range(6):
        breakers.record("default", DEP, spec, failed=True)
    yield
    for task in tasks_flow.ALL:
        registry.unregister(task.name)


def test_jobguard_status_lists_the_breakers(tripped):
    out = io.StringIO()
    call_command("jobguard_status", stdout=out)
    lines = out.getvalue().splitlines()
    header = next(line for line in lines if line.startswith("BREAKER "))
    assert header.split() == [
        "BREAKER",
        "STATE",
        "CALLS",
        "FAILED",
        "OPENS",
        "IN",
        "RETRIES",
        "BUDGET",
        "LEFT",
        "WAITING",
    ]
    row = lines[lines.index(header) + 1]
    assert row.split()[:4] == [DEP, "open", "6", "6"] and row.split()[-1] == "2"
    out = io.StringIO()
    call_command("jobguard_status", "--json", stdout=out)
    (guard,) = json.loads(out.getvalue())["breakers"]
    assert (guard["limit"], guard["state"], guard["waiting"], guard["budget_remaining"]) == (
        DEP,
        "open",
        2,
        4,
    )


def test_the_scrape_reports_the_breaker_gauges(tripped):
    pytest.importorskip("prometheus_client")
    samples = {
        (family.name, sample.labels.get("limit")): sample.value
        for family in metrics.QueueCollector().collect()
        for sample in family.samples
    }
    assert samples[("jobguard_breaker_state", DEP)] == 2
    assert samples[("jobguard_breaker_waiting", DEP)] == 2
    assert samples[("jobguard_retry_budget_remaining", DEP)] == 4


@pytest.mark.parametrize(
    "guard",
    [{"breaker": True}, {"retry_budget": True}, {"concurrency": 10, "rate": "25/s", "breaker": True}],
    ids=["breaker-only", "budget-only", "how-to-example"],
)
def test_the_scrape_keeps_every_gauge_when_a_limit_has_a_breaker_or_a_budget_alone(tripped, guard):
    # docs/how-to/protect-a-dependency.md's own example: a breaker and no retry budget. The
    # missing budget once failed the whole scrape's statistics: every queue gauge was lost.
    pytest.importorskip("prometheus_client")
    raw = {**settings.JOBGUARD, "LIMITS": {**settings.JOBGUARD["LIMITS"], DEP: guard}}
    with override_settings(JOBGUARD=raw):
        families = {family.name: family for family in metrics.QueueCollector().collect()}
    (up,) = families["jobguard_queue_stats_up"].samples
    assert up.value == 1
    depth = {s.labels["queue"]: s.value for s in families["jobguard_queue_depth"].samples}
    assert depth["flow-dep"] == 2
    state = {s.labels["limit"]: s.value for s in families["jobguard_breaker_state"].samples}
    budget = {s.labels["limit"]: s.value for s in families["jobguard_retry_budget_remaining"].samples}
    # A limit without a budget has no budget series (not a 0 that would read "retries wait"),
    # and one without a breaker reads closed.
    assert (DEP in budget) is ("retry_budget" in guard)
    assert state[DEP] == (0 if "breaker" not in guard else 2)


def test_the_command_opens_and_closes_a_breaker_in_the_audit_trail(tripped):
    out = io.StringIO()
    call_command("jobguard_breaker", "close", DEP, stdout=out)
    assert f"Breaker '{DEP}' closed." in out.getvalue()
    with pytest.raises(CommandError, match="A reason is required"):
        call_command("jobguard_breaker", "open", DEP)
    call_command("jobguard_breaker", "open", DEP, "--reason", "provider incident", stdout=out)
    with pytest.raises(CommandError, match="No breaker is named 'stripe'"):
        call_command("jobguard_breaker", "open", "stripe", "--reason", "x")
    out = io.StringIO()
    call_command("jobguard_breaker", "list", stdout=out)
    assert out.getvalue().startswith(f"{DEP}  open (by hand)")
    moves = list(BreakerEvent.objects.order_by("created_at", "id").values_list("to_state", "actor_name"))
    assert [state for state, _ in moves] == ["open", "closed", "open"]
    assert moves[0][1] == "system" and moves[1][1].startswith("shell")


def test_the_api_lists_breakers_and_operators_open_and_close_them(tripped):
    from tests.api.support import BASE, as_user

    reader, _ = as_user("reader", "view_job")
    (row,) = reader.get(BASE + "breakers/").json()
    assert (row["limit"], row["state"], row["calls"], row["failures"]) == (DEP, "open", 6, 6)
    assert reader.post(BASE + f"breakers/{DEP}/close/", {}, format="json").status_code == 403
    operator, _ = as_user("operator", "view_job", "operate_breaker")
    response = operator.post(BASE + f"breakers/{DEP}/close/", {"reason": "back"}, format="json")
    assert response.status_code == 200 and response.json()["state"] == "closed"
    assert operator.post(BASE + f"breakers/{DEP}/open/", {}, format="json").status_code == 400
    assert operator.post(BASE + "breakers/stripe/open/", {"reason": "x"}, format="json").status_code == 404
    response = operator.post(BASE + f"breakers/{DEP}/open/", {"reason": "incident"}, format="json")
    assert response.json()["state"] == "open" and response.json()["manual"] is True
    assert BreakerEvent.objects.filter(actor_name="operator", reason="incident").exists()


def test_the_console_shows_limits_waiting_keys_and_breakers_and_operates_them(client, busy_limits, tripped):
    url = "/admin/jobguard/breaker/"
    force_login(client, "viewer", "view_job")
    html = client.get(url).content.decode()
    assert f'id="breaker-{DEP}" data-limit="{DEP}" data-state="open"' in html
    assert "concurrency: a key (hidden" in html and f'data-limit="{THREE}"' in html
    assert 'name="close"' not in html  # no form without the permission
    refused = client.post(reverse("admin:jobguard_breaker_close"), {"limit": DEP})
    assert refused.status_code == 403
    force_login(client, "operator", "view_job", "operate_breaker")
    assert 'name="close"' in client.get(url).content.decode()
    response = client.post(
        reverse("admin:jobguard_breaker_close"), {"limit": DEP, "reason": "fixed"}, follow=True
    )
    assert f"Breaker &#x27;{DEP}&#x27; closed." in response.content.decode()
    assert Breaker.objects.get(name=DEP).state == "closed"
    event = BreakerEvent.objects.latest("id")
    assert (event.to_state, event.actor_name, event.reason) == ("closed", "operator", "fixed")
    client.force_login(make_superuser("admin"))
    trail = client.get("/admin/jobguard/breakerevent/").content.decode()
    assert "fixed" in trail and "6 of 6 calls failed" in trail


def test_the_console_hides_limit_key_values_from_users_without_view_payload(client, busy_limits):
    # A keyed limit's key is made of the job's arguments (account:1): payload, as on the job pages.
    url = "/admin/jobguard/breaker/"
    template = f"{tasks_flow.per_account.name}[account:{{account_id}}]"
    force_login(client, "viewer", "view_job")
    html = client.get(url).content.decode()
    assert "account:1" not in html and "account:2" not in html
    assert f"{template} concurrency: a key (hidden: needs the view payload permission)" in html
    assert f'data-key="{THREE}"' in html  # an unkeyed limit is a name, not arguments
    force_login(client, "reader", "view_job", "view_payload")
    html = client.get(url).content.decode()
    assert f'data-key="c:{tasks_flow.per_account.name}|account:1"' in html
