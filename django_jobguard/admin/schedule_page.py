"""Admin for schedules: where each stands, and the operators' verbs (pause, resume, run now).

Definitions come from code and settings, so rows are not edited here. The actions call
:mod:`django_jobguard.schedules`, which checks the permissions (``jobguard.pause_schedule``,
``jobguard.run_schedule``); each one done is recorded in the schedule's admin history
(who, when, which job) and logged.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import schedules
from ..encryption.payloads import ARGS, KWARGS, readable_json
from ..exceptions import JobguardError
from ..maintenance import retention
from ..models import Schedule
from .base import Deletion, ReadOnlyAdmin, admin_link, can_view_payload, done_level, pretty_json

_FIELDS = [
    "name",
    "state",
    "task_name",
    "cron",
    "timezone",
    "queue_name",
    "missed",
    "source",
    "next_tick_at",
    "last_tick_at",
    "last_job_link",
    "last_outcome",
    "paused_at",
    "paused_by",
    "removed_at",
    "created_at",
    "updated_at",
]


class StateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("active", _("Active")), ("paused", _("Paused")), ("removed", _("Removed"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> QuerySet[Schedule]:
        if self.value() == "active":
            return queryset.filter(paused=False, removed_at__isnull=True)
        if self.value() == "paused":
            return queryset.filter(paused=True, removed_at__isnull=True)
        if self.value() == "removed":
            return queryset.filter(removed_at__isnull=False)
        return queryset


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "state",
        "task_name",
        "cron",
        "timezone",
        "next_tick_at",
        "last_tick_at",
        "last_job_link",
        "last_outcome",
    ]
    list_filter = [StateFilter, "source", "missed"]
    list_select_related = ["last_job"]
    search_fields = ["name", "task_name"]
    ordering = ["name"]
    actions = ["pause_schedules", "resume_schedules", "run_schedules_now"]
    # Only a removed row may go (retention.SCHEDULE_DELETION_RULE says why).
    deletion = Deletion(
        retention.deletable_schedules, retention.delete_schedules, retention.SCHEDULE_DELETION_RULE
    )

    def _shown(self, request: HttpRequest) -> list[str]:
        # Arguments are payload: only users allowed to see payloads see them.
        return [*_FIELDS, "args_json", "kwargs_json"] if can_view_payload(request) else list(_FIELDS)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._shown(request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._shown(request)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobguard.pause_schedule")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobguard.run_schedule")

    @admin.display(description=_("state"))
    def state(self, obj: Schedule) -> str:
        return obj.state

    @admin.display(description=_("last job"))
    def last_job_link(self, obj: Schedule) -> SafeString | str:
        return admin_link(obj.last_job, f"#{obj.last_job_id}" if obj.last_job_id else None)

    @admin.display(description=_("last outcome"))
    def last_outcome(self, obj: Schedule) -> str:
        return obj.last_job.status if obj.last_job is not None else "-"

    @admin.display(description=_("args"))
    def args_json(self, obj: Schedule) -> SafeString:
        return pretty_json(readable_json(obj.args, ARGS, "schedule.args"))

    @admin.display(description=_("kwargs"))
    def kwargs_json(self, obj: Schedule) -> SafeString:
        return pretty_json(readable_json(obj.kwargs, KWARGS, "schedule.kwargs"))

    def _each(self, request: HttpRequest, queryset: QuerySet[Schedule], verb: str, do: Any) -> None:
        done, failed = 0, []
        for schedule in queryset:
            try:
                result = do(schedule)
            except (PermissionDenied, JobguardError) as exc:
                failed.append(f"{schedule.name}: {exc}")
                continue
            if result:
                done += 1
                message = f"{verb}: job #{result.pk}" if hasattr(result, "pk") else verb
                self.log_change(request, schedule, message)
        self.message_user(request, f"{verb}: {done} schedule(s).", done_level(done))
        for line in failed:
            self.message_user(request, line, messages.WARNING)

    @admin.action(description=_("Pause the selected schedules"), permissions=["pause"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Paused", lambda s: schedules.pause(s, user=request.user))

    @admin.action(
        description=_("Resume the selected schedules (from their next tick)"), permissions=["pause"]
    )
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Resumed", lambda s: schedules.resume(s, user=request.user))

    @admin.action(description=_("Run the selected schedules now (an extra job each)"), permissions=["run"])
    def run_schedules_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Run now", lambda s: schedules.run_now(s, user=request.user))
