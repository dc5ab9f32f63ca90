"""A refused argument's error says how to pass it as JSON, and that advice round-trips exactly."""

from __future__ import annotations

import base64
import datetime
import decimal
import enum
import fractions
import importlib
import json
import pathlib
import re
import uuid
import zoneinfo
from typing import Any

import pytest

from django_jobguard._json import validate_payload
from django_jobguard.exceptions import InvalidArgumentsError


class Size(enum.Enum):
    SMALL = "s"


ADVICE = re.compile(
    r"Unsupported type: (?P<type>\S+) is not JSON-serialisable; pass (?P<store>.+) instead, "
    r"and turn it back with (?P<load>.+) where it is read \((?P<kept>[^)]*)\)\.$"
)

VALUES = [
    decimal.Decimal("10.10"),
    decimal.Decimal("-0.000"),
    decimal.Decimal("1E+3"),
    datetime.date(2026, 12, 7),
    datetime.datetime(2026, 12, 7, 11, 45, 3, 120005),  # noqa: DTZ001 - naive ones are passed too
    datetime.datetime(2026, 12, 7, 11, 45, 3, 120005, tzinfo=datetime.UTC),
    datetime.datetime(
        2026, 3, 29, 2, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=-5, minutes=-30))
    ),
    datetime.time(23, 59, 59, 999999),
    datetime.timedelta(days=-3, seconds=5, microseconds=7),
    datetime.timedelta(days=999_999_999, microseconds=1),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    fractions.Fraction(1, 3),
    pathlib.PurePosixPath("/srv/exports/2026.csv"),
    b"\x00\xffbinary",
    {3, 1, 2},
    Size.SMALL,
]


def refusal(value: Any) -> re.Match[str]:
    with pytest.raises(InvalidArgumentsError) as refused:
        validate_payload([], {"value": value})
    message = str(refused.value)
    assert message.startswith("kwargs['value']: Unsupported type: "), message
    found = ADVICE.search(message)
    assert found, message
    return found


@pytest.mark.parametrize("value", VALUES, ids=lambda value: type(value).__name__)
def test_the_refusal_names_a_conversion_that_brings_the_same_value_back(value):
    advice = refusal(value)
    names = {
        "value": value,
        "base64": base64,
        "datetime": datetime,
        "decimal": decimal,
        "fractions": fractions,
        "pathlib": pathlib,
        "uuid": uuid,
        # An Enum's advice names its class by its module path.
        "tests": importlib.import_module("tests"),
    }
    stored = eval(advice["store"], names)  # noqa: S307 - the message's own advice, on test values
    # What the advice stores is accepted, and what the job row gives back turns into the same value.
    _, clean_kwargs = validate_payload([], {"value": stored})
    loaded = json.loads(json.dumps(clean_kwargs))["value"]
    back = eval(advice["load"], {**names, "value": loaded})  # noqa: S307
    assert back == value
    assert type(back) is type(value) or isinstance(value, pathlib.PurePath)
    if isinstance(value, decimal.Decimal):
        assert str(back) == str(value)  # the digits and the exponent, not just the number


def test_an_aware_datetime_comes_back_at_the_same_instant_with_its_offset():
    # The second 02:30 of the night the clocks go back: the offset says which one it was.
    value = datetime.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    advice = refusal(value)
    assert "a ZoneInfo comes back as that offset" in advice["kept"]
    back = datetime.datetime.fromisoformat(value.isoformat())
    assert back.timestamp() == value.timestamp()
    assert back.utcoffset() == value.utcoffset() == datetime.timedelta(hours=1)
    assert back.replace(tzinfo=None) == value.replace(tzinfo=None)  # the same wall time


def test_a_model_instance_is_told_to_pass_its_primary_key():
    from django.contrib.auth.models import User

    with pytest.raises(InvalidArgumentsError) as refused:
        validate_payload([User(pk=7)], {})
    assert str(refused.value) == (
        "args[0]: Unsupported type: django.contrib.auth.models.User is not JSON-serialisable; pass its "
        "primary key (value.pk) instead, and load the row where it is read (User.objects.get(pk=value)), "
        "which then sees its current state."
    )


def test_any_other_type_is_told_what_json_holds():
    with pytest.raises(InvalidArgumentsError) as refused:
        validate_payload([], {"when": object()})
    assert str(refused.value) == (
        "kwargs['when']: Unsupported type: builtins.object is not JSON-serialisable; pass str, int, "
        "float, bool, None, or lists and dicts (string keys) of them instead."
    )
