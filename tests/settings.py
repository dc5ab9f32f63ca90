"""Settings for the test suite.

SQLite (a file, so worker subprocesses share it) and local-memory cache by default.
``JOBGUARD_TEST_DATABASE_URL=postgres://user@host:port/name`` switches to PostgreSQL,
``mysql://user@host:port/name`` to MariaDB or MySQL (mysqlclient, utf8mb4, READ COMMITTED);
``JOBGUARD_TEST_REDIS_URL=redis://host:port/db`` adds a django-redis cache alias "redis".
``JOBGUARD_TEST_DB_NAME`` is set by the suite for the worker processes it spawns, so they
use the test database pytest-django created.
"""

import importlib.util as _importlib_util
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from django import VERSION as _DJANGO_VERSION

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"  # noqa: S105
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"

DATABASE_URL = os.environ.get("JOBGUARD_TEST_DATABASE_URL", "")
REDIS_URL = os.environ.get("JOBGUARD_TEST_REDIS_URL", "")

if DATABASE_URL:
    url = urlparse(DATABASE_URL)
    if url.scheme in ("postgres", "postgresql"):
        _engine, _options = "django.db.backends.postgresql", dict[str, Any]()
    elif url.scheme in ("mysql", "mariadb"):
        _engine = "django.db.backends.mysql"
        # What django-jobguard's checks ask of a MariaDB/MySQL alias (docs/how-to/choose-a-database.md).
        _options = {
            "charset": "utf8mb4",
            "isolation_level": "read committed",
            # Django writes UTC under USE_TZ; CURRENT_TIMESTAMP (the columns' db_default) must agree.
            "init_command": "SET time_zone = '+00:00'",
        }
    else:
        raise ValueError("JOBGUARD_TEST_DATABASE_URL must be a postgres:// or mysql:// URL")
    DATABASES: dict[str, dict[str, Any]] = {
        "default": {
            "ENGINE": _engine,
            "NAME": unquote(url.path.lstrip("/")) or "jobguard",
            "USER": unquote(url.username or ""),
            "PASSWORD": unquote(url.password or ""),
            "HOST": url.hostname or "",
            "PORT": str(url.port or ""),
            "OPTIONS": _options,
        }
    }
    if _engine.endswith("mysql"):
        # The test database is <name>_test (a name under the server account's own prefix).
        DATABASES["default"]["TEST"] = {
            "NAME": f"{DATABASES['default']['NAME']}_test",
            "CHARSET": "utf8mb4",
            "COLLATION": "utf8mb4_unicode_ci",
        }
else:
    DB_DIR = BASE_DIR / ".db"
    DB_DIR.mkdir(exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DB_DIR / "jobguard.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not :memory:, so worker subprocesses see the same database.
            "TEST": {
                "NAME": str(DB_DIR / f"test_jobguard_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.sqlite3")
            },
        }
    }

# A second database for the jobs (tests/outbox/test_bridge*.py): the same server, a database of
# its own, created only for the tests that ask for it (databases=["default", "jobs"]).
DATABASES["jobs"] = {**DATABASES["default"], "TEST": dict(DATABASES["default"].get("TEST", {}))}
if DATABASES["jobs"]["ENGINE"].endswith("sqlite3"):
    DATABASES["jobs"]["NAME"] = str(DB_DIR / "jobguard_jobs.sqlite3")
    DATABASES["jobs"]["TEST"]["NAME"] = str(
        DB_DIR / f"test_jobguard_jobs_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.sqlite3"
    )
else:
    DATABASES["jobs"]["NAME"] = f"{DATABASES['default']['NAME']}_jobs"
    if "NAME" in DATABASES["jobs"]["TEST"]:
        DATABASES["jobs"]["TEST"]["NAME"] = f"{DATABASES['default']['NAME']}_jobs_test"
if os.environ.get("JOBGUARD_TEST_JOBS_DB_NAME"):
    DATABASES["jobs"]["NAME"] = os.environ["JOBGUARD_TEST_JOBS_DB_NAME"]

