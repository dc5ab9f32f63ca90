"""``celery.schedules``' name for :func:`~.beat.crontab`: ``from celery.schedules import crontab``
becomes ``from django_jobguard.contrib.celery.schedules import crontab`` (import-safe in settings)."""

from .beat import crontab

__all__ = ["crontab"]
