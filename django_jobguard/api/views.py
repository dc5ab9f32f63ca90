"""The API's views: parse the request, check the user's permissions, call one service function.

Every rule lives in the service layer: :func:`~django_jobguard.enqueue.enqueue_exposed`,
:func:`~django_jobguard.operations.jobs.cancel`, :func:`~django_jobguard.operations.jobs.run_now`, the replay
transitions of :mod:`django_jobguard.dlq` (its permissions and two-person rule) and
:func:`~django_jobguard.monitoring.stats.queue_stats`.
"""

from __future__ import annotations

import string
from typing import Any, ClassVar

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.urls import Resolver404, resolve
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle, ScopedRateThrottle

from .. import breakers, dlq
from ..conf import get_settings
from ..encryption.indexes import search_filter
from ..enqueue import enqueue_exposed
from ..exceptions import (
    BreakerError,
    BreakerPermissionDenied,
    InvalidArgumentsError,
    InvalidTaskError,
    TaskNotExposedError,
    UnknownTaskError,
)
from ..models import DeadLetter, DeadLetterReason, Job, JobStatus, ReplayState, Workflow, WorkflowCallback
from ..monitoring import stats
from ..operations import jobs, workflows
from ..workflows import progress
from . import serializers as s
from .permissions import JobguardPermission, can_view_payload
from .problems import PROBLEM_CONTENT_TYPE, Conflict, SafeJSONParser, exception_handler

