"""The admin's one time format: seconds and the zone, with the offset when it is not UTC."""

import datetime

import pytest
from django.test import override_settings

from django_jobguard.admin.base import format_time

AT = datetime.datetime(2026, 12, 1, 6, 52, 3, 123456, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        ("UTC", "2026-12-01 06:52:03 UTC"),
        ("America/Chicago", "2026-12-01 00:52:03 CST (UTC-06:00)"),
        ("Asia/Kolkata", "2026-12-01 12:22:03 IST (UTC+05:30)"),
        ("Europe/London", "2026-12-01 06:52:03 GMT"),
    ],
)
def test_a_time_shows_seconds_and_its_zone(zone, expected):
    with override_settings(TIME_ZONE=zone):
        assert format_time(AT) == expected


def test_no_time_is_a_dash():
    assert format_time(None) == "-"
