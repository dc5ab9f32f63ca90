"""Django's Tasks framework on django-jobguard: ``TASKS = {"default": {"BACKEND":
"django_jobguard.backends.JobGuardBackend"}}`` (``django.tasks`` on Django 6.x, the
``django-tasks`` backport on Django 5.2)."""

from .backend import JobGuardBackend, step
from .task import JobGuardTask

__all__ = ["JobGuardBackend", "JobGuardTask", "step"]
