"""Tick computation: cron in a time zone, DST, and the missed-tick policies. Pure: ``now`` is passed in."""

import datetime

import pytest

from django_jobguard.exceptions import InvalidScheduleError
from django_jobguard.schedules import (
    next_tick,
    plan_ticks,
    shortest_interval,
    tick_key,
    validate,
)

UTC = datetime.UTC


def at(*parts: int) -> datetime.datetime:
    return datetime.datetime(*parts, tzinfo=UTC)


def ticks(cron: str, timezone: str, after: datetime.datetime, count: int) -> list[datetime.datetime]:
    found = [next_tick(cron, timezone, after)]
    while len(found) < count:
        found.append(next_tick(cron, timezone, found[-1]))
    return found


def test_next_tick_is_strictly_after_and_in_utc():
    assert next_tick("*/5 * * * *", "UTC", at(2026, 1, 1, 0, 5)) == at(2026, 1, 1, 0, 10)
    assert next_tick("*/5 * * * *", "UTC", at(2026, 1, 1, 0, 4, 59)) == at(2026, 1, 1, 0, 5)
    assert next_tick("0 2 * * *", "UTC", at(2026, 1, 1, 2, 0, 0, 1)) == at(2026, 1, 2, 2)


def test_six_fields_tick_every_second():
    assert ticks("* * * * * *", "UTC", at(2026, 1, 1, 0, 0, 0, 500_000), 3) == [
        at(2026, 1, 1, 0, 0, 1),
        at(2026, 1, 1, 0, 0, 2),
        at(2026, 1, 1, 0, 0, 3),
    ]


def test_a_time_zone_moves_the_tick():
    # 02:00 in Jakarta (UTC+7, no DST) is 19:00 UTC the day before.
    assert next_tick("0 2 * * *", "Asia/Jakarta", at(2026, 6, 1, 12)) == at(2026, 6, 1, 19)


def test_a_tick_in_the_skipped_hour_runs_once_at_the_first_valid_time():
    # Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
    day = ticks("30 2 * * *", "Europe/Berlin", at(2026, 3, 28, 12), 3)
    assert day == [at(2026, 3, 29, 1), at(2026, 3, 30, 0, 30), at(2026, 3, 31, 0, 30)]
    # 03:00 CEST once, then 02:30 CEST: one run a day, none lost, none doubled.


def test_a_tick_in_the_repeated_hour_runs_once():
    # Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET, so 02:30 happens twice.
    day = ticks("30 2 * * *", "Europe/Berlin", at(2026, 10, 24, 12), 3)
    assert day == [at(2026, 10, 25, 0, 30), at(2026, 10, 26, 1, 30), at(2026, 10, 27, 1, 30)]
    # From inside the second pass, the first pass has run: the next is tomorrow's.
    assert next_tick("30 2 * * *", "Europe/Berlin", at(2026, 10, 25, 1, 15)) == at(2026, 10, 26, 1, 30)


def test_wildcard_hours_follow_real_time_through_the_repeated_hour():
    # Every 30 minutes: the repeated hour has its two real half-hours each, every tick once.
    assert ticks("*/30 * * * *", "Europe/Berlin", at(2026, 10, 24, 23, 50), 6) == [
        at(2026, 10, 25, 0),
        at(2026, 10, 25, 0, 30),
        at(2026, 10, 25, 1),
        at(2026, 10, 25, 1, 30),
        at(2026, 10, 25, 2),
        at(2026, 10, 25, 2, 30),
    ]


def test_invalid_cron_and_time_zone_say_what_is_wrong():
    with pytest.raises(
        InvalidScheduleError, match=r"cron expression '61 \* \* \* \*' is invalid: Bad minute"
    ):
        validate("61 * * * *")
    with pytest.raises(InvalidScheduleError, match="Wrong number of fields"):
        next_tick("* * *", "UTC", at(2026, 1, 1))
    with pytest.raises(InvalidScheduleError, match="time zone 'Mars/Olympus' is not an IANA time zone"):
        validate("* * * * *", "Mars/Olympus")
    with pytest.raises(ValueError, match="aware datetime"):
        next_tick("* * * * *", "UTC", datetime.datetime(2026, 1, 1))  # noqa: DTZ001 - the point


