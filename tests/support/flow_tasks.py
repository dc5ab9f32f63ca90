"""Fixtures that register the limited tasks of tests/testapp/tasks_flow.py for a test.

Used by the store contract (tests/store_contract/) and by the database-only flow tests beside
it (tests/integration/store/, tests/integration/flow/): a conftest imports them by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from django_jobguard.flow import hot_keys
from django_jobguard.registry import registry
from django_jobguard.store import postgres
from tests.testapp import tasks_flow


def _registered(tasks: Iterable[Any]) -> Iterator[None]:
    tasks = list(tasks)
    hot_keys.clear()  # what earlier tests' claims remembered
    for task in tasks:
        registry.register(task)
    yield
    for task in tasks:
        registry.unregister(task.name)


@pytest.fixture
def flow_tasks() -> Iterator[None]:
    """The limited tasks of tests/testapp/tasks_flow.py, registered for the test."""
    yield from _registered(tasks_flow.ALL)


@pytest.fixture
def unguarded_tasks() -> Iterator[None]:
    """The flow tasks but the one under a breaker (whose claims keep Django's atomic block)."""
    yield from _registered([task for task in tasks_flow.ALL if task is not tasks_flow.call_dependency])


@pytest.fixture
def claims_start_from_the_head() -> None:
    """Each test's first claim per worker id is a full one on PostgreSQL, as a new worker's is:
    the tests reuse worker ids, which no worker process does (see ``store.postgres``)."""
    postgres.forget_claim_bounds()
