"""Checks of the JOBGUARD setting itself and of what it turns on (the REST API, replay approval)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings
from ..registry import registry

if TYPE_CHECKING:
    pass


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E001: the JOBGUARD setting is invalid."""
    try:
        get_settings()
    except ImproperlyConfigured as exc:
        return [
            checks.Error(
                str(exc),
                hint="See the settings reference in the django-jobguard docs (docs/reference/settings.md).",
                id="jobguard.E001",
            )
        ]
    return []


@checks.register()
def check_api(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W040: tasks are declared ``@task(api=True)`` but Django REST framework is not installed."""
    exposed = [name for name in registry.names() if registry.get(name).api]
    if not exposed or apps.is_installed("rest_framework"):
        return []
    return [
        checks.Warning(
            f"{len(exposed)} task(s) are declared @task(api=True) (such as {exposed[0]!r}), but "
            "'rest_framework' is not in INSTALLED_APPS, so nothing can enqueue them over HTTP.",
            hint='pip install "django-jobguard[api]", add "rest_framework" to INSTALLED_APPS and mount '
            'path("jobguard/api/", include("django_jobguard.api.urls")); or drop api=True.',
            id="jobguard.W040",
        )
    ]


@checks.register(checks.Tags.security)
def check_replay_approval(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W008: the replay two-person rule is off in production (DEBUG=False)."""
    try:
        replay = get_settings().replay
    except ImproperlyConfigured:
        return []
    if replay.allow_self_approval and not settings.DEBUG:
        return [
            checks.Warning(
                "JOBGUARD['REPLAY']['ALLOW_SELF_APPROVAL'] is True while DEBUG is False: one "
                "person can request and approve the replay of a dead letter (a payment, an "
                "e-mail) alone.",
                hint="Remove ALLOW_SELF_APPROVAL (the default, False) so a second person approves "
                "every replay; keep it for development and demos only.",
                id="jobguard.W008",
            )
        ]
    return []


@checks.register()
def check_retention(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W065: succeeded jobs are pruned sooner than ``TUNING["WINDOW"]`` (globally or in a queue).

    ``check --database`` and ``jobguard_tune`` judge each task's timeouts by the durations of its
    succeeded jobs of that window: with a shorter retention they see only the jobs still kept.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []  # jobguard.E001 reports it
    window = conf.tuning.window
    kept = {"JOBGUARD['RETENTION']['SUCCEEDED']": conf.retention.policy.succeeded}
    for name, queue in sorted(conf.queues.items()):
        if queue.retention is not None:
            kept[f"JOBGUARD['QUEUES'][{name!r}]['retention']['succeeded']"] = queue.retention.succeeded
    return [
        checks.Warning(
            f"{setting} keeps succeeded jobs {seconds:g}s, less than JOBGUARD['TUNING']['WINDOW'] "
            f"({window:g}s): check --database and jobguard_tune read the durations of the succeeded "
            "jobs of that window, and see only those still kept.",
            hint="Keep succeeded jobs at least TUNING['WINDOW'] seconds, or shorten TUNING['WINDOW'] "
            "to the retention. See docs/how-to/keep-the-queue-fast.md.",
            id="jobguard.W065",
        )
        for setting, seconds in kept.items()
        if seconds is not None and seconds < window
    ]


@checks.register()
def check_memory_store(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E059: ``STORE`` is "memory" in a process that is not running tests, with DEBUG off."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []
    if conf.store != "memory":
        return []
    from ..store.memory import allowed

    if allowed():
        return []
    return [
        checks.Error(
            "JOBGUARD['STORE'] is 'memory', which keeps jobs in this process only: no worker would "
            "see them, and they vanish when it exits. It is for tests (Django's test runner, "
            "pytest-django) and DEBUG; this process is neither.",
            hint="Set JOBGUARD['STORE'] = 'memory' in your test settings only; 'database' (the default) "
            "everywhere else.",
            id="jobguard.E059",
        )
    ]
