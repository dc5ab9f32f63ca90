"""Fixtures the store contract's flow-control tests share."""

import pytest

from django_jobguard.flow import hot_keys
from django_jobguard.registry import registry
from tests.testapp import tasks_flow


def _registered(tasks):
    hot_keys.clear()  # what earlier tests' claims remembered
    for task in tasks:
        registry.register(task)
    yield
    for task in tasks:
        registry.unregister(task.name)


@pytest.fixture
def flow_tasks():
    """The limited tasks of tests/testapp/tasks_flow.py, registered for the test."""
    yield from _registered(tasks_flow.ALL)


@pytest.fixture
def unguarded_tasks():
    """The flow tasks but the one under a breaker (whose claims keep Django's atomic block)."""
    yield from _registered([task for task in tasks_flow.ALL if task is not tasks_flow.call_dependency])