__all__ = [
    "DeadLetterDetailView",
    "DeadLetterListView",
    "JobCancelView",
    "JobDetailView",
    "JobListView",
    "JobRetryView",
    "QueueListView",
    "ReplayApproveView",
    "ReplayRejectView",
    "ReplayRequestView",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
#: Characters an Idempotency-Key may hold: printable ASCII without spaces at the ends.
_KEY_CHARACTERS = frozenset(string.printable) - frozenset("\t\n\r\x0b\x0c")


# -- shared parts ---------------------------------------------------------------------------------


class JobguardThrottle(ScopedRateThrottle):
    """DRF's scoped throttle, with rates from ``JOBGUARD["API"]`` (``None`` turns one off)."""

    def get_rate(self) -> str | None:
        api = get_settings().api
        return {"jobguard_enqueue": api.enqueue_throttle_rate, "jobguard_operate": api.operate_throttle_rate}[
            str(self.scope)
        ]


class Pagination(CursorPagination):
    """Cursor pagination, newest first: stable under inserts and flat on tables of millions of rows."""

    ordering = "-id"
    page_size_query_param = "page_size"

    def get_page_size(self, request: Request) -> int:
        api = get_settings().api
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return api.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= api.max_page_size:
            raise exceptions.ValidationError(
                {"page_size": [f"Must be an integer from 1 to {api.max_page_size}."]}, code="invalid"
            )
        return size

    def decode_cursor(self, request: Request) -> Any:
        try:
            return super().decode_cursor(request)
        except exceptions.NotFound:
            # DRF answers 404; a cursor is a parameter, so say which one is wrong.
            raise exceptions.ValidationError(
                {"cursor": ["Invalid cursor: pass the next or previous link of a page as it is."]},
                code="invalid",
            ) from None


def documented(**options: Any) -> Any:
    """``@extend_schema(...)`` built on drf-spectacular's AutoSchema whatever the project's DRF settings.

    extend_schema subclasses the schema class it finds on the function, else the project's
    ``DEFAULT_SCHEMA_CLASS``; projects need not switch theirs to drf-spectacular for us.
    """

    def decorate(function: Any) -> Any:
        function.schema = AutoSchema
        return extend_schema(**options)(function)

    return decorate


def _problem(description: str) -> OpenApiResponse:
    return OpenApiResponse(s.ProblemSerializer, description=description)


#: Errors any endpoint may answer.
COMMON_ERRORS = {
    (401, PROBLEM_CONTENT_TYPE): _problem(
        "Not authenticated (with authentication classes that ask for credentials)."
    ),
    (403, PROBLEM_CONTENT_TYPE): _problem("Not authenticated, or missing a permission; nothing changed."),
}
NOT_FOUND = {(404, PROBLEM_CONTENT_TYPE): _problem("No such object.")}
BAD_REQUEST = {
    (400, PROBLEM_CONTENT_TYPE): _problem(
        "Invalid input; `errors` names each field and why. Nothing changed."
    )
}
WRITE_ERRORS = {
    **BAD_REQUEST,
    (415, PROBLEM_CONTENT_TYPE): _problem("The body is not application/json."),
    (429, PROBLEM_CONTENT_TYPE): _problem("Throttled; retry after the Retry-After header's seconds."),
}


class JobguardView(GenericAPIView):
    """What every API view shares: permissions, JSON only, problem details, throttled writes."""

    permission_classes = [JobguardPermission]
    parser_classes = [SafeJSONParser]
    renderer_classes = [JSONRenderer]
    schema = AutoSchema()
    #: HTTP method → the permissions a user needs for it; a method not listed is refused.
    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {}
    throttle_scope = "jobguard_operate"

    def get_exception_handler(self) -> Any:
        return exception_handler

    def get_throttles(self) -> list[BaseThrottle]:
        if self.request.method in ("GET", "HEAD", "OPTIONS"):
            return []
        return [JobguardThrottle()]

    def get_serializer_context(self) -> dict[str, Any]:
        context = dict(super().get_serializer_context())
        context["show_payload"] = can_view_payload(self.request)
        context["user"] = self.request.user
        return context

    def validated(self, serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
        serializer = serializer_class(data=data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)


def _query_filters(view: JobguardView, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
    params = {str(key): view.request.query_params.get(str(key)) for key in serializer_class().fields}
    return view.validated(serializer_class, {k: v for k, v in params.items() if v is not None})


# -- jobs -----------------------------------------------------------------------------------------


def _arguments_error(exc: Exception) -> exceptions.ValidationError:
    """The service's argument error under the field(s) it is about; its message names the parameter."""
    message = str(exc)
    if message.startswith(("Arguments do not fit", "lock template", "limit key template")):
        # args and kwargs bind together: a missing or unexpected parameter, or a lock or
        # limit key made from parameters given either way, concerns both.
        return exceptions.ValidationError({"args": [message], "kwargs": [message]}, code="invalid")
    for field in ("args", "kwargs", "queue_name", "priority", "idempotency_key"):
        if message.startswith(field):
            name = IDEMPOTENCY_HEADER if field == "idempotency_key" else field
            return exceptions.ValidationError({name: [message]}, code="invalid")
    return exceptions.ValidationError({"non_field_errors": [message]}, code="invalid")


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not key or len(key) > 255 or not set(key) <= _KEY_CHARACTERS or key != key.strip():
        raise exceptions.ValidationError(
            {
                IDEMPOTENCY_HEADER: [
                    "Must be 1 to 255 printable ASCII characters, without surrounding spaces."
                ]
            },
            code="invalid",
        )
    return key


class JobListView(JobguardView):
    """``GET jobs/`` lists jobs, newest first; ``POST jobs/`` enqueues a task declared ``@task(api=True)``."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {
        "GET": ("jobguard.view_job",),
        "POST": ("jobguard.add_job",),
    }
    throttle_scope = "jobguard_enqueue"
    serializer_class = s.JobSerializer
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[Job]:
        return Job.objects.using(get_settings().database_alias).all()

    @documented(
        operation_id="jobs_list",
        parameters=[s.JobFilterSerializer],
        responses={200: s.JobSerializer(many=True), **BAD_REQUEST, **COMMON_ERRORS},
    )
    def get(self, request: Request) -> Response:
        """Jobs, newest first, one page at a time (follow ``next`` / ``previous``)."""
        filters = _query_filters(self, s.JobFilterSerializer)
        if "idempotency_key" in filters and not can_view_payload(request):
            # Keys are made of call arguments: a filter by key would confirm a guessed payload.
            raise exceptions.PermissionDenied(
                "Filtering by idempotency_key needs the jobguard.view_payload permission."
            )
        key = filters.pop("idempotency_key", None)
        queryset = self.get_queryset().filter(**filters)
        if key is not None:
            # A task with encrypt=True stores its key as a blind index: found by the clear key too.
            queryset = queryset.filter(search_filter("idempotency_key", key))
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @documented(
        operation_id="jobs_enqueue",
        request=s.EnqueueSerializer,
        parameters=[
            OpenApiParameter(
                IDEMPOTENCY_HEADER,
                str,
                OpenApiParameter.HEADER,
                description="The job's idempotency key: a repeat with the same body returns the same "
                "job (200); the same key with another body is 409. A task's key template applies "
                "instead; its key is shared, so without jobguard.view_payload any repeat is 409.",
            )
        ],
        responses={
            201: OpenApiResponse(
                s.JobSerializer, description="Enqueued. Without jobguard.view_job, only id and status."
            ),
            200: OpenApiResponse(
                s.JobSerializer,
                description="The job this Idempotency-Key made before. Without jobguard.view_job, only "
                "id and status.",
            ),
            (409, PROBLEM_CONTENT_TYPE): _problem(
                "The Idempotency-Key was used with another body, or its job is due much later than "
                "asked; for a task's key template without jobguard.view_payload, the key has a job."
            ),
            **WRITE_ERRORS,
            **COMMON_ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        """Enqueue one job of a task declared ``@task(api=True)``."""
        data = self.validated(s.EnqueueSerializer, request.data)
        key = _idempotency_key(request)
        try:
            job, created = enqueue_exposed(
                data["task"],
                data["args"],
                data["kwargs"],
                queue_name=data.get("queue_name"),
                priority=data.get("priority"),
                run_after=data.get("run_after"),
                idempotency_key=key,
                caller=f"user:{request.user.pk}",
                may_view_payload=can_view_payload(request),
            )
        except (UnknownTaskError, TaskNotExposedError):
            # One answer for both: a caller cannot map the names of the tasks it may not call.
            raise exceptions.ValidationError(
                {"task": [f"Task {data['task']!r} is not available through the API."]}, code="unknown_task"
            ) from None
        except (InvalidArgumentsError, InvalidTaskError) as exc:
            raise _arguments_error(exc) from None
        status = 201 if created else 200
        if not request.user.has_perm("jobguard.view_job"):
            # May enqueue, may not read jobs: the id and state, never arguments or a result.
            return Response({"id": job.pk, "status": job.status}, status=status)
        return Response(self.get_serializer(job).data, status=status)


class _JobObjectView(JobguardView):
    serializer_class = s.JobSerializer
    lookup_url_kwarg = "job_id"

    def get_queryset(self) -> QuerySet[Job]:
        return Job.objects.using(get_settings().database_alias).all()

    def job(self, job_id: int) -> Job:
        return get_object_or_404(self.get_queryset(), pk=job_id)


class JobDetailView(_JobObjectView):
    """``GET jobs/{id}/``."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"GET": ("jobguard.view_job",)}

    @documented(operation_id="jobs_retrieve", responses={200: s.JobSerializer, **NOT_FOUND, **COMMON_ERRORS})
    def get(self, request: Request, job_id: int) -> Response:
        """One job."""
        return Response(self.get_serializer(self.job(job_id)).data)


class CancelSerializer(serializers.Serializer):
    """``POST jobs/{id}/cancel/``: an optional reason, kept in the job's ``last_error``."""

    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class JobCancelView(_JobObjectView):
    """``POST jobs/{id}/cancel/``: cancel a queued job."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {
        "POST": ("jobguard.view_job", "jobguard.cancel_job")
    }

    @documented(
        operation_id="jobs_cancel",
        request=CancelSerializer,
        responses={
            200: OpenApiResponse(s.JobSerializer, description="Cancelled."),
            (409, PROBLEM_CONTENT_TYPE): _problem(
                "The job is not queued (running or finished), so it was not cancelled."
            ),
            **NOT_FOUND,
            **WRITE_ERRORS,
            **COMMON_ERRORS,
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        """Cancel a queued or stuck job (lease expired); a live or finished one is left alone (409)."""
        data = self.validated(CancelSerializer, request.data)
        job = self.job(job_id)
        if job.pk not in jobs.cancel([job.pk], reason=data["reason"]):
            job.refresh_from_db()
            raise Conflict(
                f"Job #{job.pk} is {job.status}: only queued jobs can be cancelled.", code="invalid_state"
            )
        job.refresh_from_db()
        return Response(self.get_serializer(job).data)


class JobRetryView(_JobObjectView):
    """``POST jobs/{id}/retry/``: make a queued job (delayed, or waiting for a retry) due now."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {
        "POST": ("jobguard.view_job", "jobguard.retry_job")
    }

    @documented(
        operation_id="jobs_retry",
        request=None,
        responses={
            200: OpenApiResponse(s.JobSerializer, description="Due now."),
            (409, PROBLEM_CONTENT_TYPE): _problem(
                "The job is not queued: a dead one is replayed from its dead letter."
            ),
            **NOT_FOUND,
            **WRITE_ERRORS,
            **COMMON_ERRORS,
        },
    )
    def post(self, request: Request, job_id: int) -> Response:
        """Run a queued job now instead of at its ``run_after``."""
        job = self.job(job_id)
        if job.pk not in jobs.run_now([job.pk]):
            job.refresh_from_db()
            hint = " (replay it from its dead letter)" if job.status == JobStatus.DEAD else ""
            raise Conflict(
                f"Job #{job.pk} is {job.status}: only queued jobs can be run now{hint}.", code="invalid_state"
            )
        job.refresh_from_db()
        return Response(self.get_serializer(job).data)


# -- dead letters ---------------------------------------------------------------------------------


class DeadLetterFilterSerializer(serializers.Serializer):
    """Filters of ``GET dead-letters/`` (all optional, combined with AND)."""

    replay_state = serializers.ChoiceField(choices=ReplayState.choices, required=False)
    reason = serializers.ChoiceField(choices=DeadLetterReason.choices, required=False)
    queue_name = serializers.CharField(max_length=100, required=False)
    task_name = serializers.CharField(max_length=255, required=False)
    job = serializers.IntegerField(min_value=1, required=False, help_text="The dead job's id.")


def _letters() -> QuerySet[DeadLetter]:
    return DeadLetter.objects.using(get_settings().database_alias).select_related(
        "replay_requested_by", "replay_decided_by"
    )


class DeadLetterListView(JobguardView):
    """``GET dead-letters/``."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"GET": ("jobguard.view_deadletter",)}
    serializer_class = s.DeadLetterSerializer
    pagination_class = Pagination

    def get_queryset(self) -> QuerySet[DeadLetter]:
        return _letters()

    @documented(
        operation_id="dead_letters_list",
        parameters=[DeadLetterFilterSerializer],
        responses={200: s.DeadLetterSerializer(many=True), **BAD_REQUEST, **COMMON_ERRORS},
    )
    def get(self, request: Request) -> Response:
        """Dead letters, newest first, one page at a time."""
        filters = _query_filters(self, DeadLetterFilterSerializer)
        if "job" in filters:
            filters["job_id"] = filters.pop("job")
        page = self.paginate_queryset(self.get_queryset().filter(**filters))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)


class _LetterObjectView(JobguardView):
    serializer_class = s.DeadLetterDetailSerializer

    def letter(self, letter_id: int) -> DeadLetter:
        return get_object_or_404(_letters().prefetch_related("replay_events"), pk=letter_id)

    def answer(self, letter_id: int) -> Response:
        return Response(self.get_serializer(self.letter(letter_id)).data)


class DeadLetterDetailView(_LetterObjectView):
    """``GET dead-letters/{id}/``: one dead letter with its replay audit trail."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"GET": ("jobguard.view_deadletter",)}

    @documented(
        operation_id="dead_letters_retrieve",
        responses={200: s.DeadLetterDetailSerializer, **NOT_FOUND, **COMMON_ERRORS},
    )
    def get(self, request: Request, letter_id: int) -> Response:
        """One dead letter, its replay audit trail, and the replay steps you may take now."""
        return self.answer(letter_id)


_REPLAY_ERRORS = {
    (403, PROBLEM_CONTENT_TYPE): _problem(
        "Missing the permission for this step, or (approve) you requested this replay yourself: "
        "another user must approve it, or it runs a corrected payload and you lack "
        "jobguard.view_payload. Nothing changed."
    ),
    (409, PROBLEM_CONTENT_TYPE): _problem(
        "The replay is not in a state this step starts from, or (approve) its payload changed "
        "since the correction_digest you sent (code payload_changed); see the message."
    ),
}


class ReplayRequestView(_LetterObjectView):
    """``POST dead-letters/{id}/request-replay/``."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"POST": ("jobguard.view_deadletter",)}
    #: The replay step: :data:`dlq.PERMISSIONS` names what the service checks on top.
    replay_action = dlq.REQUEST

    @documented(
        operation_id="dead_letters_request_replay",
        request=s.ReplayRequestSerializer,
        responses={
            200: s.DeadLetterDetailSerializer,
            **NOT_FOUND,
            **WRITE_ERRORS,
            **COMMON_ERRORS,
            **_REPLAY_ERRORS,
        },
    )
    def post(self, request: Request, letter_id: int) -> Response:
        """Ask for a replay (needs ``jobguard.request_replay``; a corrected payload also ``view_payload``)."""
        data = self.validated(s.ReplayRequestSerializer, request.data)
        letter = self.letter(letter_id)
        try:
            dlq.request_replay(letter, request.user, data["reason"], data.get("args"), data.get("kwargs"))
        except InvalidArgumentsError as exc:
            raise _arguments_error(exc) from None
        return self.answer(letter_id)


class ReplayApproveView(_LetterObjectView):
    """``POST dead-letters/{id}/approve/``."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"POST": ("jobguard.view_deadletter",)}
    #: The replay step: :data:`dlq.PERMISSIONS` names what the service checks on top.
    replay_action = dlq.APPROVE

    @documented(
        operation_id="dead_letters_approve",
        request=s.ApproveSerializer,
        responses={
            200: s.DeadLetterDetailSerializer,
            **NOT_FOUND,
            **WRITE_ERRORS,
            **COMMON_ERRORS,
            **_REPLAY_ERRORS,
        },
    )
    def post(self, request: Request, letter_id: int) -> Response:
        """Approve a requested replay (``jobguard.approve_replay``, not by its requester).

        A corrected payload also needs ``jobguard.view_payload`` and its ``correction_digest``.
        """
        data = self.validated(s.ApproveSerializer, request.data)
        try:
            dlq.approve_replay(
                self.letter(letter_id),
                request.user,
                data["reason"],
                reviewed=data.get("correction_digest"),
                # Checked under the row lock: a correction made since the client's read needs it too.
                require_review=True,
            )
        except InvalidArgumentsError as exc:
            raise _arguments_error(exc) from None
        return self.answer(letter_id)


class ReplayRejectView(_LetterObjectView):
    """``POST dead-letters/{id}/reject/``."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"POST": ("jobguard.view_deadletter",)}
    #: The replay step: :data:`dlq.PERMISSIONS` names what the service checks on top.
    replay_action = dlq.REJECT

    @documented(
        operation_id="dead_letters_reject",
        request=s.ReasonSerializer,
        responses={
            200: s.DeadLetterDetailSerializer,
            **NOT_FOUND,
            **WRITE_ERRORS,
            **COMMON_ERRORS,
            **_REPLAY_ERRORS,
        },
    )
    def post(self, request: Request, letter_id: int) -> Response:
        """Reject a requested replay, or withdraw an approved one not yet redriven (``approve_replay``)."""
        data = self.validated(s.ReasonSerializer, request.data)
        dlq.reject_replay(self.letter(letter_id), request.user, data["reason"])
        return self.answer(letter_id)


# -- queues ---------------------------------------------------------------------------------------


class QueueListView(JobguardView):
    """``GET queues/``: what ``jobguard_status`` shows, per queue."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"GET": ("jobguard.view_job",)}
    serializer_class = s.QueueSerializer

    @documented(operation_id="queues_list", responses={200: s.QueueSerializer(many=True), **COMMON_ERRORS})
    def get(self, request: Request) -> Response:
        """Every queue's depth, due and scheduled jobs, jobs in flight, oldest age and dead letters."""
        rows = [row.as_dict() for row in stats.queue_stats(recent=True)]
        return Response(self.get_serializer(rows, many=True).data)


class LimitListView(JobguardView):
    """``GET limits/``: what ``jobguard_status`` shows, per flow-control limit."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"GET": ("jobguard.view_job",)}
    serializer_class = s.LimitSerializer

    @documented(operation_id="limits_list", responses={200: s.LimitSerializer(many=True), **COMMON_ERRORS})
    def get(self, request: Request) -> Response:
        """Every declared flow-control limit: its bound, running jobs, full keys and waiting jobs."""
        rows = [row.as_dict() for row in stats.limit_stats()]
        return Response(self.get_serializer(rows, many=True).data)


class BreakerListView(JobguardView):
    """``GET breakers/``: each named limit's circuit breaker and retry budget."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"GET": ("jobguard.view_job",)}
    serializer_class = s.BreakerSerializer

    @documented(
        operation_id="breakers_list", responses={200: s.BreakerSerializer(many=True), **COMMON_ERRORS}
    )
    def get(self, request: Request) -> Response:
        """Every breaker and retry budget: state, window counts, retries left, jobs waiting."""
        rows = [row.as_dict() for row in stats.breaker_stats()]
        return Response(self.get_serializer(rows, many=True).data)


class BreakerChangeSerializer(serializers.Serializer):
    """``POST breakers/{name}/open/`` or ``close/``: why (required to open; kept in the audit trail)."""

    reason = serializers.CharField(max_length=breakers.MAX_REASON_LENGTH, required=False, allow_blank=True)


class _BreakerChangeView(JobguardView):
    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {
        "POST": ("jobguard.view_job", "jobguard.operate_breaker")
    }
    serializer_class = s.BreakerSerializer
    opens = False

    def change(self, request: Request, name: str) -> Response:
        data = self.validated(BreakerChangeSerializer, request.data)
        change = breakers.open_breaker if self.opens else breakers.close
        try:
            change(name, user=request.user, reason=data.get("reason", ""))
        except BreakerPermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc)) from None
        except BreakerError as exc:
            if "No breaker is named" in str(exc):
                raise exceptions.NotFound(str(exc)) from None
            raise exceptions.ValidationError({"reason": [str(exc)]}) from None
        row = next(row for row in stats.breaker_stats() if row.limit == name)
        return Response(self.get_serializer(row.as_dict()).data)


