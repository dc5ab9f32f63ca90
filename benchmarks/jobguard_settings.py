"""Django settings for the django-jobguard side of the benchmarks.

Environment: ``BENCH_DATABASE_URL`` (PostgreSQL), ``BENCH_REDIS_URL`` (Redis for the
redis lock back end), ``BENCH_LOCK_BACKEND`` (``database`` or ``redis``) and
``BENCH_JOBGUARD`` (JSON merged into ``JOBGUARD``, for tuning experiments: ``bench_peers.py
--jobguard '{"BATCH_SIZE": 16}'``) and ``BENCH_DB_OPTIONS`` (the database's ``OPTIONS``,
``bench_peers.py --db-options``). Everything else is the package's defaults: the adaptive
batch (2 x concurrency, up to 64 once jobs are known to be short), 1 s poll fallback,
LISTEN/NOTIFY.
"""

import json
import os

from benchmarks._common import django_database

SECRET_KEY = "benchmarks-only-not-secret"  # noqa: S105
DEBUG = False  # DEBUG=True would keep every query in memory
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        **django_database(
            os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jg_bench")
        ),
        # Experiments only (run.py --db-options '{"server_side_binding": true}'); empty by default
        # (MariaDB/MySQL: the options its checks ask for, from the URL).
        **({"OPTIONS": json.loads(_options)} if (_options := os.environ.get("BENCH_DB_OPTIONS")) else {}),
    }
}
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "redis": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5"),
    },
}
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django_jobguard",
    "benchmarks.jobguard_app",
]
JOBGUARD = {
    "LOCKS": {"BACKEND": os.environ.get("BENCH_LOCK_BACKEND", "database"), "CACHE_ALIAS": "redis"},
    **json.loads(os.environ.get("BENCH_JOBGUARD") or "{}"),
}
if JOBGUARD.get("OPENTELEMETRY"):
    # run.py --jobguard '{"OPENTELEMETRY": true}', compare.py's traced configuration: the SDK
    # records every span and batches it to an exporter that drops it, so the figure is
    # jobguard's and the SDK's cost, no network. Without opentelemetry-sdk, the API's no-op
    # tracer (what a project gets that turns tracing on and installs no SDK).
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        pass
    else:

        class _Dropped(SpanExporter):
            def export(self, spans):  # type: ignore[no-untyped-def]
                return SpanExportResult.SUCCESS

        _provider = TracerProvider()
        _provider.add_span_processor(BatchSpanProcessor(_Dropped()))
        trace.set_tracer_provider(_provider)
