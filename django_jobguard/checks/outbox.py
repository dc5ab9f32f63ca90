"""Checks of the outbox: every declared destination is built at startup, not at its first message,
and every model's ``publishes()`` declaration is checked against its model and the settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings
from ..outbox.declarations import declarations, problems
from ..outbox.loading import backend_class, build
from ..registry import registry


@checks.register()
def check_outbox_destinations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E060: a destination of ``OUTBOX["DESTINATIONS"]`` cannot be built from its options."""
    try:
        destinations = get_settings().outbox.destinations
    except ImproperlyConfigured:
        return []  # reported by the settings check
    errors: list[checks.CheckMessage] = []
    for name, config in sorted(destinations.items()):
        try:
            destination = build(config)
        except (ValueError, TypeError, ImportError) as exc:
            errors.append(
                checks.Error(
                    f"Outbox destination {name!r} cannot be built: {exc}",
                    hint="Fix the option the message names in JOBGUARD['OUTBOX']['DESTINATIONS'] "
                    "(see docs/how-to/publish-events.md and the backend's options).",
                    obj=f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}]",
                    id="jobguard.E060",
                )
            )
            continue
        destination.close()
    return errors


@checks.register()
def check_declared_events(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E061: a model's ``publishes()`` names an undeclared destination, a field it lacks, ..."""
    try:
        get_settings()
    except ImproperlyConfigured:
        return []  # reported by the settings check
    errors: list[checks.CheckMessage] = []
    for declaration in declarations():
        if app_configs is not None and declaration.model._meta.app_config not in app_configs:
            continue
        errors += [
            checks.Error(
                f"{declaration.label}: {problem}.",
                hint="Fix the declaration (see docs/how-to/publish-events.md, Publish on save) or the "
                "settings it names.",
                obj=declaration.model,
                id="jobguard.E061",
            )
            for problem in problems(declaration)
        ]
    return errors


# Reads settings only, so it runs with every command (as check_database does).
@checks.register()
def check_outbox_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E065: ``OUTBOX["DATABASE_ALIAS"]`` names no database of ``DATABASES``."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []  # reported by the settings check
    alias = conf.outbox.database_alias
    if alias is None or alias in settings.DATABASES:
        return []
    return [
        checks.Error(
            f"JOBGUARD['OUTBOX']['DATABASE_ALIAS'] is {alias!r}, which is not in DATABASES.",
            hint="Name the application's database (where publish() and enqueue_via_outbox() write), "
            "or leave it None to keep the outbox beside the jobs.",
            obj="JOBGUARD['OUTBOX']['DATABASE_ALIAS']",
            id="jobguard.E065",
        )
    ]


@checks.register()
def check_jobs_destination(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.W068: a "jobs" destination while the outbox is in the jobs' own database."""
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []  # reported by the settings check
    if conf.outbox_alias != conf.database_alias:
        return []
    from ..outbox.destinations.jobs import JobsDestination

    warnings: list[checks.CheckMessage] = []
    for name, config in sorted(conf.outbox.destinations.items()):
        try:
            backend = backend_class(config)
        except ValueError:
            continue  # jobguard.E060
        if isinstance(backend, type) and issubclass(backend, JobsDestination):
            warnings.append(
                checks.Warning(
                    f"Outbox destination {name!r} makes jobs in {conf.database_alias!r}, and the outbox "
                    "is there too: enqueue_via_outbox() joins only transactions on that database, as "
                    "task.enqueue() does, and adds a relay hop.",
                    hint="With the jobs in a database of their own, set JOBGUARD['OUTBOX']['DATABASE_ALIAS'] "
                    "to the application's alias (see the how-to 'Run jobs in their own database'); "
                    "otherwise enqueue with task.enqueue() and remove the destination.",
                    obj=f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}]",
                    id="jobguard.W068",
                )
            )
    return warnings


@checks.register()
def check_outbox_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobguard.E064: a limit with a ``concurrency`` named by tasks and by outbox destinations.

    A limit's concurrency counts either the running jobs of its tasks (at claim) or the keys
    in flight to its destinations (at the relay's claim), not both: shared, it would hold
    neither bound. A rate, a breaker and a retry budget may be shared.
    """
    try:
        conf = get_settings()
    except ImproperlyConfigured:
        return []  # reported by the settings check
    by_limit: dict[str, list[str]] = {}
    for name, config in sorted(conf.outbox.destinations.items()):
        limit = conf.limits.get(config.limit or "")
        if limit is not None and limit.concurrency is not None:
            by_limit.setdefault(limit.name, []).append(name)
    if not by_limit:
        return []
    tasks: dict[str, list[str]] = {}
    for task_name in registry.names():
        limit_name = getattr(registry.get(task_name), "limit", None)
        if limit_name in by_limit:
            tasks.setdefault(limit_name, []).append(task_name)
    return [
        checks.Error(
            f"JOBGUARD['LIMITS'][{limit_name!r}] has a concurrency, and both tasks "
            f"({', '.join(sorted(tasks[limit_name]))}) and outbox destinations "
            f"({', '.join(by_limit[limit_name])}) name it: one concurrency cannot count running "
            "jobs and keys in flight together.",
            hint="Give the destinations a limit of their own for the concurrency (a rate, a breaker "
            "and a retry budget may be shared); see docs/how-to/publish-events.md.",
            obj=f"JOBGUARD['LIMITS'][{limit_name!r}]",
            id="jobguard.E064",
        )
        for limit_name in sorted(tasks)
    ]
