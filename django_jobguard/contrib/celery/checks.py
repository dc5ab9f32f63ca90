"""System checks of the Celery compatibility module (``jobguard.celery.W0xx``).

Registered when the module is imported (a tasks module or the settings import it): every
Celery option or setting it cannot honour is named at startup, with what to do instead.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

__all__ = ["check_beat_schedule", "check_settings", "check_signals", "check_tasks"]

#: CELERY_* settings this module reads.
HONOURED_SETTINGS = frozenset(
    {
        "BROKER_URL",
        "TASK_ALWAYS_EAGER",
        "TASK_EAGER_PROPAGATES",
        "TASK_ROUTES",
        "TASK_TIME_LIMIT",
        "BEAT_SCHEDULE",
        "TIMEZONE",
    }
)
#: CELERY_* settings of Celery's broker, result store or beat process: nothing to do here.
NO_EFFECT_SETTINGS = frozenset(
    {
        "RESULT_BACKEND",
        "RESULT_SERIALIZER",
        "RESULT_EXTENDED",
        "RESULT_BACKEND_TRANSPORT_OPTIONS",
        "BROKER_CONNECTION_RETRY_ON_STARTUP",
        "BROKER_CONNECTION_RETRY",
        "BROKER_CONNECTION_MAX_RETRIES",
        "BROKER_TRANSPORT_OPTIONS",
        "BROKER_HEARTBEAT",
        "BROKER_POOL_LIMIT",
        "ENABLE_UTC",
        "TASK_TRACK_STARTED",
        "CACHE_BACKEND",
        "BEAT_SCHEDULER",
        "TASK_STORE_ERRORS_EVEN_IF_IGNORED",
        "WORKER_HIJACK_ROOT_LOGGER",
        "WORKER_SEND_TASK_EVENTS",
        "TASK_SEND_SENT_EVENT",
        # cookiecutter-django's settings set these for its Redis broker and result backend
        "BROKER_USE_SSL",
        "REDIS_BACKEND_USE_SSL",
        "RESULT_BACKEND_ALWAYS_RETRY",
        "RESULT_BACKEND_MAX_RETRIES",
        "TASK_CREATE_MISSING_QUEUES",
    }
)
#: CELERY_* settings jobguard does not read, with what to do instead.
SETTING_ADVICE = {
    "TASK_SERIALIZER": "arguments are always JSON; see docs/how-to/pass-arguments.md",
    "ACCEPT_CONTENT": "arguments are always JSON; see docs/how-to/pass-arguments.md",
    "TASK_SOFT_TIME_LIMIT": "jobguard has no soft limit; give tasks time_limit= (a hard one)",
    "TASK_ACKS_LATE": "jobguard acknowledges every job after its run, always",
    "TASK_DEFAULT_QUEUE": "set JOBGUARD['DEFAULT_QUEUE']",
    "TASK_DEFAULT_PRIORITY": "give tasks priority= (or JOBGUARD['QUEUES'] per queue)",
    "TASK_DEFAULT_RATE_LIMIT": "give tasks rate_limit=, or share a limit in JOBGUARD['LIMITS']",
    "TASK_ANNOTATIONS": "give the options on the tasks themselves",
    "TASK_QUEUES": "declare queues in JOBGUARD['QUEUES']",
    "RESULT_EXPIRES": "set JOBGUARD['RETENTION'] (how long finished jobs and their results are kept)",
    "WORKER_CONCURRENCY": "run manage.py jobguard_worker --concurrency N",
    "WORKER_PREFETCH_MULTIPLIER": "run manage.py jobguard_worker --batch-size N (jobs claimed at once)",
    "WORKER_MAX_TASKS_PER_CHILD": "run manage.py jobguard_worker --max-jobs N under a supervisor",
    "TASK_REJECT_ON_WORKER_LOST": "a job whose worker dies always runs again once its lease expires",
}


def _celery_settings() -> list[str]:
    return sorted(
        name[len("CELERY_") :] for name in dir(settings) if name.startswith("CELERY_") and name.isupper()
    )


@checks.register()
def check_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.celery.W001: a task option not honoured; W005: priorities whose direction is a guess."""
    from .app import declared_tasks
    from .conf import broker_url

    messages: list[checks.CheckMessage] = []
    declared = declared_tasks()
    for found in declared:
        for option, value, instead in found.mapped.unhonoured:
            messages.append(
                checks.Warning(
                    f"Celery task {found.name}: {option}={value!r} is not honoured by jobguard.",
                    hint=f"Instead: {instead}.",
                    obj=found.name,
                    id="jobguard.celery.W001",
                )
            )
    prioritised = [found.name for found in declared if found.priority is not None]
    if prioritised and not broker_url():
        messages.append(
            checks.Warning(
                f"Celery tasks declare priorities ({', '.join(prioritised[:3])}), but no broker URL is "
                "known (CELERY_BROKER_URL, or Celery(broker=...)), so they are read as RabbitMQ's (higher "
                "runs first).",
                hint="Keep CELERY_BROKER_URL while you move (redis:// reads 0 as the highest priority), "
                "or give jobguard's priority (-100..100, higher first) with @task.",
                id="jobguard.celery.W005",
            )
        )
    return messages


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.celery.W002: a CELERY_* setting jobguard does not read (pickle is an error, E001)."""
    messages: list[checks.CheckMessage] = []
    for name in _celery_settings():
        if name in HONOURED_SETTINGS or name in NO_EFFECT_SETTINGS:
            continue
        value = getattr(settings, f"CELERY_{name}")
        if name in ("TASK_SERIALIZER", "ACCEPT_CONTENT") and "pickle" in str(value):
            messages.append(
                checks.Error(
                    f"CELERY_{name} = {value!r}: jobguard stores arguments as JSON, never pickle.",
                    hint="Pass ids and JSON values; see docs/how-to/pass-arguments.md.",
                    id="jobguard.celery.E001",
                )
            )
            continue
        if name in ("TASK_SERIALIZER", "ACCEPT_CONTENT", "TASK_ACKS_LATE") and (
            value in ("json", ["json"], ("json",), True)
        ):
            continue  # what jobguard does anyway
        if name == "TASK_DEFAULT_QUEUE" and value == _jobguard_default_queue():
            continue  # testdrivenio's django-celery-project names it "default", as jobguard does
        advice = SETTING_ADVICE.get(name, "see docs/how-to/move-from-celery.md for the settings it reads")
        messages.append(_not_read(f"CELERY_{name}", advice))
    from .app import apps

    for app in apps():
        if app.config_source is not None:
            messages.append(
                _not_read(
                    f"Celery({app.main!r}).config_from_object({app.config_source!r})",
                    "put the settings in Django's settings as CELERY_* and call "
                    "config_from_object('django.conf:settings', namespace='CELERY')",
                )
            )
        for key in sorted(app.conf):
            name = key.upper()
            advice = (
                f"set CELERY_{name} in Django's settings"
                if name in HONOURED_SETTINGS
                else SETTING_ADVICE.get(name, "see docs/how-to/move-from-celery.md for the settings it reads")
            )
            messages.append(_not_read(f"Celery({app.main!r}).conf.{key}", advice))
    return messages


def _jobguard_default_queue() -> str:
    from ...conf import get_settings

    return get_settings().default_queue


def _not_read(where: str, advice: str) -> checks.CheckMessage:
    return checks.Warning(
        f"{where} is not read by jobguard.",
        hint=f"Instead: {advice}.",
        id="jobguard.celery.W002",
    )


@checks.register()
def check_signals(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.celery.W006: a receiver connected to a Celery logging signal, which is never sent."""
    from .signals import NEVER_SENT

    return [
        checks.Warning(
            f"A receiver is connected to Celery's {name} signal, which jobguard never sends.",
            hint="jobguard_worker is a management command: Django applies LOGGING before it starts "
            "and the worker configures no logging of its own. Put what the receiver does in "
            "LOGGING, or remove it.",
            id="jobguard.celery.W006",
        )
        for name, signal in NEVER_SENT.items()
        if signal.has_listeners()
    ]


