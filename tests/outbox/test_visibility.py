"""What operators see of the outbox: the statistics, the metrics, the health page, jobguard_status.

Real rows: messages published with publish() and relayed by Relay.drain() to the test's file
destinations ("events" holds a key behind a dead message, "feed" skips it).
"""

from __future__ import annotations

import datetime
import io
import json
import re
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from django_jobguard import events
from django_jobguard.conf import get_settings
from django_jobguard.models import OutboxMessage
from django_jobguard.monitoring import health, metrics
from django_jobguard.outbox import publish, skip
from django_jobguard.outbox import stats as outbox_stats
from django_jobguard.outbox.events import OutboxDead, OutboxDelivered, OutboxFailed, OutboxResolved
from django_jobguard.outbox.relay import Relay
from tests.support.factories import force_login

pytestmark = pytest.mark.django_db(transaction=True)


def drain() -> int:
    return Relay(get_settings().database_alias, "test-relay").drain()


def age(message: OutboxMessage, seconds: float) -> None:
    """Make ``message`` look published ``seconds`` ago (database clock)."""
    OutboxMessage.objects.filter(pk=message.pk).update(
        published_at=Now() - datetime.timedelta(seconds=seconds)
    )


def held_scenario(outbox: Path) -> dict[str, OutboxMessage]:
    """events/k: delivered, dead (holds the key, an hour old), pending behind it; events/fresh:
    pending, not relayed yet; feed/k: one dead message passed over, then one delivered."""
    flag = outbox / "refuse"
    flag.touch()
    publish("events", {"n": 1}, key="k")
    blocked = publish("events", {"n": 2, "fail_while": str(flag)}, key="k")
    behind = publish("events", {"n": 3}, key="k")
    publish("events", {"n": 1}, key="other")
    passed = publish("feed", {"n": 1, "transient_while": str(flag)}, key="k")
    publish("feed", {"n": 2}, key="k")
    drain()
    fresh = publish("events", {"n": 1}, key="fresh")
    age(blocked, 3600)
    return {"blocked": blocked, "behind": behind, "passed": passed, "fresh": fresh}


def by_destination() -> dict[str, outbox_stats.DestinationStats]:
    return {row.destination: row for row in outbox_stats.destination_stats()}


# -- the statistics ---------------------------------------------------------------------------


def test_destination_stats_count_pending_held_and_dead_in_a_fixed_number_of_queries(outbox: Path) -> None:
    messages = held_scenario(outbox)

    with CaptureQueriesContext(connection) as ctx:
        rows = by_destination()
    assert len(ctx.captured_queries) == outbox_stats.QUERIES

    events_row, feed = rows["events"], rows["feed"]
    assert (events_row.pending, events_row.held_keys, events_row.dead) == (2, 1, 1)
    assert events_row.on_failure == "hold" and events_row.declared
    # The oldest undelivered is the holding message (an hour old), not the first pending one.
    assert 3590 <= events_row.oldest_age_seconds < 3700
    assert (feed.pending, feed.held_keys, feed.dead, feed.on_failure) == (0, 0, 1, "skip")
    assert feed.oldest_age_seconds == 0.0

    with CaptureQueriesContext(connection) as ctx:
        held = outbox_stats.held_keys()
    assert len(ctx.captured_queries) == outbox_stats.HELD_QUERIES
    assert len(held) == 1
    (key,) = held
    assert (key.destination, key.key, key.seq, key.message_pk) == ("events", "k", 2, messages["blocked"].pk)
    assert key.message_id == str(messages["blocked"].message_id)
    assert key.waiting == 1 and key.attempts == 1
    assert "flag file exists" in key.last_error
    assert 3590 <= key.age_seconds < 3700
    assert outbox_stats.held_keys(destination="feed") == []


def test_a_skipped_message_releases_its_key_from_the_statistics(outbox: Path) -> None:
    messages = held_scenario(outbox)

    skip(messages["blocked"], by="ops", reason="the receiver dropped this event type")

    events_row = by_destination()["events"]
    assert (events_row.held_keys, events_row.dead) == (0, 0)
    assert events_row.oldest_age_seconds < 600  # the hour-old hold is gone; the pending ones are new
    assert outbox_stats.held_keys() == []
    assert drain() == 2  # the message behind it, and the fresh one
    assert by_destination()["events"].pending == 0


def test_messages_of_a_destination_no_longer_declared_are_shown(outbox: Path) -> None:
    held_scenario(outbox)
    conf = django_settings.JOBGUARD
    destinations = {k: v for k, v in conf["OUTBOX"]["DESTINATIONS"].items() if k != "events"}
    with override_settings(JOBGUARD={**conf, "OUTBOX": {**conf["OUTBOX"], "DESTINATIONS": destinations}}):
        rows = by_destination()
    assert not rows["events"].declared and rows["events"].pending == 2
    causes = health.outbox_causes(list(rows.values()))
    assert causes["events"][0].kind == "outbox_undeclared"


