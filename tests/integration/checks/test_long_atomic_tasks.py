"""jobguard.W064: an atomic task that may run long holds the vacuum horizon for its whole run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings

from django_jobguard import checks, task
from django_jobguard.registry import registry


@pytest.fixture
def define() -> Iterator[Callable[..., Any]]:
    """Register a task for one test (unregistered afterwards, so other checks do not see it)."""
    names: list[str] = []

    def make(name: str, **options: Any) -> Any:
        def handler(order_id: int) -> None: ...

        created = task(name=f"tests.horizon.{name}", **options)(handler)
        names.append(created.name)
        return created

    yield make
    for name in names:
        registry.unregister(name)


def _w064(obj: Any) -> list[Any]:
    return [m for m in checks.tasks.check_long_atomic_tasks() if m.id == "jobguard.W064" and m.obj is obj]


def test_an_atomic_task_whose_timeout_exceeds_the_bound_is_warned_with_the_fix(define):
    long = define("long_atomic", atomic=True, timeout=600, idempotent=True)
    [warning] = _w064(long)
    assert warning.msg.startswith(
        "atomic=True with timeout=600s, over JOBGUARD['HORIZON']['ATOMIC_TIMEOUT'] (60s)"
    )
    assert "no dead row of the cluster can be vacuumed" in warning.msg
    assert "atomic=False with an idempotency key" in warning.hint
    assert "split the work" in warning.hint
    assert str(warning).startswith("<Task tests.horizon.long_atomic>: (jobguard.W064)")


def test_the_expected_duration_is_judged_when_there_is_no_timeout(define):
    expected = define("expected_atomic", atomic=True, expected_duration=120, idempotent=True)
    [warning] = _w064(expected)
    assert "expected_duration=120s" in warning.msg


def test_short_non_atomic_and_unbounded_tasks_are_not_warned(define):
    short = define("short_atomic", atomic=True, timeout=30, idempotent=True)
    plain = define("long_plain", timeout=600, idempotent=True)
    unbounded = define("unbounded_atomic", atomic=True, idempotent=True)
    assert _w064(short) == [] and _w064(plain) == [] and _w064(unbounded) == []


@override_settings(JOBGUARD={"HORIZON": {"ATOMIC_TIMEOUT": 900.0}})
def test_the_bound_is_a_setting(define):
    long = define("long_atomic_allowed", atomic=True, timeout=600, idempotent=True)
    assert _w064(long) == []
    with override_settings(JOBGUARD={"HORIZON": {"ATOMIC_TIMEOUT": 599.0}}):
        assert len(_w064(long)) == 1