@checks.register()
def check_beat_schedule(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.celery.W003: a beat entry jobguard does not run; W004: an entry's option left out."""
    from ...conf import get_settings
    from .beat import convert_entry
    from .conf import celery_setting

    entries = celery_setting("BEAT_SCHEDULE", None) or {}
    if not entries:
        return []
    try:
        declared = get_settings().schedules
    except ImproperlyConfigured:
        return []  # jobguard.E001 names the setting
    messages: list[checks.CheckMessage] = []
    for name, entry in sorted(entries.items()):
        if name not in declared:
            messages.append(
                checks.Warning(
                    f"CELERY_BEAT_SCHEDULE[{name!r}] is not in JOBGUARD['SCHEDULES']: jobguard does not "
                    "run it.",
                    hint="Set JOBGUARD['SCHEDULES'] = beat_schedule(CELERY_BEAT_SCHEDULE, "
                    "timezone=CELERY_TIMEZONE) (from django_jobguard.contrib.celery.beat).",
                    id="jobguard.celery.W003",
                )
            )
            continue
        try:
            _, left_out = convert_entry(name, entry)
        except ImproperlyConfigured:
            continue  # beat_schedule() raised it already, in the settings
        for option, value in left_out:
            messages.append(
                checks.Warning(
                    f"CELERY_BEAT_SCHEDULE[{name!r}]: {option}={value!r} is not honoured by jobguard's "
                    "scheduler.",
                    hint="A schedule takes task, cron, timezone, args, kwargs, queue_name and missed; "
                    "drop the option or do its work in the task.",
                    id="jobguard.celery.W004",
                )
            )
    return messages
