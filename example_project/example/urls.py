from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The REST API (docs/how-to/rest-api.md): jobs, dead letters, replays, queues, schema/.
    path("jobguard/api/", include("django_jobguard.api.urls")),
    # GET /metrics: Prometheus scrapes this (django-prometheus's view). Workers serve their
    # own counters with `manage.py jobguard_worker --metrics-port 9101`.
    path("", include("django_prometheus.urls")),
]
