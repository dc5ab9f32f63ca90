"""Example project: a shop that runs its background work on django-jobguard.

SQLite and local files by default (no servers); DATABASE_URL and REDIS_URL switch to
PostgreSQL and Redis.
"""

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"

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

# The embedded default: SQLite, tuned for a few worker processes. IMMEDIATE transactions
# avoid lock-upgrade failures, WAL lets readers run beside the writer, timeout waits for the
# write lock. DATABASE_URL=postgres://user:password@host:port/name switches to PostgreSQL
# (workers then wake on LISTEN/NOTIFY instead of polling).
DATABASE_URL = os.environ.get("DATABASE_URL", "")
# REDIS_URL=redis://host:port/db moves locks and the shared cache to Redis (django-redis).
REDIS_URL = os.environ.get("REDIS_URL", "")

if DATABASE_URL:
    _url = urlparse(DATABASE_URL)
    if _url.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(f"DATABASE_URL must be a postgres:// URL, not {_url.scheme}://...")
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(_url.path.lstrip("/")) or "jobguard_example",
            "USER": unquote(_url.username or ""),
            "PASSWORD": unquote(_url.password or ""),
            "HOST": _url.hostname or "",
            "PORT": str(_url.port or ""),
        }
    }
else:
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

CACHES: dict[str, dict[str, Any]] = {
    # Per process: fine for what one process caches for itself.
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # The pages' cached summaries: shared by the web process and every worker, because a
    # worker's commit must delete what the web process cached (local memory cannot).
    "summaries": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(BASE_DIR / ".cache" / "summaries"),
    },
}
if REDIS_URL:
    CACHES["summaries"] = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": REDIS_URL}

JOBGUARD: dict[str, Any] = {
    # Fast and slow work in separate queues, each with a visibility timeout that outlives
    # its work; heartbeats extend it for jobs that run long.
    "QUEUES": {
        "payments": {"visibility_timeout": 30, "max_attempts": 5},
        "emails": {"visibility_timeout": 15},
        "syncs": {"visibility_timeout": 15},
        "webhooks": {"visibility_timeout": 15},
        "accounts": {"visibility_timeout": 15},
        # Short so the demo's killed worker's jobs reappear within seconds; a real
        # fulfilment queue would keep a minute or more.
        "fulfilment": {"visibility_timeout": 3, "max_attempts": 3},
        "exports": {"visibility_timeout": 600, "max_attempts": 3},
        # The recurring clock job (shop.tasks.clock_tick): tiny jobs, every two seconds.
        "clock": {"visibility_timeout": 15},
    },
    # Short for the demo; production keeps the defaults (5 / 300 / 3 seconds).
    "RETRY": {"base": 0.5, "max": 4, "jitter": 0.5},
    "POLL_INTERVAL": 0.2,
    "REAPER_INTERVAL": 0.5,
    "LOCKS": {"CONTENTION_DELAY": 0.25},
    # Cache invalidations the shop declares (shop/models.py) go to the shared cache.
    "CACHE": {"ALIAS": "summaries"},
}
if REDIS_URL:
    JOBGUARD["LOCKS"] = {**JOBGUARD["LOCKS"], "BACKEND": "redis", "CACHE_ALIAS": "summaries"}

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
