"""Admin for jobs and idempotency keys: read-only, payloads only with ``jobguard.view_payload``.

Deleting is allowed only for the rows :mod:`django_jobguard.retention` says may go.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import jobs, retention
from ..models import IdempotencyKey, Job
from .base import Deletion, ReadOnlyAdmin, admin_link, can_view_payload, pretty_json

_PAYLOAD = (_("Payload"), {"fields": ["args_json", "kwargs_json", "result_json", "checkpoints_json"]})


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "task_name",
        "queue_name",
        "status",
        "priority",
        "attempts",
        "run_after",
        "finished_at",
    ]
    list_filter = ["status", "queue_name", "task_name"]
    search_fields = ["=id", "task_name", "idempotency_key", "lock_key"]
    payload_search_fields = ["args", "kwargs"]
    # The lock admin links to the running jobs holding a lock key.
    extra_lookups = ["lock_key", "idempotency_key"]
    date_hierarchy = "enqueued_at"
    deletion = Deletion(retention.deletable_jobs, retention.delete_jobs, retention.JOB_DELETION_RULE)
    ordering = ["-id"]
    show_full_result_count = False  # a count(*) over millions of finished rows is slow
    actions = ["cancel_jobs"]
    readonly_fields = [
        "args_json",
        "kwargs_json",
        "result_json",
        "checkpoints_json",
        "dead_letter_link",
        "replayed_from_link",
        "run_time",
        "attempt_timeline",
    ]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets: list[Any] = [
            (
                None,
                {
                    "fields": [
                        "task_name",
                        "queue_name",
                        "status",
                        "priority",
                        "attempts",
                        "max_attempts",
                        "run_after",
                        "enqueued_at",
                        "started_at",
                        "finished_at",
                        "run_time",
                        "handler_version",
                    ]
                },
            ),
            (
                _("Lease and lock"),
                {
                    "fields": [
                        "worker_id",
                        "lease_expires_at",
                        "visibility_timeout",
                        "reappearances",
                        "lock_key",
                        "lock_contentions",
                        "idempotency_key",
                    ]
                },
            ),
            (
                _("Failures"),
                {"fields": ["first_failed_at", "last_error", "dead_letter_link", "replayed_from_link"]},
            ),
            (_("Attempts"), {"fields": ["attempt_timeline"]}),
        ]
        if can_view_payload(request):
            fieldsets.insert(1, _PAYLOAD)
        return self.with_times_in_fieldsets(fieldsets)

    @admin.display(description=_("args"))
    def args_json(self, obj: Job) -> SafeString:
        return pretty_json(obj.args)

    @admin.display(description=_("kwargs"))
    def kwargs_json(self, obj: Job) -> SafeString:
        return pretty_json(obj.kwargs)

    @admin.display(description=_("result"))
    def result_json(self, obj: Job) -> SafeString:
        return pretty_json(obj.result)

    @admin.display(description=_("checkpoints"))
    def checkpoints_json(self, obj: Job) -> SafeString:
        return pretty_json(obj.checkpoints)

    @admin.display(description=_("run time"))
    def run_time(self, obj: Job) -> str:
        """Claim to finish of the last attempt, beside the task's ``expected_duration``."""
        from ..registry import registry

        task = registry.find(obj.task_name)
        expected = task.expected_duration if task is not None else None
        parts: list[str] = []
        if obj.started_at is not None and obj.finished_at is not None:
            seconds = (obj.finished_at - obj.started_at).total_seconds()
            parts.append(str(_("%(seconds).3f s") % {"seconds": seconds}))
            if expected is not None and seconds > expected:
                parts.append(str(_("longer than expected")))
        if expected is not None:
            parts.append(str(_("expected %(expected)g s") % {"expected": expected}))
        return "; ".join(parts) or "-"

    @admin.display(description=_("Attempt timeline"))
    def attempt_timeline(self, obj: Job) -> SafeString:
        """One row per attempt from the job's history: worker, start, end, error class and message."""
        attempts = [
            {**entry, "number": number} for number, entry in enumerate(obj.attempt_history or [], start=1)
        ]
        return render_to_string("django_jobguard/admin/job/attempt_timeline.html", {"attempts": attempts})

    @admin.display(description=_("dead letter"))
    def dead_letter_link(self, obj: Job) -> SafeString | str:
        try:
            return admin_link(obj.dead_letter)
        except ObjectDoesNotExist:
            return "-"

    @admin.display(description=_("replay of"))
    def replayed_from_link(self, obj: Job) -> SafeString | str:
        try:
            return admin_link(obj.replayed_from)
        except ObjectDoesNotExist:
            return "-"

    @admin.action(description=_("Cancel selected queued jobs"), permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        ids = list(queryset.values_list("pk", flat=True))
        cancelled = jobs.cancel(ids, reason=f"by {request.user.get_username()} in the admin")
        skipped = len(ids) - len(cancelled)
        self.message_user(
            request,
            ngettext("%(count)d job cancelled.", "%(count)d jobs cancelled.", len(cancelled))
            % {"count": len(cancelled)},
            messages.SUCCESS,
        )
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "%(count)d job was not queued any more and was left alone.",
                    "%(count)d jobs were not queued any more and were left alone.",
                    skipped,
                )
                % {"count": skipped},
                messages.WARNING,
            )

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobguard.cancel_job")


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = ["key", "scope", "status", "duplicates", "job", "created_at", "expires_at"]
    list_filter = ["status", "scope"]
    search_fields = ["key"]
    raw_id_fields = ["job"]
    readonly_fields = ["result_json"]
    deletion = Deletion(retention.deletable_keys, retention.delete_keys, retention.KEY_DELETION_RULE)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["key", "scope", "fingerprint", "status", "job", "duplicates"]
        fields += ["created_at", "updated_at", "expires_at"]
        if can_view_payload(request):
            fields.append("result_json")
        return self.with_times_in_fieldsets([(None, {"fields": fields})])

    @admin.display(description=_("stored result"))
    def result_json(self, obj: IdempotencyKey) -> SafeString:
        return pretty_json(obj.result)