_BREAKER_RESPONSES: dict[Any, Any] = {200: s.BreakerSerializer, **NOT_FOUND, **WRITE_ERRORS, **COMMON_ERRORS}


class BreakerOpenView(_BreakerChangeView):
    """``POST breakers/{name}/open/``: open a breaker by hand; it holds until closed by hand."""

    opens = True

    @documented(operation_id="breakers_open", request=BreakerChangeSerializer, responses=_BREAKER_RESPONSES)
    def post(self, request: Request, name: str) -> Response:
        """Open the breaker: the dependency's jobs wait unclaimed until it is closed. A reason is required."""
        return self.change(request, name)


class BreakerCloseView(_BreakerChangeView):
    """``POST breakers/{name}/close/``: close a breaker by hand; its jobs are claimed again."""

    @documented(operation_id="breakers_close", request=BreakerChangeSerializer, responses=_BREAKER_RESPONSES)
    def post(self, request: Request, name: str) -> Response:
        """Close the breaker: its jobs are claimed at the next poll, its counts start over."""
        return self.change(request, name)


# -- workflows ------------------------------------------------------------------------------------

#: Members a workflow's page lists; the job list (``GET jobs/``) has them all.
WORKFLOW_MEMBERS_SHOWN = 100


class WorkflowDetailView(JobguardView):
    """``GET workflows/{id}/``: a workflow's progress, callbacks and first members."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"GET": ("jobguard.view_job",)}
    serializer_class = s.WorkflowSerializer

    @documented(
        operation_id="workflows_retrieve", responses={200: s.WorkflowSerializer, **NOT_FOUND, **COMMON_ERRORS}
    )
    def get(self, request: Request, workflow_id: int) -> Response:
        """One workflow: state, progress (total, succeeded, failed, pending), callbacks, first members."""
        alias = get_settings().database_alias
        row = get_object_or_404(Workflow.objects.using(alias), pk=workflow_id)
        counts = progress(row.pk, using=alias)
        members = Job.objects.using(alias).filter(workflow_id=row.pk).order_by("pk")
        data = {
            "id": row.pk,
            "kind": row.kind,
            "state": row.state,
            "name": row.name,
            "created_at": row.created_at,
            "closed_at": row.closed_at,
            "finished_at": row.finished_at,
            "total": counts.total,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
            "pending": counts.pending,
            "callbacks": list(
                WorkflowCallback.objects.using(alias)
                .filter(workflow_id=row.pk)
                .order_by("pk")
                .values("when", "job_id")
            ),
            "members": list(members.values("id", "task_name", "status", "progress")[:WORKFLOW_MEMBERS_SHOWN]),
        }
        return Response(self.get_serializer(data).data)


class _WorkflowObjectView(JobguardView):
    def workflow(self, workflow_id: int) -> Workflow:
        return get_object_or_404(Workflow.objects.using(get_settings().database_alias), pk=workflow_id)


class WorkflowCancelView(_WorkflowObjectView):
    """``POST workflows/{id}/cancel/``: cancel a workflow's queued and waiting members."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {
        "POST": ("jobguard.view_job", workflows.CANCEL_PERMISSION)
    }
    serializer_class = s.WorkflowCancelResultSerializer

    @documented(
        operation_id="workflows_cancel",
        request=s.WorkflowCancelSerializer,
        responses={
            200: OpenApiResponse(s.WorkflowCancelResultSerializer, description="Cancelled."),
            **NOT_FOUND,
            **WRITE_ERRORS,
            **COMMON_ERRORS,
        },
    )
    def post(self, request: Request, workflow_id: int) -> Response:
        """Cancel the queued and waiting members, ask running ones to stop, close an open batch."""
        data = self.validated(s.WorkflowCancelSerializer, request.data)
        row = self.workflow(workflow_id)
        who = request.user.get_username()
        reason = f"by {who} over the API" + (f": {data['reason']}" if data["reason"] else "")
        result = workflows.cancel(row.pk, reason=reason)
        return Response(self.get_serializer(result.as_dict()).data)


