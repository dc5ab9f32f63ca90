"""Retention of settled outbox messages: delivered and skipped ones go after RETENTION's
OUTBOX_DELIVERED / OUTBOX_SKIPPED; pending, dead and held ones, and any the relay has not
passed, stay; the worker's pruning pass and jobguard_prune apply the same rules."""

from __future__ import annotations

import datetime
import io
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from django_jobguard.conf import get_settings
from django_jobguard.maintenance import JobPruner, retention
from django_jobguard.models import OutboxCursor, OutboxKey, OutboxMessage
from django_jobguard.outbox import publish, skip
from django_jobguard.outbox.publisher import outbox_alias
from django_jobguard.outbox.relay import Relay

pytestmark = pytest.mark.django_db(transaction=True)

DAY = datetime.timedelta(days=1)
HOUR = datetime.timedelta(hours=1)


def deliver() -> int:
    return Relay(outbox_alias(), "test-relay").drain()


def age(messages: list[OutboxMessage], ago: datetime.timedelta) -> None:
    """Make ``messages`` published and settled ``ago`` (a timedelta) before now."""
    when = timezone.now() - ago
    rows = OutboxMessage.objects.filter(pk__in=[m.pk for m in messages])
    rows.update(published_at=when - datetime.timedelta(seconds=1))
    rows.filter(delivered_at__isnull=False).update(delivered_at=when)
    rows.filter(resolved_at__isnull=False).update(resolved_at=when)


def stored(*messages: OutboxMessage) -> set[int]:
    return set(OutboxMessage.objects.filter(pk__in=[m.pk for m in messages]).values_list("pk", flat=True))


def fail_flag(outbox: Path) -> str:
    flag = outbox / "refuse"
    flag.touch()
    return str(flag)


def test_only_settled_messages_past_their_retention_go(outbox: Path) -> None:
    # Published in the order of their ages, oldest first, as real messages are numbered.
    flag = fail_flag(outbox)
    skipped = publish("events", {"fail_while": flag}, key="order:4")
    deliver()
    skipped = skip(skipped, by="ops", reason="obsolete")
    old = [publish("events", {"n": n}, key="order:1") for n in range(3)]
    held = publish("events", {"fail_while": flag}, key="order:2")  # dead: holds its key
    behind = publish("events", {"n": 5}, key="order:2")  # pending behind it
    passed_over = publish("feed", {"fail_while": flag}, key="order:3")  # "skip": dead, passed over
    recent = publish("events", {"n": 3}, key="order:1")
    assert deliver() == 4
    age([skipped], 8 * DAY)
    age([*old, held, behind, passed_over], 2 * DAY)
    age([recent], DAY - HOUR)
    assert OutboxMessage.objects.get(pk=held.pk).state == "dead"
    assert OutboxMessage.objects.get(pk=passed_over.pk).state == "dead"

    result = retention.prune_outbox_messages()

    assert result.deleted == {"delivered": 3, "skipped": 1}
    assert stored(*old, skipped) == set()
    assert stored(recent, held, behind, passed_over) == {recent.pk, held.pk, behind.pk, passed_over.pk}
    # The key's sequence goes on from where it was: its rows stay.
    assert OutboxKey.objects.get(destination="events", key="order:1").last_seq == 4
    assert publish("events", {}, key="order:1").seq == 5
    assert retention.prune_outbox_messages().total == 0


def test_a_settled_message_the_relay_has_not_passed_stays_whatever_its_age(outbox: Path) -> None:
    first, second, third = (publish("events", {"n": n}, key="k") for n in range(3))
    deliver()
    # As a message skipped by hand while its key's relay is behind it (a backlog, a restart):
    # the relay steps over it by its place, so it must still be there to be stepped over.
    OutboxCursor.objects.filter(destination="events", key="k").update(delivered_seq=1)
    OutboxMessage.objects.filter(pk=second.pk).update(state="skipped", resolved_at=timezone.now())
    age([first, second, third], 30 * DAY)

    result = retention.prune_outbox_messages()

    assert result.total == 1
    assert stored(first, second, third) == {second.pk, third.pk}


def test_a_message_published_without_a_key_takes_its_key_rows_with_it(outbox: Path) -> None:
    keyless = [publish("events", {"n": n}) for n in range(3)]
    keyed = publish("events", {}, key="order:9")
    assert deliver() == 4
    pending = publish("events", {})  # published after the relay ran: pending, stays
    age([*keyless, keyed, pending], 2 * DAY)
    own = [m.key for m in keyless]

    result = retention.prune_outbox_messages()

    assert result.deleted["delivered"] == 4
    assert result.keys == 3
    assert not OutboxKey.objects.filter(key__in=own).exists()
    assert not OutboxCursor.objects.filter(key__in=own).exists()
    assert OutboxKey.objects.filter(key__in=["order:9", pending.key]).count() == 2
    assert OutboxCursor.objects.filter(key__in=["order:9", pending.key]).count() == 2


