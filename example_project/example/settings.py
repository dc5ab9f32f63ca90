"""Example project: a shop that charges orders through django-jobguard, on SQLite."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "rest_framework",  # the REST API (example/urls.py)
    "django_jobguard",
    "shop",
]
MIDDLEWARE = [
    # django-prometheus times requests between these two; /metrics (example/urls.py) serves
    # its metrics, django-jobguard's counters and the jobguard_queue_* gauges.
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]
ROOT_URLCONF = "example.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# SQLite, tuned for a few worker processes: IMMEDIATE transactions avoid lock-upgrade
# failures, WAL lets readers run beside the writer, timeout waits for the write lock.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
}

JOBGUARD = {
    # Fast and slow work in separate queues, each with a visibility timeout that
    # outlives its work; heartbeats extend it for jobs that run long.
    "QUEUES": {
        "payments": {"visibility_timeout": 30, "max_attempts": 5},
        "emails": {"visibility_timeout": 15},
        "exports": {"visibility_timeout": 600, "max_attempts": 3},
    },
    "RETRY": {"base": 1, "max": 30, "jitter": 1},  # short for the demo; production keeps 5/300/3
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # Structured logs: every job record carries job_id, job_type, queue, attempt,
        # idempotency_key, lock_key, worker_id, duration and outcome as JSON keys.
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "loggers": {
        "django_jobguard": {
            "handlers": ["console"],
            "level": os.environ.get("JOBGUARD_LOG_LEVEL", "WARNING"),
        },
    },
}
