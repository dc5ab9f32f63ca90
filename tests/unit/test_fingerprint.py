"""Argument fingerprints: equal for the same call however it is spelled, different otherwise."""

import json

import pytest

from django_jobguard import InvalidArgumentsError
from django_jobguard.idempotency import fingerprint, scope_of
from tests.testapp import tasks, tasks_idem


def test_positional_keyword_and_default_spellings_of_one_call_agree():
    spellings = [((1,), {}), ((), {"a": 1}), ((1, 0), {}), ((1,), {"b": 0}), ((), {"b": 0, "a": 1})]
    digests = {fingerprint(tasks.add, args, kwargs) for args, kwargs in spellings}
    assert len(digests) == 1


def test_different_arguments_differ():
    assert fingerprint(tasks.add, (1,), {}) != fingerprint(tasks.add, (2,), {})
    assert fingerprint(tasks.add, (1,), {}) != fingerprint(tasks.add, (1,), {"b": 1})


def test_the_task_is_part_of_the_fingerprint():
    # Two tasks sharing a scope must not pass one key between them unnoticed.
    assert scope_of(tasks_idem.shared_a) == scope_of(tasks_idem.shared_b) == "shared"
    assert fingerprint(tasks_idem.shared_a, (1,), {}) != fingerprint(tasks_idem.shared_b, (1,), {})


def test_a_json_round_trip_of_the_arguments_keeps_the_fingerprint():
    # What the worker reads back from a JSON column: keys reordered, 2.0 as 2, 1e20 spelled out.
    kwargs = {"order_id": 7, "amount": {"value": 2.0, "big": 1e20, "cents": [0.1, 0.25]}}
    stored = json.loads(json.dumps({"cents": [0.1, 0.25], "big": 100000000000000000000, "value": 2}))
    assert fingerprint(tasks_idem.charge, (), kwargs) == fingerprint(
        tasks_idem.charge, (), {"amount": stored, "order_id": 7}
    )


def test_arguments_that_do_not_bind_raise_naming_the_problem():
    with pytest.raises(InvalidArgumentsError, match="missing a required argument: 'a'"):
        fingerprint(tasks.add, (), {"b": 1})
