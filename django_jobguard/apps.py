"""App configuration: wires settings reloads, system checks, task discovery and the queue gauges."""

from django.apps import AppConfig
from django.core.signals import setting_changed
from django.utils.translation import gettext_lazy as _


class JobguardConfig(AppConfig):
    name = "django_jobguard"
    label = "jobguard"
    verbose_name = _("Jobguard")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: they import the models, which the app registry
        # loads after this module. checks register on import; cache registers the durable
        # invalidation task; enqueue plugs itself into Task.enqueue() (see task.py).
        from . import cache, checks, conf, enqueue, metrics, registry  # noqa: F401

        setting_changed.connect(conf.reload, dispatch_uid="jobguard_settings_reload")
        registry.autodiscover()
        # Queries run only when /metrics is scraped; the worker's own server leaves it out.
        metrics.register_queue_collector()