if os.environ.get("JOBGUARD_TEST_CLOCK_OFFSET"):
    # Reliability suite (T6): this process's wall clock runs N seconds off, to show that
    # leases and run_after follow the database clock only. Test processes only.
    import datetime as _datetime
    import time as _time

    from django.utils import timezone as _timezone

    _offset = float(os.environ["JOBGUARD_TEST_CLOCK_OFFSET"])
    _real_time, _real_now = _time.time, _timezone.now
    _time.time = lambda: _real_time() + _offset
    _timezone.now = lambda: _real_now() + _datetime.timedelta(seconds=_offset)

if os.environ.get("JOBGUARD_TEST_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["JOBGUARD_TEST_DB_NAME"]

if os.environ.get("JOBGUARD_TEST_FAILOVER_PORTS"):
    # Processes of the failover tests (tests/support/pg_replica.py): "default" names the
    # test's own primary and standby, and libpq picks whichever accepts writes.
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("JOBGUARD_TEST_FAILOVER_DB", "jobguard_failover"),
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": "127.0.0.1,127.0.0.1",
        "PORT": os.environ["JOBGUARD_TEST_FAILOVER_PORTS"],
        "OPTIONS": {"target_session_attrs": "read-write", "connect_timeout": 2},
    }

if os.environ.get("JOBGUARD_TEST_PGBOUNCER_PORT"):
    # Processes of the PgBouncer tests (tests/support/pgbouncer.py): "default" goes through the
    # pooler in transaction mode with Django's settings for it; "direct" bypasses it for LISTEN.
    DATABASES["direct"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
    DATABASES["default"] = {
        **DATABASES["default"],
        "HOST": "127.0.0.1",
        "PORT": os.environ["JOBGUARD_TEST_PGBOUNCER_PORT"],
        "DISABLE_SERVER_SIDE_CURSORS": True,
        "OPTIONS": {"prepare_threshold": None},
    }

CACHE_DIR = BASE_DIR / ".db" / f"cache_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
CACHES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    # A cache the worker subprocesses share with the test process (local memory is per process).
    "files": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": str(CACHE_DIR)},
}
if REDIS_URL:
    CACHES["redis"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
    }
    # django-prometheus's subclass (hit and miss counters): still django-redis underneath.
    CACHES["redis_metered"] = {
        **CACHES["redis"],
        "BACKEND": "django_prometheus.cache.backends.redis.RedisCache",
    }

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "rest_framework",
    "django_jobguard",
    "tests.testapp",
]
# Django's Tasks framework on jobguard: django.tasks on Django 6.x, the django-tasks backport
# on 5.2 when it is installed. Without either, TASKS stays unset and the backend's tests skip.
if _DJANGO_VERSION >= (6,):
    TASKS_ROOT: str | None = "django.tasks"
elif _importlib_util.find_spec("django_tasks") is not None:
    TASKS_ROOT = "django_tasks"
else:
    TASKS_ROOT = None
if TASKS_ROOT:
    TASKS = {
        "default": {"BACKEND": "django_jobguard.backends.JobGuardBackend", "QUEUES": ["default", "slow"]},
        # Short leases for the crash tests (OPTIONS: defaults for every task of the backend).
        "short": {
            "BACKEND": "django_jobguard.backends.JobGuardBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"visibility_timeout": 2},
        },
    }
    if TASKS_ROOT == "django_tasks":
        INSTALLED_APPS.append("django_tasks")  # the backport's checks and log receivers

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
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
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test users

