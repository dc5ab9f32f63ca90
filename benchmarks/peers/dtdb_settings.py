"""Django settings for django-tasks with the django-tasks-db back end (``db_worker``)."""

import os

from benchmarks._common import django_database

SECRET_KEY = "benchmarks-only-not-secret"  # noqa: S105
DEBUG = False  # also keeps db_worker's --reload off
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        **django_database(
            os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jg_bench_dtdb")
        ),
        # db_worker calls close_old_connections() around every task, like a request; with
        # Django's default CONN_MAX_AGE=0 that reconnects for every task. A persistent
        # connection is what a deployment would configure, so the peer gets it.
        "CONN_MAX_AGE": None,
    }
}
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_tasks",
    "django_tasks_db",
]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
