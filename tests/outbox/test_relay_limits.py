"""Limits on outbox destinations (``LIMIT``), in this process: the settings, the checks, and the
relay's concurrency, rate, breaker and retry budget with the tasks' state (Relay.claim, drain)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_jobguard import breakers, events, task
from django_jobguard.checks.outbox import check_outbox_destinations, check_outbox_limits
from django_jobguard.checks.tasks import check_unused_breakers
from django_jobguard.conf import get_settings
from django_jobguard.models import Breaker, BreakerEvent, FlowRate, OutboxMessage
from django_jobguard.monitoring.health import queue_health
from django_jobguard.monitoring.stats import breaker_stats
from django_jobguard.outbox import publish
from django_jobguard.outbox.events import OutboxThrottled
from django_jobguard.outbox.relay import Relay
from django_jobguard.registry import registry
from django_jobguard.store import outbox as outbox_rows
from tests.conftest import wait_for
from tests.outbox.conftest import FILE_BACKEND
from tests.outbox.destinations import check_order, read

pytestmark = pytest.mark.django_db(transaction=True)

ZERO_RETRY = {"base": 0.0, "max": 0.0, "jitter": 0.0}


def _settings(tmp_path: Path, limits: dict[str, Any], **destinations: dict[str, Any]) -> dict[str, Any]:
    """JOBGUARD with ``limits`` and file destinations (each option dict over a file of its name)."""
    declared = {
        name: {"BACKEND": FILE_BACKEND, "PATH": str(tmp_path / f"{name}.jsonl"), "RETRY": ZERO_RETRY, **extra}
        for name, extra in destinations.items()
    }
    return {"LIMITS": limits, "OUTBOX": {"DESTINATIONS": declared}}


@pytest.fixture
def limited(tmp_path: Path, settings: Any) -> Iterator[Any]:
    """Declare limits and destinations for one test: ``limited(limits, name={options}, ...)``."""
    stack: list[Any] = []

    def declare(limits: dict[str, Any], **destinations: dict[str, Any]) -> None:
        override = override_settings(
            JOBGUARD={**settings.JOBGUARD, **_settings(tmp_path, limits, **destinations)}
        )
        override.enable()
        stack.append(override)

    yield declare
    for override in reversed(stack):
        override.disable()


def _relay() -> Relay:
    return Relay(get_settings().database_alias, f"test-{uuid.uuid4().hex[:6]}")


def _attempts(destination: str) -> int:
    return sum(OutboxMessage.objects.filter(destination=destination).values_list("attempts", flat=True))


# -- settings and checks --------------------------------------------------------------------


def test_a_destination_names_a_declared_limit_which_its_backend_never_sees(limited: Any) -> None:
    limited({"hooks": {"concurrency": 2}}, hook={"LIMIT": "hooks"})

    config = get_settings().outbox.destinations["hook"]

    assert config.limit == "hooks"
    assert "LIMIT" not in config.options
    assert check_outbox_destinations() == []  # no longer refused as the backend's unknown option


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "stripe",
            "JOBGUARD['OUTBOX']['DESTINATIONS']['hook']['LIMIT'] names 'stripe', which "
            "JOBGUARD['LIMITS'] does not declare (declared: 'hooks').",
        ),
        (
            3,
            "JOBGUARD['OUTBOX']['DESTINATIONS']['hook']['LIMIT'] must name an entry of "
            "JOBGUARD['LIMITS'] (a string), not 3.",
        ),
        ("", "JOBGUARD['OUTBOX']['DESTINATIONS']['hook']['LIMIT'] must name an entry"),
    ],
)
def test_a_limit_the_settings_do_not_declare_is_refused_naming_the_key(
    tmp_path: Path, settings: Any, value: Any, message: str
) -> None:
    declared = _settings(tmp_path, {"hooks": {"concurrency": 2}}, hook={"LIMIT": value})
    with (
        override_settings(JOBGUARD={**settings.JOBGUARD, **declared}),
        pytest.raises(ImproperlyConfigured) as info,
    ):
        get_settings()
    assert message in str(info.value)


def _handler(n: int) -> None:
    pass


@pytest.fixture
def tasks_naming() -> Iterator[Any]:
    """Register a task naming a limit for one test: ``tasks_naming("hooks")``."""
    names: list[str] = []

    def declare(limit: str) -> str:
        name = f"tests.outbox.limits.{limit}"
        task(name=name, limit=limit)(_handler)
        names.append(name)
        return name

    yield declare
    for name in names:
        registry.unregister(name)


def test_a_concurrency_named_by_tasks_and_destinations_is_an_error(limited: Any, tasks_naming: Any) -> None:
    limited(
        {"shared": {"concurrency": 2}, "guard": {"breaker": True, "rate": "5/s"}, "own": {"concurrency": 1}},
        hook={"LIMIT": "shared"},
        probe={"LIMIT": "guard"},
        mine={"LIMIT": "own"},
    )
    task_name = tasks_naming("shared")
    tasks_naming("guard")  # a rate and a breaker may be shared

    messages = check_outbox_limits()

    assert [(m.id, m.msg) for m in messages] == [
        (
            "jobguard.E064",
            f"JOBGUARD['LIMITS']['shared'] has a concurrency, and both tasks ({task_name}) and outbox "
            "destinations (hook) name it: one concurrency cannot count running jobs and keys in "
            "flight together.",
        )
    ]


def test_a_breaker_only_a_destination_names_is_not_unused(limited: Any) -> None:
    limited({"hooks": {"breaker": True}, "spare": {"breaker": True}}, hook={"LIMIT": "hooks"})

    names = [message.msg.split("]")[1] for message in check_unused_breakers()]

    assert "['hooks'" not in names
    assert "['spare'" in names


# -- the relay ------------------------------------------------------------------------------


def test_a_concurrency_bounds_the_keys_leased_to_its_destinations_across_relays(limited: Any) -> None:
    limited({"hooks": {"concurrency": 2}}, a={"LIMIT": "hooks"}, b={"LIMIT": "hooks"}, free={})
    for n in range(3):
        publish("a", {"n": n}, key=f"a{n}")
        publish("b", {"n": n}, key=f"b{n}")
        publish("free", {"n": n}, key=f"f{n}")
    first, second = _relay(), _relay()
    first_token, second_token = uuid.uuid4().hex, uuid.uuid4().hex

    taken = first.claim(first_token, 10) + second.claim(second_token, 10)

    bounded = [key for key in taken if key.destination in ("a", "b")]
    assert len(bounded) == 2  # a and b share the limit's 2 slots, across both relays
    assert sorted(key.key for key in taken if key.destination == "free") == ["f0", "f1", "f2"]
    assert second.claim(uuid.uuid4().hex, 10) == []
    # A key given back frees its slot, for any relay.
    alias = get_settings().database_alias
    assert outbox_rows.release_lease(alias, bounded[0].cursor_id, first_token) or outbox_rows.release_lease(
        alias, bounded[0].cursor_id, second_token
    )
    again = second.claim(uuid.uuid4().hex, 10)
    assert len(again) == 1 and again[0].destination in ("a", "b")


def test_a_rate_lets_sends_through_at_its_pace_and_a_waiting_send_costs_no_attempt(limited: Any) -> None:
    limited({"slow": {"rate": "1/h"}}, hook={"LIMIT": "slow"}, free={})
    for n in range(3):
        publish("hook", {"n": n}, key="k")
        publish("free", {"n": n}, key="k")
    relay = _relay()
    seen: list[object] = []
    events.add_sink(seen.append)
    try:
        delivered = relay.drain()
    finally:
        events.remove_sink(seen.append)

    assert delivered == 4  # one send of the hour's one, and every message of the free destination
    assert relay.throttled == {"rate": 1}
    assert [event for event in seen if isinstance(event, OutboxThrottled)] == [
        OutboxThrottled("hook", "rate")
    ]
    assert [m.attempts for m in OutboxMessage.objects.filter(destination="hook").order_by("seq")] == [1, 0, 0]
    assert FlowRate.objects.filter(key="rate:limit:slow").exists()  # the tasks' rate table and key
    assert relay.drain() == 0  # the key waits out the rate; no claim takes it meanwhile
    assert relay.throttled == {"rate": 1}


def test_a_breaker_opens_after_failures_stops_the_sends_then_a_probe_closes_it(
    limited: Any, tmp_path: Path
) -> None:
    breaker = {"failure_rate": 1.0, "min_calls": 3, "window": 60, "open_for": 0.5, "probes": 1}
    limited({"hooks": {"breaker": breaker}}, hook={"LIMIT": "hooks", "MAX_ATTEMPTS": 1000}, free={})
    down = tmp_path / "down"
    down.touch()
    for n in range(6):
        publish("hook", {"n": n, "transient_while": str(down)}, key=f"k{n % 3}")
        publish("free", {"n": n}, key=f"k{n % 3}")
    relay = _relay()

    relay.drain()

    # Three failed sends (zero backoff: without the breaker, a storm) open it; nothing more goes out.
    assert _attempts("hook") == 3
    assert Breaker.objects.get(name="hooks").state == "open"
    assert len(read(tmp_path / "free.jsonl")) == 6  # the other destination is not held up
    assert relay.drain() == 0
    assert _attempts("hook") == 3
    # The health page names the open breaker as the reason the destination's messages wait.
    (cause,) = [cause for cause in queue_health().outbox_causes["hook"] if cause.kind == "outbox_breaker"]
    assert cause.text.startswith("breaker hooks open: nothing is sent, next probe in ")
    assert cause.text.endswith("(6 messages pending)")
    assert queue_health().outbox_causes["free"] == []

    # Still down: after open_for, one probe, which fails and opens it again.
    wait_for(lambda: relay.drain() == 0 and _attempts("hook") == 4, 30, message="a probe")
    assert Breaker.objects.get(name="hooks").state == "open"
    assert relay.drain() == 0 and _attempts("hook") == 4

    down.unlink()
    wait_for(
        lambda: relay.drain() >= 0 and Breaker.objects.get(name="hooks").state == "closed",
        30,
        message="closed",
    )
    relay.drain()
    assert check_order(read(tmp_path / "hook.jsonl")) == (6, 0)
    assert set(OutboxMessage.objects.filter(destination="hook").values_list("state", flat=True)) == {
        "delivered"
    }
    moves = list(
        BreakerEvent.objects.filter(name="hooks").order_by("id").values_list("from_state", "to_state")
    )
    assert moves == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    (stats,) = [row for row in breaker_stats() if row.limit == "hooks"]  # where task breakers show
    assert stats.state == "closed"


def test_a_spent_retry_budget_holds_retries_and_lets_first_sends_through(
    limited: Any, tmp_path: Path
) -> None:
    budget = {"ratio": 0.0, "min_retries": 1, "window": 3600}
    limited({"hooks": {"retry_budget": budget}}, hook={"LIMIT": "hooks", "MAX_ATTEMPTS": 10})
    for n in range(3):
        publish("hook", {"n": n, "fail_attempts": 2}, key=f"k{n}")
    relay = _relay()

    relay.drain()

    # Three first sends fail; one retry (the budget) fails again; the other retries wait.
    assert sorted(OutboxMessage.objects.values_list("attempts", flat=True)) == [1, 1, 2]
    assert relay.throttled.get("budget", 0) >= 1
    assert read(tmp_path / "hook.jsonl") == []


def test_an_operator_opens_and_closes_a_destinations_breaker_by_hand(limited: Any, tmp_path: Path) -> None:
    limited({"hooks": {"breaker": True}}, hook={"LIMIT": "hooks"})
    breakers.open_breaker("hooks", actor="alice", reason="receiver maintenance 02:00-03:00")
    for n in range(3):
        publish("hook", {"n": n}, key="k")
    relay = _relay()

    assert relay.drain() == 0  # open by hand: nothing is sent, however long it stays open
    assert _attempts("hook") == 0
    (cause,) = queue_health().outbox_causes["hook"]
    assert cause.text == (
        "breaker hooks open by hand by alice: receiver maintenance 02:00-03:00 "
        "(nothing is sent until it is closed; 3 messages pending)"
    )

    breakers.close("hooks", actor="alice", reason="done")
    assert relay.drain() == 3
    assert check_order(read(tmp_path / "hook.jsonl")) == (3, 0)
