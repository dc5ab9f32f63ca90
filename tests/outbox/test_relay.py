"""The relay in this process (Relay.drain): order per key, retries, hold and skip, replay, leases."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from django_jobguard.exceptions import OutboxError
from django_jobguard.models import OutboxCursor, OutboxMessage
from django_jobguard.outbox import publish, replay, skip
from django_jobguard.outbox.relay import Relay
from django_jobguard.store import outbox as outbox_rows
from tests.outbox.destinations import check_order, read

pytestmark = pytest.mark.django_db(transaction=True)


def _relay() -> Relay:
    from django_jobguard.conf import get_settings

    return Relay(get_settings().database_alias, "test-relay")


def _states(key: str, destination: str = "events") -> list[str]:
    rows = OutboxMessage.objects.filter(destination=destination, key=key).order_by("seq")
    return list(rows.values_list("state", flat=True))


def test_messages_are_delivered_in_order_per_key_with_their_ids(outbox: Path) -> None:
    published = [publish("events", {"n": n}, key=f"k{n % 3}", headers={"h": str(n)}) for n in range(30)]

    assert _relay().drain() == 30

    records = read(outbox / "events.jsonl")
    assert check_order(records) == (30, 0)
    by_id = {record["id"]: record for record in records}
    for message in published:
        record = by_id[str(message.message_id)]
        assert (record["key"], record["seq"], record["payload"]) == (
            message.key,
            message.seq,
            message.payload,
        )
        assert record["headers"] == {"h": str(message.payload["n"])}
        assert record["attempt"] == 1
    assert set(OutboxMessage.objects.values_list("state", flat=True)) == {"delivered"}
    assert dict(OutboxCursor.objects.values_list("key", "delivered_seq")) == {"k0": 10, "k1": 10, "k2": 10}
    assert _relay().drain() == 0  # nothing left: nothing sent twice


def test_a_transient_failure_is_retried_with_the_same_id_then_delivered(outbox: Path) -> None:
    first = publish("events", {"fail_attempts": 2}, key="k")
    publish("events", {"n": 2}, key="k")

    _relay().drain()

    records = read(outbox / "events.jsonl")
    assert [(r["seq"], r["attempt"]) for r in records] == [(1, 3), (2, 1)]
    assert records[0]["id"] == str(first.message_id)
    stored = OutboxMessage.objects.get(pk=first.pk)
    assert (stored.state, stored.attempts) == ("delivered", 3)
    assert "attempt 2 fails on purpose" in stored.last_error


def test_a_retry_waits_out_its_backoff_and_holds_its_key_meanwhile(outbox: Path, settings: object) -> None:
    from django.test import override_settings

    from django_jobguard.conf import get_settings

    conf = get_settings()
    events = conf.outbox.destinations["events"]
    slow = {
        "DESTINATIONS": {
            "events": {
                "BACKEND": events.backend,
                **events.options,
                "RETRY": {"base": 3600, "max": 3600, "jitter": 0},
            }
        }
    }
    with override_settings(JOBGUARD={**settings.JOBGUARD, "OUTBOX": slow}):  # type: ignore[attr-defined]
        publish("events", {"fail_attempts": 1}, key="k")
        publish("events", {"n": 2}, key="k")
        publish("events", {"n": 3}, key="free")
        _relay().drain()
        cursor = OutboxCursor.objects.get(key="k")
        assert cursor.retry_at is not None and cursor.lease_token == ""
        assert _states("k") == ["pending", "pending"]
        assert [r["key"] for r in read(outbox / "events.jsonl")] == ["free"]
        message = OutboxMessage.objects.get(key="k", seq=1)
        assert message.attempts == 1 and message.next_attempt_at is not None


def test_a_dead_message_holds_its_key_until_replayed_then_the_key_goes_on_in_order(outbox: Path) -> None:
    flag = outbox / "refuse"
    flag.touch()
    publish("events", {"n": 1}, key="k")
    blocked = publish("events", {"n": 2, "fail_while": str(flag)}, key="k")
    publish("events", {"n": 3}, key="k")
    publish("events", {"n": 1}, key="other")

    _relay().drain()

    assert _states("k") == ["delivered", "dead", "pending"]
    assert _states("other") == ["delivered"]
    cursor = OutboxCursor.objects.get(destination="events", key="k")
    assert (cursor.delivered_seq, cursor.held_seq) == (1, 2)
    dead = OutboxMessage.objects.get(pk=blocked.pk)
    assert dead.attempts == 1  # permanent: no retry
    assert "flag file exists" in dead.last_error
    assert _relay().drain() == 0  # held: nothing behind it goes out

    flag.unlink()
    with pytest.raises(OutboxError, match="give a reason"):
        replay(blocked, by="ops", reason=" ")
    again = replay(blocked, by="ops", reason="endpoint fixed")
    assert again.pk == blocked.pk and again.message_id == blocked.message_id
    assert _relay().drain() == 2

    assert _states("k") == ["delivered", "delivered", "delivered"]
    records = [r for r in read(outbox / "events.jsonl") if r["key"] == "k"]
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert records[1]["id"] == str(blocked.message_id)
    replayed = OutboxMessage.objects.get(pk=blocked.pk)
    assert (replayed.resolution, replayed.resolved_by, replayed.resolution_reason) == (
        "replayed",
        "ops",
        "endpoint fixed",
    )
    with pytest.raises(OutboxError, match="is delivered: only a dead message"):
        replay(blocked, by="ops", reason="again")


def test_skipping_a_held_message_releases_its_key(outbox: Path) -> None:
    flag = outbox / "refuse"
    flag.touch()
    blocked = publish("events", {"fail_while": str(flag)}, key="k")
    publish("events", {"n": 2}, key="k")
    _relay().drain()

    skip(blocked.pk, by="ops", reason="obsolete event")
    assert _relay().drain() == 1

    assert _states("k") == ["skipped", "delivered"]
    assert [r["seq"] for r in read(outbox / "events.jsonl")] == [2]
    cursor = OutboxCursor.objects.get(key="k")
    assert (cursor.delivered_seq, cursor.held_seq) == (2, None)
    skipped = OutboxMessage.objects.get(pk=blocked.pk)
    assert (skipped.resolution, skipped.resolution_reason) == ("skipped", "obsolete event")


def test_a_skip_destination_passes_over_a_dead_message_and_a_replay_goes_to_the_end(outbox: Path) -> None:
    flag = outbox / "refuse"
    flag.touch()
    publish("feed", {"n": 1}, key="k")
    dead = publish("feed", {"n": 2, "transient_while": str(flag)}, key="k")
    publish("feed", {"n": 3}, key="k")

    _relay().drain()

    assert _states("k", "feed") == ["delivered", "dead", "delivered"]
    assert OutboxMessage.objects.get(pk=dead.pk).attempts == 3  # MAX_ATTEMPTS, then set aside
    flag.unlink()
    copy = replay(dead, by="ops", reason="retry it")
    assert (copy.seq, copy.key) == (4, "k") and copy.message_id != dead.message_id
    _relay().drain()
    assert [r["payload"]["n"] for r in read(outbox / "feed.jsonl")] == [1, 3, 2]
    assert str(copy.message_id) in OutboxMessage.objects.get(pk=dead.pk).resolution_reason


def test_an_error_nobody_classified_follows_unclassified_errors(outbox: Path) -> None:
    message = publish("feed", {"raise": "ValueError"}, key="k")
    _relay().drain()
    stored = OutboxMessage.objects.get(pk=message.pk)
    # UNCLASSIFIED_ERRORS is "transient": retried up to the destination's MAX_ATTEMPTS (3).
    assert (stored.state, stored.attempts) == ("dead", 3)
    assert stored.last_error.startswith("ValueError: an error nobody classified")


def test_a_relay_that_lost_its_lease_sends_and_records_nothing(outbox: Path) -> None:
    publish("events", {"n": 1}, key="k")
    relay = _relay()
    token = uuid.uuid4().hex
    (claimed,) = relay.claim(token, 10)
    # Its lease expired and another relay took the key: the row names the other's token.
    other = uuid.uuid4().hex
    OutboxCursor.objects.filter(pk=claimed.cursor_id).update(lease_token=other)
    relay.deliver_key(claimed, token, {})
    assert not read(outbox / "events.jsonl")
    assert _states("k") == ["pending"]
    assert OutboxCursor.objects.get(pk=claimed.cursor_id).lease_token == other


def test_a_leased_key_is_not_claimed_twice(outbox: Path) -> None:
    publish("events", {"n": 1}, key="k")
    publish("events", {"n": 1}, key="j")
    relay = _relay()
    first = relay.claim("one", 10)
    assert sorted(c.key for c in first) == ["j", "k"]
    assert relay.claim("two", 10) == []
    assert outbox_rows.release_lease(relay.alias, first[0].cursor_id, "one")
    assert [c.key for c in relay.claim("two", 10)] == [first[0].key]


def test_the_relay_and_the_operators_report_their_events(outbox: Path) -> None:
    from django_jobguard import events
    from django_jobguard.outbox.events import OutboxDead, OutboxDelivered, OutboxFailed, OutboxResolved

    seen: list[object] = []
    events.add_sink(seen.append)
    try:
        flag = outbox / "refuse"
        flag.touch()
        publish("events", {"fail_attempts": 1}, key="a")
        dead = publish("events", {"fail_while": str(flag)}, key="b")
        _relay().drain()
        skip(dead, by="ops", reason="not needed")
    finally:
        events.remove_sink(seen.append)
    ours = [event for event in seen if type(event).__name__.startswith("Outbox")]
    delivered = [event for event in ours if isinstance(event, OutboxDelivered)]
    assert len(delivered) == 1 and delivered[0].destination == "events" and delivered[0].lag >= 0
    assert OutboxFailed("events", "transient", True) in ours
    assert OutboxFailed("events", "permanent", False) in ours
    assert OutboxDead("events", True) in ours
    assert OutboxResolved("events", "skipped") in ours
