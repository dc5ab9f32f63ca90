"""The classification options of @task: what decoration accepts, refuses, and how keys are made."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_jobguard import InvalidArgumentsError, task
from django_jobguard.exceptions import InvalidTaskError
from django_jobguard.registry import registry


@pytest.fixture(autouse=True)
def _forget_test_tasks() -> Iterator[None]:
    before = set(registry.names())
    yield
    for name in set(registry.names()) - before:
        registry.unregister(name)


def test_idempotency_key_template_must_name_parameters():
    with pytest.raises(
        InvalidTaskError, match=r"template 'charge:\{order\}' names 'order', which is not a parameter"
    ):

        @task(idempotency_key="charge:{order}", name="tests.classify.bad_key")
        def charge(order_id: int) -> None: ...


def test_idempotency_key_template_must_name_at_least_one_parameter():
    with pytest.raises(InvalidTaskError, match="names no parameter, so every call"):

        @task(idempotency_key="charge", name="tests.classify.fixed_key")
        def charge(order_id: int) -> None: ...


def test_idempotent_false_contradicts_a_key_template():
    with pytest.raises(InvalidTaskError, match="idempotent=False and an idempotency_key template"):

        @task(idempotent=False, idempotency_key="charge:{order_id}", name="tests.classify.both")
        def charge(order_id: int) -> None: ...


def test_parallel_false_requires_a_lock():
    with pytest.raises(InvalidTaskError, match="parallel=False but no lock"):

        @task(parallel=False, name="tests.classify.unlocked")
        def sync(account_id: int) -> None: ...

    assert "tests.classify.unlocked" not in registry

    @task(parallel=False, lock="account:{account_id}", name="tests.classify.locked")
    def sync_locked(account_id: int) -> None: ...

    assert sync_locked.parallel is False


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"idempotent": "yes"}, "idempotent must be True or False"),
        ({"parallel": 0}, "parallel must be True or False"),
        ({"expected_duration": 0}, "expected_duration must be a positive number of seconds"),
        ({"expected_duration": "5"}, "expected_duration must be a number of seconds, not '5'"),
        ({"idempotency_key": ""}, "idempotency_key must be a non-empty key template"),
    ],
)
def test_bad_classification_values_are_refused(option, message):
    with pytest.raises(InvalidTaskError, match=message):
        task(name="tests.classify.bad_value", **option)(lambda order_id: None)


def test_key_template_is_formatted_from_the_bound_arguments_with_defaults():
    @task(idempotency_key="charge:order:{order_id}:{currency}", name="tests.classify.keyed")
    def charge(order_id: int, amount: str, currency: str = "EUR") -> None: ...

    assert charge.idempotency_key_for(charge.bind([7, "10.00"], {})) == "charge:order:7:EUR"
    assert charge.idempotency_key_for(charge.bind([], {"order_id": 8, "amount": "1", "currency": "USD"})) == (
        "charge:order:8:USD"
    )
    # using() still overrides the template, per call.
    override = charge.using(idempotency_key="manual")
    assert override.idempotency_key_for(override.bind([7, "10.00"], {})) == "manual"
    assert override.idempotency_key_template == "charge:order:{order_id}:{currency}"


def test_a_key_longer_than_the_column_is_refused_at_enqueue():
    @task(idempotency_key="export:{name}", name="tests.classify.long_key")
    def export(name: str) -> None: ...

    with pytest.raises(InvalidArgumentsError, match="gave a key of 263 characters; a key must have 1 to 255"):
        export.idempotency_key_for(export.bind(["x" * 256], {}))


def test_unkeyed_tasks_have_no_key():
    @task(idempotent=True, name="tests.classify.plain")
    def plain(order_id: int) -> None: ...

    assert plain.idempotency_key_for(plain.bind([1], {})) is None
