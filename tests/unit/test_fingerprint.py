"""Argument fingerprints: equal for the same call however it is spelled, different otherwise."""

import hashlib
import json

import pytest

from django_jobguard import InvalidArgumentsError
from django_jobguard.idempotency import fingerprint, same_call, scope_of
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


def _plain(task, args, kwargs):
    """A plain SHA-256 of the call, what a keyed fingerprint must not be."""
    arguments = dict(task.bind(args, kwargs).arguments)
    canonical = json.dumps({"task": task.name, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_a_low_entropy_argument_cannot_be_recovered_without_the_secret_key(settings):
    # An attacker who knows the task and tries every amount from 0 to 10,000 against a plain
    # hash finds it at once; against the keyed digest, none of the tries matches.
    stored = fingerprint(tasks.add, [4242], {"b": 0})
    guesses = {_plain(tasks.add, [n], {"b": 0}) for n in range(10_000)}
    assert _plain(tasks.add, [4242], {"b": 0}) in guesses  # the attack works on plain hashes
    assert stored not in guesses
    settings.SECRET_KEY = "another-secret-" + "x" * 40
    assert fingerprint(tasks.add, [4242], {"b": 0}) != stored


def test_a_key_stored_with_a_fallback_fingerprint_matches_its_call_and_a_plain_one_does_not(settings):
    digest = fingerprint(tasks.add, [1], {"b": 2})
    assert same_call(digest, digest, tasks.add, [1], {"b": 2})
    assert not same_call(_plain(tasks.add, [1], {"b": 2}), digest, tasks.add, [1], {"b": 2})
    # SECRET_KEY rotated: keys written under the old one match while it is a fallback.
    old, old_secret = digest, settings.SECRET_KEY
    settings.SECRET_KEY = "rotated-" + "y" * 50
    settings.SECRET_KEY_FALLBACKS = []
    fresh = fingerprint(tasks.add, [1], {"b": 2})
    assert not same_call(old, fresh, tasks.add, [1], {"b": 2})
    settings.SECRET_KEY_FALLBACKS = [old_secret]
    assert same_call(old, fresh, tasks.add, [1], {"b": 2})