# -- the metrics ------------------------------------------------------------------------------


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_the_scrape_serves_the_outbox_gauges_per_destination(outbox: Path, client) -> None:
    held_scenario(outbox)

    samples = scrape(client)

    events_label, feed_label = (("destination", "events"),), (("destination", "feed"),)
    assert samples[("jobguard_outbox_pending", events_label)] == 2
    assert samples[("jobguard_outbox_held_keys", events_label)] == 1
    assert samples[("jobguard_outbox_dead_messages", events_label)] == 1
    assert 3590 <= samples[("jobguard_outbox_oldest_age_seconds", events_label)] < 3700
    assert samples[("jobguard_outbox_pending", feed_label)] == 0
    assert samples[("jobguard_outbox_dead_messages", feed_label)] == 1
    assert samples[("jobguard_queue_stats_up", ())] == 1
    # No series carries a key or a message id: destinations, and bounded words.
    used = {label for name, labels in samples if name.startswith("jobguard_outbox") for label, _ in labels}
    assert used <= {"destination", "category", "status", "action", "reason", "le"}


def test_no_outbox_query_and_no_series_without_a_declared_destination(client) -> None:
    assert not get_settings().outbox.destinations
    samples = scrape(client)
    assert not [name for name, _ in samples if name.startswith("jobguard_outbox_pending")]


def counter(name: str, **labels: str) -> float:
    value = metrics.prometheus_client.REGISTRY.get_sample_value(name, labels)
    return value or 0.0


def test_the_outbox_events_are_counted_per_destination() -> None:
    delivered = counter("jobguard_outbox_delivered_total", destination="metrics-test")
    lag_count = counter("jobguard_outbox_delivery_lag_seconds_count", destination="metrics-test")
    failed = counter("jobguard_outbox_failed_total", destination="metrics-test", category="transient")
    retried = counter("jobguard_outbox_retried_total", destination="metrics-test")
    dead = counter("jobguard_outbox_dead_total", destination="metrics-test", status="held")
    resolved = counter("jobguard_outbox_resolved_total", destination="metrics-test", action="skipped")

    events.emit(OutboxDelivered("metrics-test", lag=0.25))
    events.emit(OutboxFailed("metrics-test", "transient", retried=True))
    events.emit(OutboxFailed("metrics-test", "transient", retried=False))
    events.emit(OutboxDead("metrics-test", held=True))
    events.emit(OutboxResolved("metrics-test", "skipped"))

    assert counter("jobguard_outbox_delivered_total", destination="metrics-test") == delivered + 1
    assert counter("jobguard_outbox_delivery_lag_seconds_count", destination="metrics-test") == lag_count + 1
    assert (
        counter("jobguard_outbox_failed_total", destination="metrics-test", category="transient")
        == failed + 2
    )
    assert counter("jobguard_outbox_retried_total", destination="metrics-test") == retried + 1
    assert counter("jobguard_outbox_dead_total", destination="metrics-test", status="held") == dead + 1
    assert (
        counter("jobguard_outbox_resolved_total", destination="metrics-test", action="skipped")
        == resolved + 1
    )


def test_the_relay_and_the_operations_are_counted_per_destination(outbox: Path) -> None:
    names = [
        ("jobguard_outbox_delivered_total", {"destination": "events"}),
        ("jobguard_outbox_delivered_total", {"destination": "feed"}),
        ("jobguard_outbox_delivery_lag_seconds_count", {"destination": "events"}),
        ("jobguard_outbox_failed_total", {"destination": "events", "category": "permanent"}),
        ("jobguard_outbox_failed_total", {"destination": "feed", "category": "transient"}),
        ("jobguard_outbox_retried_total", {"destination": "feed"}),
        ("jobguard_outbox_dead_total", {"destination": "events", "status": "held"}),
        ("jobguard_outbox_dead_total", {"destination": "feed", "status": "passed"}),
        ("jobguard_outbox_resolved_total", {"destination": "events", "action": "skipped"}),
    ]
    before = [counter(name, **labels) for name, labels in names]

    messages = held_scenario(outbox)  # MAX_ATTEMPTS 3 on "feed": two retries, then dead
    skip(messages["blocked"], by="ops", reason="retired event type")

    after = [counter(name, **labels) for name, labels in names]
    assert [round(a - b) for a, b in zip(after, before, strict=True)] == [2, 1, 2, 1, 3, 2, 1, 1, 1]


# -- the health page ----------------------------------------------------------------------------


