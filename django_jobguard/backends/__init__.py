"""Django's Tasks framework on django-jobguard: ``TASKS = {"default": {"BACKEND":
"django_jobguard.backends.JobGuardBackend"}}`` (``django.tasks`` on Django 6.x, the
``django-tasks`` backport on Django 5.2)."""

from .backend import JobGuardBackend, step
from .task import JobGuardTask
from .waiting import await_for, wait_for

__all__ = ["JobGuardBackend", "JobGuardTask", "await_for", "step", "wait_for"]
