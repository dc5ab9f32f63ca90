"""publish(): in the caller's transaction, numbered per key in commit order, bad input refused."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import override_settings

import django_jobguard
from django_jobguard.checks.outbox import check_outbox_destinations
from django_jobguard.conf import parse
from django_jobguard.exceptions import InvalidArgumentsError, InvalidPublishError, UnknownDestinationError
from django_jobguard.models import OutboxCursor, OutboxKey, OutboxMessage
from django_jobguard.outbox import publish
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _nothing_written() -> bool:
    return not OutboxMessage.objects.exists() and not OutboxKey.objects.exists()


def test_messages_are_numbered_per_key_and_keep_their_payload(outbox: Path) -> None:
    first = publish("events", {"order": 1}, key="order:1", headers={"tenant": "acme"})
    second = publish("events", {"order": 1, "n": 2}, key="order:1")
    other = publish("events", [1, 2], key="order:2")
    feed = publish("feed", "text", key="order:1")

    assert [first.seq, second.seq, other.seq, feed.seq] == [1, 2, 1, 1]
    stored = OutboxMessage.objects.get(pk=first.pk)
    assert stored.payload == {"order": 1}
    assert stored.headers == {"tenant": "acme"}
    assert stored.state == "pending"
    assert stored.message_id == first.message_id
    assert stored.published_at is not None
    assert OutboxKey.objects.get(destination="events", key="order:1").last_seq == 2
    # The relay's row of each key is created by its first publish.
    assert OutboxCursor.objects.filter(destination="events").count() == 2


def test_a_message_without_a_key_has_one_of_its_own(outbox: Path) -> None:
    a = publish("events", {})
    b = publish("events", {})
    assert a.key == str(a.message_id)
    assert b.key != a.key
    assert (a.seq, b.seq) == (1, 1)


def test_keys_are_compared_exactly_on_every_database(outbox: Path) -> None:
    # MariaDB/MySQL compare them with a NO PAD binary collation (migration 0030), as PostgreSQL does.
    seqs = [publish("events", {}, key=key).seq for key in ("order:1", "ORDER:1", "order:1 ", "order:1")]
    assert seqs == [1, 1, 1, 2]


def test_publish_is_exported_from_the_package() -> None:
    assert django_jobguard.publish is publish
    assert "publish" in django_jobguard.__all__


def test_a_rolled_back_transaction_takes_its_messages_and_numbers_with_it(outbox: Path) -> None:
    publish("events", {"n": 1}, key="k")
    with pytest.raises(RuntimeError), transaction.atomic():
        publish("events", {"n": 2}, key="k")
        publish("events", {"n": 3}, key="new")
        raise RuntimeError("roll back")
    after = publish("events", {"n": 4}, key="k")

    assert list(OutboxMessage.objects.order_by("id").values_list("key", "seq")) == [("k", 1), ("k", 2)]
    assert after.seq == 2  # no gap: the rolled-back number was taken back
    assert not OutboxKey.objects.filter(key="new").exists()
    assert not OutboxCursor.objects.filter(key="new").exists()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("nowhere", {}), {}, UnknownDestinationError, "destination 'nowhere' is not declared"),
        (("events", {"when": object()}), {}, InvalidPublishError, "payload"),
        (("events", {"x": float("nan")}), {}, InvalidPublishError, "payload"),
        (("events", {}), {"key": "k" * 201}, InvalidPublishError, "at most 200"),
        (("events", {}), {"key": ""}, InvalidPublishError, "non-empty string"),
        (("events", {}), {"key": "a\nb"}, InvalidPublishError, "control character"),
        (("events", {}), {"headers": {f"h{i}": "v" for i in range(33)}}, InvalidPublishError, "at most 32"),
        (("events", {}), {"headers": {"bad name": "v"}}, InvalidPublishError, "not an HTTP token"),
        (("events", {}), {"headers": {"h": "caf\u00e9"}}, InvalidPublishError, "printable ASCII"),
        (("events", {}), {"headers": {"h": "v" * 1025}}, InvalidPublishError, "at most 1024"),
        (("events", {}), {"headers": {"h": 1}}, InvalidPublishError, "must be a string"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    outbox: Path, args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        publish(*args, **kwargs)
    assert isinstance(caught.value, InvalidArgumentsError)  # one class to catch, as for enqueue
    assert _nothing_written()


def test_a_payload_over_the_size_limit_is_refused(outbox: Path, settings: Any) -> None:
    with override_settings(JOBGUARD={**settings.JOBGUARD, "MAX_PAYLOAD_BYTES": 100}):
        with pytest.raises(InvalidPublishError, match="more than the limit of 100 bytes"):
            publish("events", {"blob": "x" * 200}, key="k")
        publish("events", {"blob": "x" * 10}, key="k")
    assert OutboxMessage.objects.count() == 1


def test_destination_settings_are_checked_with_the_full_key() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"\['OUTBOX'\]\['DESTINATIONS'\]\['a'\]\['ON_FAILURE'\]"):
        parse({"OUTBOX": {"DESTINATIONS": {"a": {"BACKEND": "redis", "ON_FAILURE": "drop"}}}})
    with pytest.raises(ImproperlyConfigured, match=r"\['DESTINATIONS'\]\['a'\]\['BACKEND'\]"):
        parse({"OUTBOX": {"DESTINATIONS": {"a": {"URL": "redis://x"}}}})
    with pytest.raises(ImproperlyConfigured, match=r"\['a'\]\['RETRY'\]\['max'\]"):
        parse({"OUTBOX": {"DESTINATIONS": {"a": {"BACKEND": "redis", "RETRY": {"base": 10, "max": 1}}}}})
    with pytest.raises(ImproperlyConfigured, match=r"\['OUTBOX'\]\['RELAY_LEASE'\]"):
        parse({"OUTBOX": {"RELAY_LEASE": 0}})
    parsed = parse(
        {
            "RETRY": {"base": 2, "max": 9, "jitter": 0},
            "OUTBOX": {"DESTINATIONS": {"a": {"BACKEND": "redis", "URL": "redis://x", "RETRY": {"base": 1}}}},
        }
    ).outbox.destinations["a"]
    assert (parsed.on_failure, parsed.max_attempts, parsed.retry.base, parsed.retry.max) == ("hold", 20, 1, 9)
    assert parsed.options == {"URL": "redis://x"}  # the relay's own keys are not the backend's


def test_the_system_check_builds_every_destination(settings: Any, tmp_path: Path) -> None:
    destinations = {
        "good": {"BACKEND": "redis", "URL": "redis://127.0.0.1:1/0", "STREAM": "s:{key}", "MAXLEN": 10},
        "no-url": {"BACKEND": "redis"},
        "typo": {"BACKEND": "redis", "URL": "redis://x", "MAXLENGTH": 5},
        "unknown": {"BACKEND": "kafka"},
        "missing": {"BACKEND": "tests.outbox.nowhere.Destination"},
        "file": {"BACKEND": "tests.outbox.destinations.FileDestination", "PATH": str(tmp_path / "f")},
    }
    with override_settings(JOBGUARD={**settings.JOBGUARD, "OUTBOX": {"DESTINATIONS": destinations}}):
        errors = check_outbox_destinations()
    by_name = {error.obj: error for error in errors}
    assert all(isinstance(error, checks.Error) and error.id == "jobguard.E060" for error in errors)
    assert sorted(by_name) == sorted(
        f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}]" for name in ("no-url", "typo", "unknown", "missing")
    )
    assert "['no-url']['URL'] is required" in by_name["JOBGUARD['OUTBOX']['DESTINATIONS']['no-url']"].msg
    assert "MAXLENGTH" in by_name["JOBGUARD['OUTBOX']['DESTINATIONS']['typo']"].msg
    assert "'kafka'" in by_name["JOBGUARD['OUTBOX']['DESTINATIONS']['unknown']"].msg


# -- commit order across connections --------------------------------------------------------


def _backend_waiting_for_a_lock(query: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            [f"%{query}%"],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.postgres
def test_a_second_publisher_of_a_key_waits_for_the_first_to_commit_and_follows_it(outbox: Path) -> None:
    """seq order is commit order: B's publish of the same key blocks on A's row until A commits."""
    a_published = threading.Event()
    a_may_commit = threading.Event()
    seqs: dict[str, int] = {}
    committed: list[str] = []

    def publisher(name: str, key: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                seqs[name] = publish("events", {"by": name}, key=key).seq
                if hold:
                    a_published.set()
                    assert a_may_commit.wait(60)
            committed.append(name)
        finally:
            connection.close()

    a = threading.Thread(target=publisher, args=("a", "shared", True))
    a.start()
    assert a_published.wait(60)
    b = threading.Thread(target=publisher, args=("b", "shared", False))
    b.start()
    wait_for(
        lambda: _backend_waiting_for_a_lock("jobguard_outboxkey"), 60, message="B to wait on A's key row"
    )
    # Another key is not held up by A's open transaction.
    c = threading.Thread(target=publisher, args=("c", "other", False))
    c.start()
    c.join(60)
    assert committed == ["c"]
    assert "b" not in seqs
    a_may_commit.set()
    a.join(60)
    b.join(60)
    assert committed == ["c", "a", "b"]
    assert (seqs["a"], seqs["b"], seqs["c"]) == (1, 2, 1)