JOBGUARD: dict[str, Any] = {
    "QUEUES": {"default": {"visibility_timeout": 30}, "slow": {"visibility_timeout": 120}},
    # Tests name queues freely (one per test, to keep workers apart); the refusal of
    # undeclared queues is tested with override_settings in test_enqueue.py and test_queues.py.
    "ALLOW_UNDECLARED_QUEUES": True,
    # Fast retries so process tests do not wait on production backoff.
    "RETRY": {"base": 0.05, "max": 0.5, "jitter": 0.05},
    "RECOVERABLE_RETRY": {"base": 0.2, "max": 1.0, "jitter": 0.1},
    "POLL_INTERVAL": 0.2,
    "REAPER_INTERVAL": 0.5,
    "LOCKS": {"CONTENTION_DELAY": 0.1},
    # Scrapes compare the gauges with the rows a moment later; the cache is tested on its own.
    "METRICS_CACHE_SECONDS": 0.0,
    # Tests name a queue each and read its series; the cap is tested with override_settings.
    "METRICS_MAX_UNDECLARED_QUEUES": 100_000,
    # Shared limits of the flow-control tests (tests/testapp/tasks_flow.py); a limit no task
    # names changes no claim.
    "LIMITS": {
        "flow-shared": {"concurrency": 2},
        # The breaker tests' dependency (tests/testapp/tasks_flow.py): small numbers so an
        # outage of a few seconds opens, probes and closes it.
        "flow-dep": {
            "breaker": {"failure_rate": 0.5, "min_calls": 6, "window": 10, "open_for": 1.5, "probes": 2},
            "retry_budget": {"ratio": 0.5, "min_retries": 4, "window": 3},
        },
    },
}
# The suite's purpose-built tasks exercise one behaviour each and are not classified, and
# some lock with a deliberately short TTL; the checks that say so are tested in
# tests/integration/checks/test_checks.py, which calls them directly (silencing does not apply there).
SILENCED_SYSTEM_CHECKS = ["jobguard.W002", "jobguard.W003", "jobguard.W007", "jobguard.W033"]
# Payload encryption: the suite's key, read from the environment as a deployment reads it
# (JOBGUARD["ENCRYPTION"]["KEYS_ENV"]); a test rotates keys by setting the variable, in its
# own process and for the workers it starts (tests/encryption).
os.environ.setdefault("JOBGUARD_ENCRYPTION_KEYS", "test1:He6PP2eneiHvutGPst7EmMkJLhmitdYidp5RyKYzOt4")
if os.environ.get("JOBGUARD_TEST_STRICT_QUEUES"):
    # Worker processes of the queue-refusal tests: undeclared queues refused, as in a project.
    JOBGUARD["ALLOW_UNDECLARED_QUEUES"] = False
    # The test app's tasks name undeclared queues; that check (E030) is tested in-process.
    SILENCED_SYSTEM_CHECKS += ["jobguard.E030"]
if os.environ.get("JOBGUARD_TEST_SCHEDULES"):
    # Process tests: the schedules a worker subprocess declares, as JSON.
    import json as _json

    JOBGUARD["SCHEDULES"] = _json.loads(os.environ["JOBGUARD_TEST_SCHEDULES"])
if os.environ.get("JOBGUARD_TEST_PGBOUNCER_PORT"):
    # JOBGUARD_TEST_PGBOUNCER_UNDECLARED=1: Django's pooling settings, but the alias left out
    # of POOLED_DATABASES (jobguard must find the pooler itself).
    if os.environ.get("JOBGUARD_TEST_PGBOUNCER_UNDECLARED") != "1":
        JOBGUARD["POOLED_DATABASES"] = ["default"]
    if os.environ.get("JOBGUARD_TEST_LISTEN_DIRECT", "1") == "1":
        JOBGUARD["LISTEN_DATABASE"] = "direct"
if os.environ.get("JOBGUARD_TEST_ACK_WINDOW"):
    # Process tests of batched acks: a window long enough to act inside it.
    JOBGUARD["ACK_WINDOW"] = float(os.environ["JOBGUARD_TEST_ACK_WINDOW"])
    JOBGUARD["ACK_BATCH_SIZE"] = 1000
if os.environ.get("JOBGUARD_TEST_QUEUE_CONCURRENCY"):
    # Process tests of a queue's concurrency: "name=n".
    _name, _n = os.environ["JOBGUARD_TEST_QUEUE_CONCURRENCY"].split("=")
    JOBGUARD["QUEUES"] = {**JOBGUARD["QUEUES"], _name: {"concurrency": int(_n)}}
