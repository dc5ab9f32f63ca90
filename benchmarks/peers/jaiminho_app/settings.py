"""Django settings for django-jaiminho's relay (``events_relay``) and the benchmark's publisher."""

import os

from benchmarks._common import django_database

SECRET_KEY = "benchmarks-only-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        **django_database(
            os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jg_outbox_bench")
        ),
        # A persistent connection, as a deployment would configure (and as the other relays have).
        "CONN_MAX_AGE": None,
    }
}
INSTALLED_APPS = ["django.contrib.contenttypes", "jaiminho"]
JAIMINHO_CONFIG = {
    # Keep-order: every event is saved in the caller's transaction and sent by events_relay.
    # The default, publish-on-commit, sends from the publishing process in an on_commit hook
    # and keeps a row only when that send fails: the relay would not be what is measured.
    "PUBLISH_STRATEGY": "keep-order",
    # Sentry is not configured; no exceptions are expected (a failed send shows as lost).
    "DEFAULT_CAPTURE_EXCEPTION": None,
}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
