"""The REST API (Django REST framework): jobs, dead letters, replays and queues over HTTP.

Mount it with ``path("jobguard/api/", include("django_jobguard.api.urls"))`` and add
``rest_framework`` to ``INSTALLED_APPS`` (``pip install "django-jobguard[api]"``). The views
parse, authorize and call the service layer (:mod:`django_jobguard.enqueue`,
:mod:`django_jobguard.operations.jobs`, :mod:`django_jobguard.dlq`,
:mod:`django_jobguard.monitoring.stats`), so the admin and the API follow the same rules.
Errors are RFC 9457 problem details (:mod:`django_jobguard.api.problems`).
"""
