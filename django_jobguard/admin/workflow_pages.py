"""Admin for workflows: each chain, group, batch or graph with its progress and members,
and the two things an operator does to one: cancel it, retry its failed members.

Both actions call :mod:`django_jobguard.operations.workflows`, under the job admin's permissions
(``jobguard.cancel_job``, ``jobguard.retry_job``); a dead member is retried through the
dead-letter queue's replay (``jobguard.request_replay``, then another user's approval).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import OuterRef, Q, QuerySet, Subquery, Sum
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..models import DeadLetter, Job, JobStatus, Workflow, WorkflowCallback, WorkflowCounter, WorkflowState
from ..operations import workflows
from ..workflows import progress
from .base import ReadOnlyAdmin, done_level, log_to_history, refusal
from .jobs import job_progress_html

#: Members listed on a workflow's page; the job list (linked) has them all.
MEMBERS_SHOWN = 200

VIEW_PERMISSIONS = ("jobguard.view_workflow", "jobguard.view_job")

_FIELDS = ("kind", "name", "state", "created_at", "closed_at", "finished_at")


class ReasonForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text=_("Recorded with your name: in the members' last error, or the replays' audit trail."),
    )


def _job_ref(job_id: int | None) -> dict[str, Any] | None:
    """A job's number and the link to its page, for a member's row; None for no job."""
    if job_id is None:
        return None
    return {"id": job_id, "url": reverse("admin:jobguard_job_change", args=[job_id])}


def can_cancel(request: HttpRequest) -> bool:
    return bool(request.user.has_perm(workflows.CANCEL_PERMISSION))


def can_retry(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.has_perm(workflows.RETRY_PERMISSION) or user.has_perm(workflows.REPLAY_PERMISSION))


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "name", "state", "progress_text", "created_at", "age"]
    list_filter = ["state", "kind"]
    search_fields = ["id"]
    search_whole_values = True
    search_help_text = _("Workflow ids, whole.")
    ordering = ["-id"]
    show_full_result_count = False
    change_form_template = "django_jobguard/admin/workflow/change_form.html"
    fields = _FIELDS
    readonly_fields = _FIELDS

    # Job viewers see workflows too: the REST API's rule (a workflow is a view of its jobs).
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return any(request.user.has_perm(perm) for perm in VIEW_PERMISSIONS)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request) or super().has_module_permission(request)

    @admin.display(description=_("progress"))
    def progress_text(self, obj: Workflow) -> str:
        done, failed, pending = (
            int(getattr(obj, f"{field}_sum", 0) or 0) for field in ("succeeded", "failed", "pending")
        )
        return f"{done} done, {failed} failed, {pending} pending (of {done + failed + pending})"

    @admin.display(description=_("age"))
    def age(self, obj: Workflow) -> str:
        end = obj.finished_at or timezone.now()
        return f"{max(0.0, (end - obj.created_at).total_seconds()):.0f} s"

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path(
                "<path:object_id>/cancel/",
                self.admin_site.admin_view(self.cancel_view),
                name=f"{prefix}_cancel",
            ),
            path(
                "<path:object_id>/retry-failed/",
                self.admin_site.admin_view(self.retry_view),
                name=f"{prefix}_retry_failed",
            ),
            *super().get_urls(),
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id)) if self.has_view_permission(request) else None
        context = dict(extra_context or {})
        if obj is not None:
            context.update(self._page(request, obj))
        return super().change_view(request, object_id, form_url, context)

    def _page(self, request: HttpRequest, obj: Workflow) -> dict[str, Any]:
        alias = get_settings().database_alias
        p = progress(obj.pk, using=alias)
        members = list(
            Job.objects.using(alias)
            .filter(workflow_id=obj.pk)
            .order_by("pk")
            .only(
                "pk",
                "task_name",
                "status",
                "attempts",
                "max_attempts",
                "finished_at",
                "last_error",
                "progress",
            )[:MEMBERS_SHOWN]
        )
        # The dead members' letters, and the letters whose replay is a member: a replay takes
        # its dead member's place in the workflow, and the two rows say so to each other.
        dead_ids = [job.pk for job in members if job.status == JobStatus.DEAD]
        found = list(
            DeadLetter.objects.using(alias)
            .filter(Q(job_id__in=dead_ids) | Q(replay_job_id__in=[job.pk for job in members]))
            .values_list("pk", "job_id", "replay_job_id")
        )
        letters = {job_id: pk for pk, job_id, _ in found if job_id in dead_ids}
        replayed_as = {
            job_id: replay_id for _, job_id, replay_id in found if replay_id and job_id in dead_ids
        }
        replay_of = {replay_id: job_id for _, job_id, replay_id in found if replay_id and job_id}
        rows = [
            {
                "job": job,
                "url": reverse("admin:jobguard_job_change", args=[job.pk]),
                "task": job.task_name.rsplit(".", 1)[-1],
                # Our own words only (cancel reasons, "upstream failed"): a handler's error may
                # echo its payload, and the job's page shows that with the permission.
                "note": job.last_error
                if job.status in (JobStatus.CANCELLED, JobStatus.WAITING, JobStatus.QUEUED)
                and job.last_error.startswith(("cancelled", "upstream failed", "re-queued", "waiting again"))
                else "",
                "letter_url": reverse("admin:jobguard_deadletter_change", args=[letters[job.pk]])
                if job.pk in letters
                else "",
                "replayed_as": _job_ref(replayed_as.get(job.pk)),
                "replay_of": _job_ref(replay_of.get(job.pk)),
                # What its handler reported (context.report_progress), without the message.
                "progress": job_progress_html(job.progress),
            }
            for job in members
        ]
        done = p.succeeded + p.failed
        return {
            "progress": p,
            "percent_done": round(100 * done / p.total) if p.total else 0,
            "percent_failed": round(100 * p.failed / p.total) if p.total else 0,
            "members": rows,
            "members_more": p.total > len(rows),
            "members_url": reverse("admin:jobguard_job_changelist") + f"?workflow_id={obj.pk}",
            "callbacks_run": list(
                WorkflowCallback.objects.using(alias).filter(workflow_id=obj.pk).order_by("pk")
            ),
            "callbacks_declared": sorted(obj.callbacks),
            "can_cancel": can_cancel(request) and obj.state != WorkflowState.FINISHED,
            "can_retry": can_retry(request) and p.failed > 0,
        }

    def _object(self, request: HttpRequest, object_id: str) -> Workflow:
        obj: Workflow | None = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(f"No workflow {object_id!r}.")
        return obj

    def _form_page(
        self, request: HttpRequest, obj: Workflow, title: str, form: ReasonForm, **extra: Any
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "original": obj,
            "progress": progress(obj.pk, using=get_settings().database_alias),
            "form": form,
            **extra,
        }
        return TemplateResponse(request, "django_jobguard/admin/workflow/action.html", context)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Confirm with a reason, then cancel the workflow's queued and waiting members."""
        # The permission first: a 404 would tell someone without it which workflows exist.
        if not can_cancel(request):
            return refusal(request, self, "Cancel a workflow", self._needs_perm(request, "cancel workflows"))
        obj = self._object(request, object_id)
        form = ReasonForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            reason = f"by {request.user.get_username()} in the admin: {form.cleaned_data['reason']}"
            result = workflows.cancel(obj.pk, reason=reason)
            alias = get_settings().database_alias
            log_to_history(
                request,
                Workflow,
                [obj.pk],
                f"Cancelled in the admin: {form.cleaned_data['reason']}",
                using=alias,
            )
            log_to_history(
                request,
                Job,
                result.cancelled,
                "Cancelled with its workflow in the admin.",
                using=alias,
                selection=f"the members of workflow #{obj.pk}",
            )
            self.message_user(
                request,
                f"{len(result.cancelled)} members cancelled; {len(result.asked_to_stop)} running members "
                "asked to stop (their handlers see it at the next heartbeat)"
                + ("; the open batch is closed." if result.closed else "."),
                done_level(len(result.cancelled) + len(result.asked_to_stop) + result.closed),
            )
            return HttpResponseRedirect(reverse("admin:jobguard_workflow_change", args=[obj.pk]))
        return self._form_page(request, obj, f"Cancel {obj}", form, action="cancel")

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Confirm with a reason, then re-queue cancelled members and request replays of dead ones."""
        if not can_retry(request):
            return refusal(
                request,
                self,
                "Retry a workflow's failed members",
                f"{request.user.get_username()} may not retry failed members: that needs the "
                f"{workflows.RETRY_PERMISSION} permission (cancelled members) or the "
                f"{workflows.REPLAY_PERMISSION} permission (dead members, replayed once another user "
                "approves).",
            )
        obj = self._object(request, object_id)
        form = ReasonForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            result = workflows.retry_failed(obj.pk, request.user, form.cleaned_data["reason"])
            alias = get_settings().database_alias
            log_to_history(
                request,
                Job,
                result.requeued,
                "Re-queued with its workflow's failed members.",
                using=alias,
                selection=f"the failed members of workflow #{obj.pk}",
            )
            log_to_history(
                request,
                Workflow,
                [obj.pk],
                f"Failed members retried in the admin: {form.cleaned_data['reason']}",
                using=alias,
            )
            self.message_user(
                request,
                f"{len(result.requeued)} cancelled members queued again; "
                f"{len(result.replays_requested)} replays of dead members requested: "
                "each runs once another user approves it in the dead letters.",
                done_level(len(result.requeued) + len(result.replays_requested)),
            )
            if result.awaiting_approval:
                self.message_user(
                    request,
                    f"{len(result.awaiting_approval)} dead members' replays were requested before and await "
                    "approval (or a worker's redrive).",
                    messages.INFO,
                )
            for job_id, why in result.refused[:20]:
                self.message_user(request, f"Job #{job_id} left alone: {why}", messages.WARNING)
            if len(result.refused) > 20:
                self.message_user(
                    request, f"{len(result.refused) - 20} more members left alone.", messages.WARNING
                )
            return HttpResponseRedirect(reverse("admin:jobguard_workflow_change", args=[obj.pk]))
        return self._form_page(
            request,
            obj,
            f"Retry the failed members of {obj}",
            form,
            action="retry",
            may_requeue=request.user.has_perm(workflows.RETRY_PERMISSION),
            may_request=request.user.has_perm(workflows.REPLAY_PERMISSION),
        )

    def _needs_perm(self, request: HttpRequest, what: str) -> str:
        who = request.user.get_username()
        return f"{who} may not {what}: that needs the {workflows.CANCEL_PERMISSION} permission."

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        queryset: QuerySet[Workflow] = super().get_queryset(request)
        # The progress column's sums, in the list's own query: a subquery per column, run for
        # the rows of the page only (a join and GROUP BY would add up every workflow's rows).
        shards = WorkflowCounter.objects.filter(workflow_id=OuterRef("pk")).order_by().values("workflow_id")
        return queryset.annotate(
            **{
                f"{field}_sum": Subquery(shards.annotate(n=Sum(field)).values("n")[:1])
                for field in ("succeeded", "failed", "pending")
            }
        )
