"""The payload validator: what can be stored as JSON on both databases, and how refusals read."""

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given, settings
from hypothesis import strategies as st

from django_jobguard import conf
from django_jobguard._json import _walk, normalize_json, payload_size, validate_payload
from django_jobguard.exceptions import InvalidArgumentsError, PayloadTooLargeError


def nested(depth: int, leaf=None):
    """A list ``depth`` levels deep: nested(1) is [], nested(2) is [[]], with ``leaf`` innermost."""
    value = [] if leaf is None else [leaf]
    for _ in range(depth - 1):
        value = [value]
    return value


def test_nesting_up_to_the_limit_passes_and_one_more_level_names_the_argument():
    assert validate_payload([nested(64)], {}, max_depth=64) == ([nested(64)], {})
    with pytest.raises(InvalidArgumentsError) as refused:
        validate_payload([], {"note": {"a": nested(64)}}, max_depth=64)
    assert str(refused.value) == (
        "kwargs['note'] is nested more than 64 levels deep; the limit is JOBGUARD['MAX_PAYLOAD_DEPTH']. "
        "Flatten the structure, or store it elsewhere and pass its id."
    )


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_nesting_far_past_the_recursion_limit_is_refused_not_a_recursion_error(depth):
    with pytest.raises(InvalidArgumentsError, match=r"^args\[0\] is nested more than 64 levels deep"):
        validate_payload([nested(depth)], {}, max_depth=64)
    with pytest.raises(InvalidArgumentsError, match=r"^return value is nested more than 10 levels"):
        normalize_json(nested(depth), "return value", max_depth=10)


def test_the_depth_limit_defaults_to_the_setting(settings):
    settings.JOBGUARD = {**settings.JOBGUARD, "MAX_PAYLOAD_DEPTH": 3}
    validate_payload([nested(3)], {})
    with pytest.raises(InvalidArgumentsError, match="nested more than 3 levels"):
        validate_payload([nested(4)], {})


def test_a_reference_cycle_is_refused_with_its_path():
    note = {"items": [1]}
    note["items"].append(note)
    with pytest.raises(InvalidArgumentsError) as refused:
        validate_payload([], {"note": note})
    assert str(refused.value) == (
        "kwargs['note']['items'][1] contains itself (a reference cycle); JSON cannot represent it."
    )
    loop = []
    loop.append(loop)
    with pytest.raises(InvalidArgumentsError, match=r"^args\[0\]\[0\] contains itself"):
        validate_payload([loop], {})


def test_a_value_shared_in_two_places_is_not_a_cycle():
    shared = {"sku": "A1"}
    assert validate_payload([[shared, shared]], {"again": shared}) == (
        [[{"sku": "A1"}, {"sku": "A1"}]],
        {"again": {"sku": "A1"}},
    )


@pytest.mark.parametrize(
    ("kwargs", "path", "problem"),
    [
        ({"note": ["a", "b", "x\x00y"]}, "kwargs['note'][2]", "holds a NUL character (\\x00) at position 1"),
        ({"note": {"k\x00": 1}}, "kwargs['note']['k\\x00']: the key", "holds a NUL character"),
        ({"note": "ok \ud800"}, "kwargs['note']", "holds a lone surrogate ('\\ud800') at position 3"),
        ({"note": [{"\udfff": 1}]}, "kwargs['note'][0]['\\udfff']: the key", "holds a lone surrogate"),
    ],
)
def test_strings_postgresql_cannot_store_are_refused_naming_the_path(kwargs, path, problem):
    with pytest.raises(InvalidArgumentsError) as refused:
        validate_payload([], kwargs)
    assert str(refused.value).startswith(f"{path} {problem}")


def test_text_that_postgresql_stores_is_accepted_unchanged():
    text = 'naïve 日本語 🎉 \t\n\x01 \\ " \u2028'
    assert validate_payload([text], {text: [text]}) == ([text], {text: [text]})


def test_an_integer_too_long_for_json_is_refused_and_a_long_one_passes():
    ok = 10**4299
    assert validate_payload([ok], {}) == ([ok], {})
    with pytest.raises(InvalidArgumentsError, match=r"^args\[0\]: an integer of more than 4300 digits"):
        validate_payload([10**4300], {})