if os.environ.get("JOBGUARD_TEST_MAINTENANCE_LEADER"):
    JOBGUARD["MAINTENANCE_LEADER"] = True
if os.environ.get("JOBGUARD_TEST_HORIZON"):
    # Process tests of the horizon watcher: a JSON object of JOBGUARD["HORIZON"] keys.
    import json as _json

    JOBGUARD["HORIZON"] = _json.loads(os.environ["JOBGUARD_TEST_HORIZON"])
if os.environ.get("JOBGUARD_TEST_RETENTION"):
    # Process tests of the workers' pruning: a JSON object of JOBGUARD["RETENTION"] keys.
    import json as _json

    JOBGUARD["RETENTION"] = _json.loads(os.environ["JOBGUARD_TEST_RETENTION"])
if os.environ.get("JOBGUARD_TEST_DATABASE_ALIAS"):
    # Process tests of a jobs database of its own (tests/outbox/test_bridge*.py): "jobs".
    JOBGUARD["DATABASE_ALIAS"] = os.environ["JOBGUARD_TEST_DATABASE_ALIAS"]
if os.environ.get("JOBGUARD_TEST_LIMITS"):
    # Process tests of limits on outbox destinations: a JSON object of JOBGUARD["LIMITS"] entries.
    import json as _json

    JOBGUARD["LIMITS"] = {**JOBGUARD["LIMITS"], **_json.loads(os.environ["JOBGUARD_TEST_LIMITS"])}
if os.environ.get("JOBGUARD_TEST_OUTBOX"):
    # Process tests of the outbox relay (tests/outbox): a JSON object of JOBGUARD["OUTBOX"] keys.
    import json as _json

    JOBGUARD["OUTBOX"] = _json.loads(os.environ["JOBGUARD_TEST_OUTBOX"])
if os.environ.get("JOBGUARD_TEST_LIVENESS_FILE"):
    JOBGUARD["LIVENESS_FILE"] = os.environ["JOBGUARD_TEST_LIVENESS_FILE"]
if os.environ.get("JOBGUARD_TEST_WAKEUP_CACHE"):
    # Process tests of Redis wake-ups: the cache alias enqueues publish through.
    JOBGUARD["WAKEUP_CACHE"] = os.environ["JOBGUARD_TEST_WAKEUP_CACHE"]
if os.environ.get("JOBGUARD_TEST_NOTIFY"):
    # Process tests of the NOTIFY modes: "row", "coalesced" or "none".
    JOBGUARD["NOTIFY"] = os.environ["JOBGUARD_TEST_NOTIFY"]
if os.environ.get("JOBGUARD_TEST_NOTIFY_INTERVAL"):
    JOBGUARD["NOTIFY_INTERVAL"] = float(os.environ["JOBGUARD_TEST_NOTIFY_INTERVAL"])
if os.environ.get("JOBGUARD_TEST_LOCK_BACKEND") == "redis":
    JOBGUARD["LOCKS"] = {**JOBGUARD["LOCKS"], "BACKEND": "redis", "CACHE_ALIAS": "redis"}


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_jobguard": {
            "handlers": ["console"],
            "level": os.environ.get("JOBGUARD_TEST_LOG_LEVEL", "WARNING"),
        }
    },
}
if os.environ.get("JOBGUARD_TEST_OTLP_ENDPOINT"):
    # Process tests of tracing: the worker exports its spans to the test's OTLP receiver.
    JOBGUARD["OPENTELEMETRY"] = True
    JOBGUARD["OPENTELEMETRY_PARENT"] = os.environ.get("JOBGUARD_TEST_OTEL_PARENT") == "1"
    from tests.support.otel import configure_otlp

    configure_otlp(
        os.environ["JOBGUARD_TEST_OTLP_ENDPOINT"],
        delay_ms=int(os.environ.get("JOBGUARD_TEST_OTLP_DELAY_MS", "200")),
    )