def test_health_flags_a_held_key_as_critical_and_a_late_destination_as_a_warning(outbox: Path) -> None:
    messages = held_scenario(outbox)
    age(messages["fresh"], 900)  # older than the 300 s past which a destination is flagged
    # A late destination: "feed" gets a pending message nobody relayed for 15 minutes.
    late = publish("feed", {"n": 3}, key="late")
    age(late, 900)

    report = health.queue_health()

    assert {row.destination for row in report.outbox} == {"events", "feed"}
    held = report.outbox_causes["events"]
    assert held[0].kind == "outbox_held" and held[0].severity == health.CRITICAL
    assert held[0].runbook == "held-outbox-key"
    assert ("holds", "yes") in held[0].params and ("destination", "events") in held[0].params
    assert "1 key held by a dead message" in held[0].text
    feed = {cause.kind: cause for cause in report.outbox_causes["feed"]}
    assert feed["outbox_lag"].severity == health.WARNING
    assert "15 min" in feed["outbox_lag"].text
    assert feed["outbox_dead"].severity == health.NOTE  # the message passed over, not settled


def test_the_health_page_shows_each_destination_with_its_causes(outbox: Path, client) -> None:
    held_scenario(outbox)
    force_login(client, "viewer", "view_job")

    html = client.get("/admin/jobguard/queuestate/").content.decode()

    row = re.search(r'<tr id="outbox-events".*?</tr>', html, re.S).group(0)
    assert 'data-severity="critical"' in row
    assert 'data-kind="outbox_held"' in row
    assert "/admin/jobguard/outboxmessage/?destination=events&amp;holds=yes" in row
    assert re.search(r'data-count="pending">\s*<a [^>]*>2</a>', row)
    assert "runbook: held-outbox-key" in row


def test_the_outbox_adds_three_queries_to_the_health_page_whatever_the_keys(outbox: Path, client) -> None:
    force_login(client, "viewer", "view_job")
    held_scenario(outbox)
    client.get("/admin/jobguard/queuestate/")  # session and permission caches warm alike for both runs
    with CaptureQueriesContext(connection) as few:
        client.get("/admin/jobguard/queuestate/")
    flag = outbox / "refuse-more"
    flag.touch()
    for n in range(20):
        publish("events", {"n": n, "fail_while": str(flag)}, key=f"more-{n}")
        publish("events", {"n": n}, key=f"more-{n}")
    drain()  # 20 more held keys, 20 more messages behind them
    with CaptureQueriesContext(connection) as many:
        html = client.get("/admin/jobguard/queuestate/").content.decode()
    assert "21 keys held by a dead message" in html
    assert len(many.captured_queries) == len(few.captured_queries)
    outbox_reads = [q["sql"] for q in many.captured_queries if "jobguard_outboxmessage" in q["sql"]]
    assert len(outbox_reads) == outbox_stats.QUERIES, "\n".join(outbox_reads)


# -- jobguard_status --------------------------------------------------------------------------


def test_status_prints_the_outbox_section_with_each_held_key(outbox: Path) -> None:
    messages = held_scenario(outbox)
    out = io.StringIO()

    call_command("jobguard_status", stdout=out)

    text = out.getvalue()
    header = next(line for line in text.splitlines() if line.startswith("DESTINATION"))
    assert header.split() == [
        "DESTINATION",
        "ON",
        "FAILURE",
        "PENDING",
        "OLDEST",
        "UNDELIVERED",
        "HELD",
        "KEYS",
        "DEAD",
    ]
    events_line = next(line for line in text.splitlines() if line.startswith("events "))
    assert events_line.split() == ["events", "hold", "2", "1h00m", "1", "1"]
    held_line = next(line for line in text.splitlines() if line.startswith("held: "))
    assert f"held: events key 'k' by message #{messages['blocked'].pk} (seq 2" in held_line
    assert "1 waiting behind it" in held_line and "flag file exists" in held_line
    assert "docs/runbooks/held-outbox-key.md" in text

    out = io.StringIO()
    call_command("jobguard_status", "--json", stdout=out)
    document = json.loads(out.getvalue())
    destinations = {row["destination"]: row for row in document["outbox"]["destinations"]}
    assert destinations["events"]["held_keys"] == 1 and destinations["feed"]["dead"] == 1
    assert [key["key"] for key in document["outbox"]["held_keys"]] == ["k"]


def test_status_has_no_outbox_section_without_a_declared_destination() -> None:
    out = io.StringIO()
    call_command("jobguard_status", stdout=out)
    assert "DESTINATION" not in out.getvalue()
    out = io.StringIO()
    call_command("jobguard_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["outbox"] == {"destinations": [], "held_keys": []}