def test_the_size_limit_counts_compact_utf8_json_and_says_where_to_change_it():
    args, kwargs = ["é" * 10], {"n": 1}
    size = len('["éééééééééé"]'.encode()) + len('{"n":1}')
    assert payload_size(args, kwargs) == size == 31
    assert validate_payload(args, kwargs, max_bytes=size) == (args, kwargs)
    with pytest.raises(PayloadTooLargeError) as refused:
        validate_payload(args, kwargs, max_bytes=size - 1)
    assert str(refused.value) == (
        "The job's arguments take 31 bytes as JSON, more than the limit of 30 bytes "
        "(JOBGUARD['MAX_PAYLOAD_BYTES']). Store large data elsewhere (a model, a file) and pass its id."
    )
    assert (refused.value.size, refused.value.limit) == (31, 30)
    assert isinstance(refused.value, InvalidArgumentsError)


def test_a_surface_with_its_own_limit_names_its_own_setting():
    with pytest.raises(PayloadTooLargeError, match=r"limit of 10 bytes \(API_MAX_BYTES\)"):
        validate_payload(["x" * 20], {}, max_bytes=10, setting="API_MAX_BYTES")


def test_the_size_limit_defaults_to_one_mebibyte():
    assert conf.parse(None).max_payload_bytes == 1024 * 1024
    validate_payload(["x" * (1024 * 1024 - 10)], {})
    with pytest.raises(
        PayloadTooLargeError, match="1,048,582 bytes as JSON, more than the limit of 1,048,576"
    ):
        validate_payload(["x" * (1024 * 1024)], {})


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"MAX_PAYLOAD_BYTES": 0}, "JOBGUARD['MAX_PAYLOAD_BYTES'] must be an integer of at least 1, not 0."),
        ({"MAX_PAYLOAD_DEPTH": "64"}, "JOBGUARD['MAX_PAYLOAD_DEPTH'] must be an integer of at least 1"),
        ({"MAX_PAYLOAD_DEPTH": 10_000}, "JOBGUARD['MAX_PAYLOAD_DEPTH'] must be at most 500"),
        ({"ALLOW_UNDECLARED_QUEUES": 1}, "JOBGUARD['ALLOW_UNDECLARED_QUEUES'] must be True or False, not 1."),
    ],
)
def test_bad_limits_name_the_setting(setting, message):
    with pytest.raises(ImproperlyConfigured) as refused:
        conf.parse(setting)
    assert str(refused.value).startswith(message)


def test_args_and_kwargs_must_be_a_list_and_a_dict():
    with pytest.raises(InvalidArgumentsError, match="args must be a list"):
        validate_payload("abc", {})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentsError, match="kwargs must be a dict"):
        validate_payload([], [("a", 1)])  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------------

storable_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_storable_values_come_back_equal_and_the_size_bound_is_never_below_the_size(value):
    clean, bound = _walk([value], "args", 64, 1)
    assert clean == [value]
    assert json.loads(json.dumps(clean)) == json.loads(json.dumps([value]))
    assert bound >= payload_size(clean, {}) - len(
        "{}"
    )  # the fast path may skip the exact size only when safe


@settings(max_examples=200, deadline=None)
@given(value=json_values, bad=st.sampled_from(["\x00", "\ud800", "\udbff\udbff"]), prefix=storable_text)
def test_an_unstorable_character_anywhere_is_refused(value, bad, prefix):
    with pytest.raises(InvalidArgumentsError, match=r"NUL character|lone surrogate"):
        validate_payload([value, {"k": [prefix + bad]}], {})
    with pytest.raises(InvalidArgumentsError, match=r"NUL character|lone surrogate"):
        validate_payload([], {"v": value, "w": {prefix + bad: 1}})


def test_more_values_than_the_limit_has_bytes_is_refused_without_serialising_them():
    shared: list = [0] * 4
    for _ in range(60):  # 4 * 2**60 values when written out: json.dumps would never finish
        shared = [shared, shared]
    with pytest.raises(PayloadTooLargeError) as refused:
        validate_payload([shared], {}, max_bytes=1000)
    assert str(refused.value) == (
        "The job's arguments hold more than 1,000 values, so they take more than the limit of 1,000 "
        "bytes (JOBGUARD['MAX_PAYLOAD_BYTES']). Store large data elsewhere (a model, a file) and pass its id."
    )
    assert refused.value.size is None
