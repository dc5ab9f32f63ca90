from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobguard/api/", include("django_jobguard.api.urls")),
    # django-prometheus's /metrics view: its own metrics, ours, and the queue gauges.
    path("", include("django_prometheus.urls")),
]