class WorkflowRetryView(_WorkflowObjectView):
    """``POST workflows/{id}/retry-failed/``: re-queue cancelled members, request replays of dead ones."""

    required_permissions: ClassVar[dict[str, tuple[str, ...]]] = {"POST": ("jobguard.view_job",)}
    serializer_class = s.WorkflowRetryResultSerializer

    @documented(
        operation_id="workflows_retry_failed",
        request=s.WorkflowRetrySerializer,
        responses={
            200: OpenApiResponse(
                s.WorkflowRetryResultSerializer,
                description="Done; each member left alone is in `refused`, with why.",
            ),
            **NOT_FOUND,
            **WRITE_ERRORS,
            **COMMON_ERRORS,
        },
    )
    def post(self, request: Request, workflow_id: int) -> Response:
        """Retry the failed members (``jobguard.retry_job`` for cancelled ones, and
        ``jobguard.request_replay`` for dead ones, whose replays another user approves)."""
        data = self.validated(s.WorkflowRetrySerializer, request.data)
        row = self.workflow(workflow_id)
        user = request.user
        if not (user.has_perm(workflows.RETRY_PERMISSION) or user.has_perm(workflows.REPLAY_PERMISSION)):
            raise exceptions.PermissionDenied(
                f"Retrying failed members needs {workflows.RETRY_PERMISSION} (cancelled members) "
                f"or {workflows.REPLAY_PERMISSION} (dead members)."
            )
        try:
            result = workflows.retry_failed(row.pk, user, data["reason"])
        except InvalidArgumentsError as exc:
            raise exceptions.ValidationError({"reason": [str(exc)]}, code="invalid") from None
        return Response(self.get_serializer(result.as_dict()).data)


class NotFoundView(JobguardView):
    """Any other path under the API's mount: a 404 in the API's error shape, not an HTML page."""

    permission_classes: ClassVar[list[Any]] = []  # type: ignore[misc]

    @documented(exclude=True)
    def get(self, request: Request, rest: str = "") -> Response:
        hint = ""
        if not request.path.endswith("/"):
            try:
                resolve(request.path + "/")
            except Resolver404:
                pass
            else:
                # APPEND_SLASH cannot redirect here (this view matches), and cannot redirect a POST.
                hint = f" Did you mean {request.path}/ (with the trailing slash)?"
        raise exceptions.NotFound(f"No API endpoint at {request.path}.{hint}")

    post = put = patch = delete = get
