"""The registry resolves a job's task name: registered tasks first, then its resolvers in order."""

import pytest
from django.test import override_settings

from django_jobguard import task
from django_jobguard.apps import resolve_django_task
from django_jobguard.registry import TaskRegistry, registry


@task(name="tests.resolvers.registered")
def registered() -> None:
    pass


@task(name="tests.resolvers.found")
def found() -> None:
    pass


def test_a_registered_task_wins_and_resolvers_are_asked_in_order_for_the_rest():
    own = TaskRegistry()
    own.register(registered)
    asked: list[str] = []

    def first(name):
        asked.append(f"first:{name}")
        return None

    def second(name):
        asked.append(f"second:{name}")
        return found if name == "elsewhere" else None

    own.add_resolver(first)
    own.add_resolver(second)
    own.add_resolver(first)  # once only
    assert own.resolve("tests.resolvers.registered") is registered
    assert asked == []
    assert own.resolve("elsewhere") is found
    assert asked == ["first:elsewhere", "second:elsewhere"]
    assert own.resolve("nowhere") is None
    assert own.find("elsewhere") is None, "find() knows registered tasks only"
    own.remove_resolver(second)
    assert own.resolve("elsewhere") is None


def test_the_app_installs_the_django_tasks_resolver():
    assert resolve_django_task in registry._resolvers


def test_a_django_task_resolves_only_while_tasks_configures_a_jobguard_backend():
    tasks_django = pytest.importorskip(
        "tests.testapp.tasks_django", reason="needs django.tasks or the django-tasks backport"
    )
    path = f"{tasks_django.add.func.__module__}.{tasks_django.add.func.__name__}"
    resolved = resolve_django_task(path)
    assert resolved is not None and resolved.name == path
    with override_settings(TASKS={"default": {"BACKEND": "somewhere.else.Backend"}}):
        assert resolve_django_task(path) is None
