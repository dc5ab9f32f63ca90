"""The outbox in the admin: the messages, the held keys, replay and skip behind jobguard.operate_outbox."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client

from django_jobguard.conf import get_settings
from django_jobguard.models import OutboxMessage
from django_jobguard.outbox import publish
from django_jobguard.outbox.relay import Relay
from tests.support.factories import force_login

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/jobguard/outboxmessage/"


def drain() -> int:
    return Relay(get_settings().database_alias, "test-relay").drain()


def held(outbox: Path) -> tuple[OutboxMessage, OutboxMessage, OutboxMessage]:
    """events/k: a dead message holding the key and one behind it; events/ok: delivered."""
    flag = outbox / "refuse"
    flag.touch()
    blocked = publish("events", {"n": 1, "fail_while": str(flag)}, key="k")
    behind = publish("events", {"n": 2}, key="k")
    delivered = publish("events", {"n": 1}, key="ok")
    drain()
    flag.unlink()
    return blocked, behind, delivered


def ids_listed(html: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'href="/admin/jobguard/outboxmessage/(\d+)/change/', html)}


def test_the_held_keys_filter_lists_each_blocking_message(outbox: Path, client: Client) -> None:
    blocked, behind, delivered = held(outbox)
    force_login(client, "viewer", "view_outboxmessage")

    everything = client.get(URL)
    assert everything.status_code == 200
    assert ids_listed(everything.content.decode()) == {blocked.pk, behind.pk, delivered.pk}

    page = client.get(URL, {"holds": "yes"}).content.decode()
    assert ids_listed(page) == {blocked.pk}
    assert "holds its key" in page
    # Filtered as the health page links: by destination and state.
    pending = client.get(URL, {"destination": "events", "state__exact": "pending"}).content.decode()
    assert ids_listed(pending) == {behind.pk}
    # The error can echo the payload: withheld without jobguard.view_payload.
    assert "flag file exists" not in page
    blocked_page = client.get(f"{URL}{blocked.pk}/change/").content.decode()
    assert str(blocked.message_id) in blocked_page
    assert "fail_while" not in blocked_page and "flag file exists" not in blocked_page


def test_the_error_and_payload_show_with_view_payload(outbox: Path, client: Client) -> None:
    blocked, _, _ = held(outbox)
    force_login(client, "reader", "view_outboxmessage", "view_payload")

    assert "flag file exists" in client.get(URL, {"holds": "yes"}).content.decode()
    detail = client.get(f"{URL}{blocked.pk}/change/").content.decode()
    assert "flag file exists" in detail and "fail_while" in detail


def test_without_operate_outbox_no_action_is_offered_and_a_posted_one_changes_nothing(
    outbox: Path, client: Client
) -> None:
    blocked, _, _ = held(outbox)
    force_login(client, "viewer", "view_outboxmessage")

    page = client.get(URL).content.decode()
    assert "replay_messages" not in page and "skip_messages" not in page
    response = client.post(
        URL,
        {"action": "replay_messages", "_selected_action": [blocked.pk], "confirm": "yes", "reason": "try"},
        follow=True,
    )
    assert response.status_code == 200
    assert OutboxMessage.objects.get(pk=blocked.pk).state == "dead"


def test_replay_asks_for_a_reason_then_puts_the_held_message_back_in_line(
    outbox: Path, client: Client
) -> None:
    blocked, behind, delivered = held(outbox)
    force_login(client, "operator", "view_outboxmessage", "operate_outbox")

    assert "replay_messages" in client.get(URL).content.decode()
    confirm = client.post(URL, {"action": "replay_messages", "_selected_action": [blocked.pk]})
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert 'name="reason"' in html and f'data-id="{blocked.pk}"' in html
    assert OutboxMessage.objects.get(pk=blocked.pk).state == "dead"  # nothing yet

    # No reason: the page again, nothing changed.
    again = client.post(
        URL, {"action": "replay_messages", "_selected_action": [blocked.pk], "confirm": "yes", "reason": ""}
    )
    assert again.status_code == 200 and "This field is required" in again.content.decode()
    assert OutboxMessage.objects.get(pk=blocked.pk).state == "dead"

    # A delivered message in the selection is refused by the operations, by name; the dead one replays.
    done = client.post(
        URL,
        {
            "action": "replay_messages",
            "_selected_action": [blocked.pk, delivered.pk],
            "confirm": "yes",
            "reason": "receiver fixed",
        },
        follow=True,
    )
    text = done.content.decode()
    assert "Replay: 1 done, 1 not changed." in text
    assert f"#{delivered.pk}: outbox message {delivered.pk} is delivered" in text
    replayed = OutboxMessage.objects.get(pk=blocked.pk)
    assert (replayed.state, replayed.resolution, replayed.resolved_by, replayed.resolution_reason) == (
        "pending",
        "replayed",
        "operator",
        "receiver fixed",
    )
    assert LogEntry.objects.filter(
        object_id=str(blocked.pk), change_message="Replay: receiver fixed"
    ).exists()
    assert drain() == 2
    assert OutboxMessage.objects.get(pk=behind.pk).state == "delivered"


def test_skip_releases_the_key_and_records_who_and_why(outbox: Path, client: Client) -> None:
    blocked, behind, _ = held(outbox)
    force_login(client, "operator", "view_outboxmessage", "operate_outbox")

    response = client.post(
        URL,
        {
            "action": "skip_messages",
            "_selected_action": [blocked.pk],
            "confirm": "yes",
            "reason": "event type retired",
        },
        follow=True,
    )

    assert "Skip: 1 done." in response.content.decode()
    skipped = OutboxMessage.objects.get(pk=blocked.pk)
    assert (skipped.state, skipped.resolved_by, skipped.resolution_reason) == (
        "skipped",
        "operator",
        "event type retired",
    )
    assert client.get(URL, {"holds": "yes"}).status_code == 200
    assert ids_listed(client.get(URL, {"holds": "yes"}).content.decode()) == set()
    assert drain() == 1
    assert OutboxMessage.objects.get(pk=behind.pk).state == "delivered"


def test_a_lookup_the_page_does_not_offer_is_refused(outbox: Path, client: Client) -> None:
    held(outbox)
    force_login(client, "viewer", "view_outboxmessage")
    # payload__n would read payloads a value at a time.
    assert client.get(URL, {"payload__n": "1"}).status_code == 400