def test_tick_key_is_the_utc_iso_time():
    tick = datetime.datetime(2026, 1, 1, 9, tzinfo=datetime.timezone(datetime.timedelta(hours=7)))
    assert tick_key("nightly", tick) == "schedule:nightly:2026-01-01T02:00:00+00:00"


def test_shortest_interval():
    assert shortest_interval("*/5 * * * *", "UTC", at(2026, 1, 1)) == 300
    assert shortest_interval("0 9,10 * * *", "UTC", at(2026, 1, 1)) == 3600
    assert shortest_interval("* * * * * *", "UTC", at(2026, 1, 1)) == 1


# -- missed ticks ---------------------------------------------------------------------------

DUE = at(2026, 1, 1, 0, 0)
AFTER_OUTAGE = at(2026, 1, 1, 0, 10, 30)  # every minute: ticks 00:00 .. 00:10 are due


@pytest.mark.parametrize(
    ("policy", "enqueued", "missed"),
    [
        ("skip", [], 11),
        ("run_once", [at(2026, 1, 1, 0, 10)], 10),
        ("catch_up", [at(2026, 1, 1, 0, minute) for minute in range(11)], 0),
    ],
)
def test_missed_ticks_follow_the_policy(policy, enqueued, missed):
    plan = plan_ticks("* * * * *", "UTC", DUE, AFTER_OUTAGE, missed=policy, missed_after=10)
    assert list(plan.ticks) == enqueued
    assert plan.missed == missed
    assert plan.next_tick_at == at(2026, 1, 1, 0, 11)


def test_catch_up_is_bounded_to_the_latest_ticks():
    plan = plan_ticks(
        "* * * * *", "UTC", DUE, AFTER_OUTAGE, missed="catch_up", missed_after=10, catch_up_max=3
    )
    assert list(plan.ticks) == [at(2026, 1, 1, 0, 8), at(2026, 1, 1, 0, 9), at(2026, 1, 1, 0, 10)]
    assert plan.missed == 8


def test_ticks_younger_than_missed_after_are_all_enqueued_whatever_the_policy():
    # A pass that comes 3 s late to a one-second schedule enqueues all three ticks: no gap.
    now = at(2026, 1, 1, 0, 0, 2, 500_000)
    for policy in ("skip", "run_once", "catch_up"):
        plan = plan_ticks("* * * * * *", "UTC", DUE, now, missed=policy, missed_after=60)
        assert list(plan.ticks) == [DUE, at(2026, 1, 1, 0, 0, 1), at(2026, 1, 1, 0, 0, 2)]
        assert plan.missed == 0


def test_skip_still_runs_the_tick_that_is_on_time():
    now = AFTER_OUTAGE
    plan = plan_ticks("* * * * *", "UTC", DUE, now, missed="skip", missed_after=60)
    assert list(plan.ticks) == [at(2026, 1, 1, 0, 10)]
    assert plan.missed == 10


def test_a_long_outage_of_a_frequent_schedule_is_not_walked_tick_by_tick():
    # Two days of a one-second schedule: 172,800 missed ticks.
    now = at(2026, 1, 3, 0, 0, 0)
    plan = plan_ticks("* * * * * *", "UTC", DUE, now, missed="catch_up", missed_after=0, catch_up_max=3)
    assert list(plan.ticks) == [at(2026, 1, 2, 23, 59, 58), at(2026, 1, 2, 23, 59, 59), now]
    assert plan.next_tick_at == at(2026, 1, 3, 0, 0, 1)
    assert plan.missed >= 10_000  # a lower bound: the jumped-over ticks are not counted
    once = plan_ticks("* * * * * *", "UTC", DUE, now, missed="run_once", missed_after=0)
    assert list(once.ticks) == [now]
