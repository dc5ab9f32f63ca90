"""App configuration: wires settings reloads, system checks, task discovery and the queue gauges."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from .task import Task


class JobguardConfig(AppConfig):
    name = "django_jobguard"
    label = "jobguard"
    verbose_name = _("Jobguard")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: they import the models, which the app registry
        # loads after this module. checks register on import; cache registers the durable
        # invalidation task; enqueue, which Task.enqueue() imports at its call (see task.py),
        # loads here, before the first request.
        from . import cache, checks, conf, enqueue, events, registry  # noqa: F401
        from .monitoring import beats, metrics
        from .store import wakeup

        setting_changed.connect(conf.reload, dispatch_uid="jobguard_settings_reload")
        # migrate installs JOBGUARD["NOTIFY"] in the database, where the jobs' triggers read it.
        post_migrate.connect(wakeup.install_after_migrate, sender=self, dispatch_uid="jobguard_notify_mode")
        registry.autodiscover()
        registry.registry.add_resolver(resolve_django_task)
        # What happens is emitted once (events.emit); these report it.
        events.add_sink(metrics.sink)
        events.add_sink(beats.sink)
        install_tracing()
        setting_changed.connect(install_tracing, dispatch_uid="jobguard_tracing_install")
        install_testing()
        setting_changed.connect(install_testing, dispatch_uid="jobguard_testing_install")
        # Queries run only when /metrics is scraped; the worker's own server leaves it out.
        metrics.register_queue_collector()


def install_tracing(**kwargs: Any) -> None:
    """Tracing's event sink, trace ids in job logs and exemplars, while ``OPENTELEMETRY`` is on.

    Run at start and when settings change (tests). A bad ``JOBGUARD`` is left to the system
    checks and the first use, which name the key.
    """
    if kwargs.get("setting", "JOBGUARD") != "JOBGUARD":
        return
    from . import conf, events, log
    from .monitoring import metrics

    try:
        enabled = conf.get_settings().opentelemetry
    except ImproperlyConfigured:
        enabled = False
    if enabled:
        from .monitoring import tracing  # an optional extra: imported only when enabled

        events.add_sink(tracing.sink)
        log.set_trace_fields(tracing.trace_fields)
        metrics.set_exemplar_source(tracing.exemplar)
    elif "django_jobguard.monitoring.tracing" in sys.modules:
        events.remove_sink(sys.modules["django_jobguard.monitoring.tracing"].sink)
        log.set_trace_fields(None)
        metrics.set_exemplar_source(None)


def install_testing(**kwargs: Any) -> None:
    """Inline mode's hooks (:mod:`django_jobguard.testing`) once ``TESTING["MODE"]`` says "inline".

    Run at start and when settings change (a test's override). The kit is imported only then,
    or by the tests that use it; once installed, it reads the mode at each enqueue.
    """
    if kwargs.get("setting", "JOBGUARD") != "JOBGUARD":
        return
    from . import conf

    try:
        inline = conf.get_settings().testing_mode == "inline"
    except ImproperlyConfigured:
        return
    if inline:
        from . import testing  # noqa: F401 - installs on import


def resolve_django_task(name: str) -> Task[Any, Any] | None:
    """The registry's resolver for Django tasks on a ``JobGuardBackend``, found by module path.

    Only while ``TASKS`` configures such a backend (read per call, so settings overridden in
    tests count), and the Tasks framework is imported only then: a project without it never
    loads ``django_jobguard.backends``.
    """
    backends = getattr(settings, "TASKS", None) or {}
    if not any(
        str(config.get("BACKEND", "")).startswith("django_jobguard.backends") for config in backends.values()
    ):
        return None
    from .backends.backend import resolve_task

    return resolve_task(name)