def test_retention_settings_and_older_than_choose_what_goes(outbox: Path, settings: Any) -> None:
    messages = [publish("events", {"n": n}, key="k") for n in range(2)]
    deliver()
    age(messages[:1], 3 * DAY)
    age(messages[1:], 3 * HOUR)
    kept = {"OUTBOX_DELIVERED": None, "OUTBOX_SKIPPED": None}
    with override_settings(JOBGUARD={**settings.JOBGUARD, "RETENTION": kept}):
        assert retention.outbox_scopes(get_settings()) == []
        assert retention.prune_outbox_messages().total == 0
    with override_settings(JOBGUARD={**settings.JOBGUARD, "RETENTION": {"OUTBOX_DELIVERED": 4 * 3600}}):
        assert retention.prune_outbox_messages().total == 1
    older = retention.outbox_scopes(get_settings(), datetime.timedelta(hours=2))
    assert retention.prune_outbox_messages(scopes=older).total == 1
    assert stored(*messages) == set()


def test_a_pass_deletes_a_batch_per_transaction_and_goes_on_where_its_deadline_stopped_it(
    outbox: Path,
) -> None:
    messages = [publish("events", {"n": n}, key=f"k{n % 2}") for n in range(7)]
    deliver()
    age(messages, 2 * DAY)

    sweeps: dict[retention.OutboxScope, retention.OutboxSweep] = {}
    stopped = retention.prune_outbox_messages(batch_size=2, deadline=time.monotonic(), sweeps=sweeps)
    assert (stopped.total, stopped.more) == (0, True)
    dry = retention.prune_outbox_messages(dry_run=True)
    assert dry.deleted == {"delivered": 7, "skipped": 0}
    assert len(stored(*messages)) == 7

    result = retention.prune_outbox_messages(batch_size=2, sweeps=sweeps)
    assert (result.total, result.batches, result.more) == (7, 4, False)
    assert sweeps == {}  # each sweep reached its end: the next pass starts from the oldest


def test_the_worker_s_pruning_pass_deletes_old_messages_and_logs_it(
    outbox: Path, caplog: pytest.LogCaptureFixture
) -> None:
    messages = [publish("events", {"n": n}, key="k") for n in range(3)]
    deliver()
    age(messages, 2 * DAY)
    pruner = JobPruner("default", "w-prune")
    with caplog.at_level(logging.INFO, logger="django_jobguard.worker"):
        pruner.run_once()
    assert stored(*messages) == set()
    assert pruner.last_outbox is not None and pruner.last_outbox.deleted["delivered"] == 3
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("outbox_messages_pruned")]
    assert line.startswith("outbox_messages_pruned worker_id=w-prune delivered=3 skipped=0 keys=0 batches=1")


def test_jobguard_prune_deletes_them_by_hand(outbox: Path) -> None:
    old = [publish("events", {"n": n}, key="k") for n in range(2)]
    newer = publish("events", {"n": 2}, key="k")
    deliver()
    age(old, 2 * DAY)
    age([newer], 5 * HOUR)

    out = io.StringIO()
    call_command("jobguard_prune", "--dry-run", stdout=out)
    assert "Would delete 2 outbox message(s) past their retention (2 delivered, 0 skipped)." in out.getvalue()
    call_command("jobguard_prune", "--no-outbox", stdout=io.StringIO())
    assert len(stored(*old, newer)) == 3

    out = io.StringIO()
    call_command("jobguard_prune", stdout=out)
    assert "Deleted 2 outbox message(s) past their retention (2 delivered, 0 skipped)." in out.getvalue()
    out = io.StringIO()
    call_command("jobguard_prune", "--outbox-older-than", "4h", stdout=out)
    assert "Deleted 1 outbox message(s) settled more than 4:00:00 ago" in out.getvalue()
    assert stored(*old, newer) == set()


def test_a_long_held_key_does_not_make_the_sweep_read_recent_messages(outbox: Path) -> None:
    """The sweep stops at the first message published after the cutoff: recent ones are not read."""
    old = [publish("events", {"n": n}, key="k") for n in range(3)]
    recent = [publish("events", {"n": n}, key="k") for n in range(3, 6)]
    deliver()
    age(old, 2 * DAY)
    scope = retention.outbox_scopes(get_settings())[0]
    bound = retention._sweep_bound(outbox_alias(), scope, timezone.now())
    assert bound == recent[0].pk
    # Delivered "now" but published before the cutoff (a key held for days): it waits for the
    # next sweep's bound, never goes early.
    OutboxMessage.objects.filter(pk=old[2].pk).update(delivered_at=F("published_at") + 2 * DAY)
    assert retention.prune_outbox_messages().deleted["delivered"] == 2
    assert stored(*old) == {old[2].pk}
