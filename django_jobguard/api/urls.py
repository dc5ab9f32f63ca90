"""URLs of the REST API: ``path("jobguard/api/", include("django_jobguard.api.urls"))``."""

from django.urls import path, re_path

from . import views
from .schema import SchemaView

app_name = "jobguard-api"

urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="jobs"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="job"),
    path("jobs/<int:job_id>/cancel/", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/retry/", views.JobRetryView.as_view(), name="job-retry"),
    path("dead-letters/", views.DeadLetterListView.as_view(), name="dead-letters"),
    path("dead-letters/<int:letter_id>/", views.DeadLetterDetailView.as_view(), name="dead-letter"),
    path(
        "dead-letters/<int:letter_id>/request-replay/",
        views.ReplayRequestView.as_view(),
        name="dead-letter-request-replay",
    ),
    path(
        "dead-letters/<int:letter_id>/approve/", views.ReplayApproveView.as_view(), name="dead-letter-approve"
    ),
    path("dead-letters/<int:letter_id>/reject/", views.ReplayRejectView.as_view(), name="dead-letter-reject"),
    path("queues/", views.QueueListView.as_view(), name="queues"),
    path("limits/", views.LimitListView.as_view(), name="limits"),
    path("breakers/", views.BreakerListView.as_view(), name="breakers"),
    path("breakers/<str:name>/open/", views.BreakerOpenView.as_view(), name="breaker-open"),
    path("breakers/<str:name>/close/", views.BreakerCloseView.as_view(), name="breaker-close"),
    path("workflows/<int:workflow_id>/", views.WorkflowDetailView.as_view(), name="workflow"),
    path("workflows/<int:workflow_id>/cancel/", views.WorkflowCancelView.as_view(), name="workflow-cancel"),
    path(
        "workflows/<int:workflow_id>/retry-failed/",
        views.WorkflowRetryView.as_view(),
        name="workflow-retry-failed",
    ),
    path("schema/", SchemaView.as_view(), name="schema"),
    # Last: a path that matches nothing above (a job id that is not a number...) answers a
    # problem-details 404 like the rest of the API, not the project's HTML page.
    re_path(r"^(?P<rest>.*)$", views.NotFoundView.as_view(), name="not-found"),
]
