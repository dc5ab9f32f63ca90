"""Admin for jobs and idempotency keys: read-only, payloads only with ``jobguard.view_payload``.

Deleting is allowed only for the rows :mod:`django_jobguard.maintenance.retention` says may go.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR, ChangeList
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..conf import get_settings
from ..encryption.payloads import (
    ARGS,
    CHECKPOINTS,
    ERROR,
    KWARGS,
    RESULT,
    readable_json,
    readable_progress,
    readable_text,
)
from ..maintenance import retention
from ..models import TERMINAL_STATUSES, IdempotencyKey, Job, JobQuerySet, JobStatus
from ..operations import jobs
from ..registry import registry
from . import timeline
from .base import (
    Deletion,
    ReadOnlyAdmin,
    admin_link,
    can_view_payload,
    done_level,
    format_time,
    log_to_history,
    pretty_json,
    refusal,
)


def _amount(value: Any) -> float | None:
    """A stored progress number, or None for anything else (the row may be written by hand)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def job_progress_html(progress: Any) -> SafeString | str:
    """A job's reported progress: a bar and ``done / total (percent)``, or ``done`` with no total.

    The message is left out: a handler's words may echo its payload (the job's page shows
    it apart, with the permission). ``-`` when the job reported nothing.
    """
    if not isinstance(progress, dict) or (done := _amount(progress.get("done"))) is None:
        return "-"
    total = _amount(progress.get("total"))
    reported = _reported_at(progress.get("at"))
    if total is None or total <= 0:
        return format_html(
            '<span class="jobguard-progress" title="{}">{} {}</span>', reported, _number(done), _("done")
        )
    percent = f"{min(100.0, 100 * done / total):.0f}"
    return format_html(
        '<span class="jobguard-progress" title="{}">'
        '<progress value="{}" max="{}">{}%</progress> {} / {} ({}%)</span>',
        reported,
        done,
        total,
        percent,
        _number(done),
        _number(total),
        percent,
    )


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.6g}"


def _reported_at(value: Any) -> str:
    try:
        when = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:
        return ""
    if when is None or timezone.is_naive(when):
        return ""
    return str(_("reported %(time)s") % {"time": format_time(when)})


#: The job list counts the jobs that match up to this many; past it, it says "more than".
COUNT_CAP = 10_000

#: Characters of the last error shown in the job list (the whole message is on the job's page).
ERROR_PREVIEW_CHARS = 70

#: What an operator asks of a job, in the order of the filter; the badge shows the same words.
#: Every status has a state here (``job_state`` returns the status itself for the others).
STATES: tuple[tuple[str, Any], ...] = (
    (JobStatus.WAITING, _("waiting for dependencies")),
    ("due", _("due")),
    ("scheduled", _("scheduled")),
    ("retrying", _("waiting for retry")),
    (JobStatus.RUNNING, _("running")),
    ("stuck", _("lease expired (stuck)")),
    (JobStatus.SUCCEEDED, _("succeeded")),
    (JobStatus.DEAD, _("dead")),
    (JobStatus.CANCELLED, _("cancelled")),
)
_STATE_LABELS = dict(STATES)
#: Badge colours, one per state, each under :data:`BADGE_TEXT` at a contrast of at least 4.5:1
#: (WCAG AA; tests/unit/test_badge_contrast.py checks both): a state that needs a look is red,
#: purple or amber.
_BADGE_COLOURS = {
    JobStatus.WAITING: "#6b6b6b",
    "due": "#417690",
    "scheduled": "#3949ab",
    "retrying": "#8a5300",
    JobStatus.RUNNING: "#00695c",
    "stuck": "#6a1b9a",
    JobStatus.SUCCEEDED: "#2e7d32",
    JobStatus.DEAD: "#ba2121",
    JobStatus.CANCELLED: "#795548",
}
#: The text of every badge.
BADGE_TEXT = "#ffffff"
#: The *cancel requested* badge beside a running job's state.
CANCEL_REQUESTED_COLOUR = "#ad1457"


def job_state(job: Job, now: Any = None) -> str:
    """The operator's state of ``job`` (a key of :data:`STATES`), on this process's clock."""
    now = now or timezone.now()
    if job.status == JobStatus.QUEUED:
        if job.run_after is None or job.run_after <= now:
            return "due"
        return "retrying" if job.first_failed_at is not None else "scheduled"
    if job.status == JobStatus.RUNNING:
        return (
            "stuck"
            if job.lease_expires_at is not None and job.lease_expires_at < now
            else JobStatus.RUNNING.value
        )
    return str(job.status)


class CappedCountPaginator(Paginator):
    """Counts at most :data:`COUNT_CAP` + 1 rows: ``show_full_result_count = False`` spares the
    count of the whole table, but Django still counts what the filters match, which with no
    filter is every row (a scan of a million)."""

    @cached_property
    def count(self) -> int:
        sliced: Any = self.object_list[: COUNT_CAP + 1]
        return int(sliced.count())

    @property
    def capped(self) -> bool:
        return self.count > COUNT_CAP

    @property
    def cap_text(self) -> str:
        return f"{COUNT_CAP:,}"


class JobChangeList(ChangeList):
    """The job list, with a link to the jobs older than the page when the count is capped."""

    #: Set by the filters when *Show counts* counted among the newest jobs only (past the cap).
    facets_capped = False

    @property
    def older_url(self) -> str:
        """The list from the oldest job on this page on (keyset): the count cap cannot hide any row.

        Only in the default newest-first order, where "older" means a smaller id; empty otherwise.
        """
        if ORDER_VAR in self.params or not self.result_list:
            return ""
        oldest = min(job.pk for job in self.result_list)
        return self.get_query_string({"id__lt": oldest}, [PAGE_VAR])


class _CappedFacetsFilter(admin.SimpleListFilter):
    """*Show counts* over at most :data:`COUNT_CAP` + 1 jobs, like the list's own count.

    Django counts each option over every job the other filters match: one scan of the whole
    table per filter on each page load (seconds at 84,000 jobs, growing with the rows). Here a
    filter costs two queries bounded like the paginator's count: the id of the
    (:data:`COUNT_CAP` + 1)-th newest job the other filters match, then one count of each option
    over the jobs newer than it. Below the cap the counts are exact; past it they are counts
    among the newest jobs, shown as "N+" (at least N), and ``changelist.facets_capped`` is set
    so the page says so.
    """

    def _sample(self, changelist: Any) -> tuple[QuerySet[Job], bool]:
        """The jobs the other filters match, at most the newest COUNT_CAP + 1; and whether capped."""
        matched = changelist.get_queryset(self.request, exclude_parameters=self.expected_parameters())
        boundary = list(matched.order_by("-pk").values_list("pk", flat=True)[COUNT_CAP : COUNT_CAP + 1])
        return (matched.filter(pk__gt=boundary[0]), True) if boundary else (matched, False)

    @staticmethod
    def _shown(found: dict[str, int], capped: bool, changelist: Any) -> dict[str, Any]:
        if not capped:
            return found
        changelist.facets_capped = True
        return {key: f"{count:,}+" for key, count in found.items()}

    def get_facet_queryset(self, changelist: Any) -> dict[str, Any]:
        sample, capped = self._sample(changelist)
        counts: dict[str, Any] = {}
        name = str(self.parameter_name)
        chosen = self.used_parameters.get(name)
        try:
            for i, (value, _label) in enumerate(self.lookup_choices):
                self.used_parameters[name] = value
                option = self.queryset(self.request, sample)
                if option is not None:
                    counts[f"{i}__c"] = Count("pk", filter=Q(pk__in=option.order_by().values("pk")))
        finally:
            if chosen is None:
                self.used_parameters.pop(name, None)
            else:
                self.used_parameters[name] = chosen
        found = sample.order_by().aggregate(**counts) if counts else {}
        return self._shown(found, capped, changelist)


class _NamedFilter(_CappedFacetsFilter):
    """An exact filter on a name field whose choices come from the configuration, not a
    ``SELECT DISTINCT`` over every row (a full scan at a million jobs)."""

    def names(self) -> list[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(name, name) for name in self.names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset.filter(**{str(self.parameter_name): value}) if value else queryset

    def get_facet_queryset(self, changelist: Any) -> dict[str, Any]:
        # One GROUP BY over the sample: a count per option would read it once per name (a
        # hundred tasks, a hundred reads).
        sample, capped = self._sample(changelist)
        field = str(self.parameter_name)
        per_name = dict(sample.order_by().values_list(field).annotate(n=Count("pk")).values_list(field, "n"))
        found = {f"{i}__c": per_name.get(value, 0) for i, (value, _label) in enumerate(self.lookup_choices)}
        return self._shown(found, capped, changelist)


class QueueFilter(_NamedFilter):
    title = _("queue")
    parameter_name = "queue_name"

    def names(self) -> list[str]:
        conf = get_settings()
        tasks = (registry.find(name) for name in registry.names())
        return sorted(
            {
                *conf.queues,
                conf.default_queue,
                *(task.queue_name or conf.default_queue for task in tasks if task),
            }
        )


class TaskFilter(_NamedFilter):
    title = _("task")
    parameter_name = "task_name"

    def names(self) -> list[str]:
        return sorted(registry.names())


class StateFilter(_CappedFacetsFilter):
    """The states of :data:`STATES`, decided by the database clock (as the worker decides them)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(STATES)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        jobs: JobQuerySet = queryset  # type: ignore[assignment]
        value = self.value()
        if value == "due":
            return jobs.due()
        if value == "scheduled":
            return jobs.scheduled()  # retries included: they are scheduled too
        if value == "retrying":
            return jobs.waiting_for_retry()
        if value == JobStatus.WAITING:
            return jobs.filter(status=JobStatus.WAITING)
        if value == JobStatus.RUNNING:
            return jobs.leased()
        if value == "stuck":
            return jobs.expired_leases()
        if value in TERMINAL_STATUSES:
            return jobs.filter(status=value)
        return queryset


class EnqueuedFilter(_CappedFacetsFilter):
    """Jobs enqueued in a recent window, by the database clock (which wrote ``enqueued_at``).

    Instead of a date hierarchy: its year, month and day lists are a ``SELECT DISTINCT`` over
    every row on each page load. A window is a range on ``jobguard_job_enqueued_idx``.
    """

    title = _("enqueued")
    parameter_name = "enqueued"
    #: (value, label, seconds back).
    WINDOWS: tuple[tuple[str, Any, int], ...] = (
        ("15m", _("in the last 15 minutes"), 15 * 60),
        ("1h", _("in the last hour"), 3600),
        ("24h", _("in the last 24 hours"), 24 * 3600),
        ("7d", _("in the last 7 days"), 7 * 24 * 3600),
    )

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(value, label) for value, label, _seconds in self.WINDOWS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        for value, _label, seconds in self.WINDOWS:
            if self.value() == value:
                return queryset.filter(enqueued_at__gte=Now() - datetime.timedelta(seconds=seconds))
        return queryset


_PAYLOAD = (_("Payload"), {"fields": ["args_json", "kwargs_json", "result_json", "checkpoints_json"]})


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    # Fits a 1,366 px laptop screen with the admin's side bar closed; the job's page has the rest.
    list_display = [
        "id",
        "state_badge",
        "task_short",
        "queue_name",
        "attempts_of",
        "worker_short",
        "started_at",
        "lease_expires_at",
        "error_preview",
    ]
    list_display_links = ["id", "task_short"]
    change_list_template = "django_jobguard/admin/job/change_list.html"
    change_form_template = "django_jobguard/admin/job/change_form.html"
    list_filter = [StateFilter, QueueFilter, TaskFilter, EnqueuedFilter]
    search_fields = ["id", "lock_key"]
    payload_search_fields = ["idempotency_key"]
    search_whole_values = True
    search_help_text = _("Job ids, lock keys or idempotency keys, whole (the task: the filter on the right).")
    payload_derived_fields = [
        "idempotency_key",
        "last_error",
        "last_error_text",
        "error_preview",
        "progress_message",
    ]
    # The lock admin links to the running jobs holding a lock key.
    # The workers page links to a worker's jobs.
    # A workflow's page links to all its members.
    extra_lookups = ["lock_key", "idempotency_key", "status__exact", "worker_id", "id__lt", "workflow_id"]
    deletion = Deletion(retention.deletable_jobs, retention.delete_jobs, retention.JOB_DELETION_RULE)
    ordering = ["-id"]
    show_full_result_count = False  # a count(*) over millions of finished rows is slow
    paginator = CappedCountPaginator

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    actions = ["retry_jobs_now", "cancel_jobs", "requeue_cancelled_jobs"]
    readonly_fields = [
        "state_badge",
        "args_json",
        "kwargs_json",
        "result_json",
        "checkpoints_json",
        "dead_letter_link",
        "replayed_from_link",
        "run_time",
        "progress_bar",
        "progress_message",
        "last_error_text",
    ]

    def __init__(self, model: type[Job], admin_site: admin.AdminSite) -> None:
        super().__init__(model, admin_site)
        # Shown as the start of the last attempt: a claim handed back charges no attempt.
        self._times["started_at"] = "attempt_started_at"

    @admin.display(description=_("started at"), ordering="started_at")
    def attempt_started_at(self, obj: Job) -> SafeString | str:
        """``started_at``, or ``-`` when no attempt counts.

        The claim sets ``started_at``; a claim handed back without an attempt (the job's lock
        was held elsewhere, the worker was stopping) takes the attempt back but not the time,
        which would show a start beside 0 attempts.
        """
        if obj.attempts == 0:
            if obj.started_at is None:
                # The store gives a refunded claim's start back (none, before a first attempt).
                if not obj.lock_contentions:
                    return "-"
                return format_html(
                    '<span title="{}">-</span>',
                    _("Claimed and handed back without an attempt: its lock was held by another job."),
                )
            why = (
                _("Claimed at %(time)s and handed back without an attempt: its lock was held by another job.")
                if obj.lock_contentions
                else _("Claimed at %(time)s and handed back without an attempt.")
            )
            return format_html('<span title="{}">-</span>', why % {"time": format_time(obj.started_at)})
        return format_time(obj.started_at)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and str(match.url_name).endswith("_changelist"):
            # The list shows no payload: do not read args, kwargs, results off a million rows.
            queryset = queryset.defer("args", "kwargs", "result", "checkpoints")
        elif match is not None and str(match.url_name).endswith("_change"):
            # The job's page and its timeline read both dead letters in the same query.
            queryset = queryset.select_related("dead_letter", "replayed_from")
        return queryset

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None:
            context["timeline"] = timeline.build(obj, request)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets: list[Any] = [
            (
                None,
                {
                    "fields": [
                        "task_name",
                        "queue_name",
                        "state_badge",  # the status, as the worker reads it (no "Status" beside it)
                        "priority",
                        "attempts",
                        "max_attempts",
                        "run_after",
                        "enqueued_at",
                        "started_at",
                        "finished_at",
                        "run_time",
                        "progress_bar",
                        "progress_message",
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
                        "cancel_requested",
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
                {"fields": ["first_failed_at", "last_error_text", "dead_letter_link", "replayed_from_link"]},
            ),
        ]
        if can_view_payload(request):
            fieldsets.insert(1, _PAYLOAD)
        return self.visible_fieldsets(request, fieldsets)

    @admin.display(description=_("state"), ordering="status")
    def state_badge(self, obj: Job) -> SafeString:
        state = job_state(obj)
        badge = format_html(
            '<span class="jobguard-badge state-{}" style="background:{};color:{};padding:1px 6px;'
            'border-radius:8px;white-space:nowrap">{}</span>',
            state,
            _BADGE_COLOURS[state],
            BADGE_TEXT,
            _STATE_LABELS[state],
        )
        if obj.cancel_requested and obj.status == JobStatus.RUNNING:
            # Asked to stop, still running: the handler sees it at its next heartbeat.
            return format_html(
                # Filled like the state's badge: a coloured outline on the page's background
                # would depend on the admin's theme for its contrast.
                '{} <span class="jobguard-badge cancel-requested" title="{}" style="background:{};'
                'color:{};padding:1px 6px;border-radius:8px;white-space:nowrap">{}</span>',
                badge,
                _("An operator asked this job to stop; its handler sees it at the next heartbeat."),
                CANCEL_REQUESTED_COLOUR,
                BADGE_TEXT,
                _("cancel requested"),
            )
        return badge

    @admin.display(description=_("task"), ordering="task_name")
    def task_short(self, obj: Job) -> SafeString:
        return format_html('<span title="{}">{}</span>', obj.task_name, obj.task_name.rsplit(".", 1)[-1])

    @admin.display(description=_("attempts"), ordering="attempts")
    def attempts_of(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description=_("worker"), ordering="worker_id")
    def worker_short(self, obj: Job) -> SafeString | str:
        if not obj.worker_id:
            return "-"
        return format_html('<span title="{}">{}</span>', obj.worker_id, Truncator(obj.worker_id).chars(24))

    # Payload fields, shown only with jobguard.view_payload (payload_derived_fields, _PAYLOAD):
    # each is opened here if it is stored encrypted.

    @admin.display(description=_("last error"))
    def error_preview(self, obj: Job) -> SafeString | str:
        text = readable_text(obj.last_error, ERROR, "job.last_error")
        if not text:
            return "-"
        first_line = text.strip().splitlines()[0] if text.strip() else text
        return format_html(
            '<span title="{}">{}</span>',
            Truncator(text).chars(500),
            Truncator(first_line).chars(ERROR_PREVIEW_CHARS),
        )

    @admin.display(description=_("last error"))
    def last_error_text(self, obj: Job) -> str:
        return readable_text(obj.last_error, ERROR, "job.last_error") or "-"

    @admin.display(description=_("args"))
    def args_json(self, obj: Job) -> SafeString:
        return pretty_json(readable_json(obj.args, ARGS, "job.args"))

    @admin.display(description=_("kwargs"))
    def kwargs_json(self, obj: Job) -> SafeString:
        return pretty_json(readable_json(obj.kwargs, KWARGS, "job.kwargs"))

    @admin.display(description=_("result"))
    def result_json(self, obj: Job) -> SafeString:
        return pretty_json(readable_json(obj.result, RESULT, "job.result"))

    @admin.display(description=_("checkpoints"))
    def checkpoints_json(self, obj: Job) -> SafeString:
        return pretty_json(readable_json(obj.checkpoints, CHECKPOINTS, "job.checkpoints"))

    @admin.display(description=_("progress"))
    def progress_bar(self, obj: Job) -> SafeString | str:
        """What the handler last reported (``context.report_progress``), when it reported."""
        return job_progress_html(obj.progress)

    @admin.display(description=_("progress message"))
    def progress_message(self, obj: Job) -> str:
        progress = readable_progress(obj.progress)
        message = progress.get("message") if isinstance(progress, dict) else None
        return message if isinstance(message, str) and message else "-"

    @admin.display(description=_("run time"))
    def run_time(self, obj: Job) -> str:
        """Claim to finish of the last attempt, beside the task's ``expected_duration``."""

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

    @admin.action(
        description=_("Cancel selected jobs (queued or stuck: at once; running: ask the handler)"),
        permissions=["cancel"],
    )
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> TemplateResponse | None:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        if request.POST.get("confirm") != "yes":
            return self._confirm_cancel(request, queryset)
        ids = list(queryset.values_list("pk", flat=True))
        reason = f"by {request.user.get_username()} in the admin"
        cancelled = jobs.cancel(ids, reason=reason)
        asked = jobs.request_cancel(sorted(set(ids) - set(cancelled)), reason=reason)
        skipped = len(ids) - len(cancelled) - len(asked)
        alias = get_settings().database_alias
        log_to_history(request, Job, cancelled, "Cancelled in the admin.", using=alias)
        log_to_history(request, Job, asked, "Asked to stop (cancel requested) in the admin.", using=alias)
        if cancelled or not asked:
            self.message_user(
                request,
                ngettext("%(count)d job cancelled.", "%(count)d jobs cancelled.", len(cancelled))
                % {"count": len(cancelled)},
                done_level(len(cancelled)),
            )
        if asked:
            self.message_user(
                request,
                ngettext(
                    "%(count)d running job was asked to stop: its handler sees context.cancel_requested "
                    "at the next heartbeat; nothing is killed.",
                    "%(count)d running jobs were asked to stop: their handlers see "
                    "context.cancel_requested at the next heartbeat; nothing is killed.",
                    len(asked),
                )
                % {"count": len(asked)},
                messages.INFO,
            )
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "%(count)d job was finished or already asked to stop and was left alone.",
                    "%(count)d jobs were finished or already asked to stop and were left alone.",
                    skipped,
                )
                % {"count": skipped},
                messages.WARNING,
            )
        return None

    def _confirm_cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> TemplateResponse:
        """Say how many jobs a cancel would touch before it does ("Select all" carries the filter)."""
        across = request.POST.get("select_across") == "1"
        by_status = dict(
            queryset.order_by().values_list("status").annotate(n=Count("pk")).values_list("status", "n")
        )
        first = queryset.order_by("pk").values_list("pk", flat=True).first()
        # A stuck job (lease expired) is cancelled outright: no heartbeat would carry a request.
        stuck = (
            queryset.filter(status=JobStatus.RUNNING, lease_expires_at__lt=Now()).count()
            if by_status.get(JobStatus.RUNNING)
            else 0
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Cancel jobs"),
            "stuck": stuck,
            "count": sum(by_status.values()),
            # A cancel takes waiting workflow steps at once, as it takes queued jobs.
            "queued": by_status.get(JobStatus.QUEUED, 0) + by_status.get(JobStatus.WAITING, 0),
            "running": by_status.get(JobStatus.RUNNING, 0) - stuck,
            "select_across": across,
            # With "Select all" the admin still wants one selected row to take the action.
            "selected_ids": ([first] if first is not None else [])
            if across
            else list(queryset.values_list("pk", flat=True)),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "django_jobguard/admin/job/cancel_confirm.html", context)

    def _confirm_requeue(self, request: HttpRequest, queryset: QuerySet[Job]) -> TemplateResponse:
        """Say how many cancelled jobs a re-queue would run again before it does, as cancel does."""
        context = self._selection_context(request, queryset)
        cancelled = context["by_status"].get(JobStatus.CANCELLED, 0)
        context.update(
            title=_("Re-queue cancelled jobs"),
            cancelled=cancelled,
            others=context["count"] - cancelled,
        )
        return TemplateResponse(request, "django_jobguard/admin/job/requeue_confirm.html", context)

    def _selection_context(self, request: HttpRequest, queryset: QuerySet[Job]) -> dict[str, Any]:
        """A confirmation page's selection: counts by status, and what to post back.

        "Select all" goes back as the change list's filter (``select_across``) with one row
        to take the action, never one field per row: it may reach tens of thousands of jobs.
        """
        across = request.POST.get("select_across") == "1"
        by_status = dict(
            queryset.order_by().values_list("status").annotate(n=Count("pk")).values_list("status", "n")
        )
        first = queryset.order_by("pk").values_list("pk", flat=True).first()
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "by_status": by_status,
            "count": sum(by_status.values()),
            "select_across": across,
            "selected_ids": ([first] if first is not None else [])
            if across
            else list(queryset.values_list("pk", flat=True)),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }

    @admin.action(description=_("Re-queue selected cancelled jobs (due now)"), permissions=["retry"])
    def requeue_cancelled_jobs(
        self, request: HttpRequest, queryset: QuerySet[Job]
    ) -> TemplateResponse | None:
        if not self.has_retry_permission(request):
            raise PermissionDenied
        if request.POST.get("confirm") != "yes":
            return self._confirm_requeue(request, queryset)
        ids = list(queryset.values_list("pk", flat=True))
        requeued = jobs.requeue_cancelled(ids, reason=f"by {request.user.get_username()} in the admin")
        log_to_history(
            request,
            Job,
            requeued,
            "Re-queued after a cancel in the admin.",
            using=get_settings().database_alias,
        )
        self.message_user(
            request,
            ngettext(
                "%(count)d cancelled job is queued again.",
                "%(count)d cancelled jobs are queued again.",
                len(requeued),
            )
            % {"count": len(requeued)},
            done_level(len(requeued)),
        )
        left = len(ids) - len(requeued)
        if left:
            self.message_user(
                request,
                ngettext(
                    "%(count)d job was left alone: not cancelled, or its idempotency key belongs to "
                    "another job now (running it could repeat that action).",
                    "%(count)d jobs were left alone: not cancelled, or their idempotency keys belong to "
                    "other jobs now (running them could repeat those actions).",
                    left,
                )
                % {"count": left},
                messages.WARNING,
            )
        return None

    @admin.action(description=_("Retry selected waiting jobs now"), permissions=["retry"])
    def retry_jobs_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        if not self.has_retry_permission(request):
            raise PermissionDenied
        ids = list(queryset.values_list("pk", flat=True))
        made_due = jobs.retry_now(ids, reason=f"by {request.user.get_username()} in the admin")
        log_to_history(
            request, Job, made_due, "Made due now in the admin.", using=get_settings().database_alias
        )
        self.message_user(
            request,
            ngettext("%(count)d job is due now.", "%(count)d jobs are due now.", len(made_due))
            % {"count": len(made_due)},
            done_level(len(made_due)),
        )
        if len(ids) > len(made_due):
            self.message_user(
                request,
                ngettext(
                    "%(count)d job was not waiting (already due, running or finished) and was left alone.",
                    "%(count)d jobs were not waiting (already due, running or finished) and were left alone.",
                    len(ids) - len(made_due),
                )
                % {"count": len(ids) - len(made_due)},
                messages.WARNING,
            )

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobguard.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobguard.cancel_job")


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = ["key", "scope", "status", "duplicates", "job", "created_at", "expires_at"]
    list_filter = ["status", "scope"]
    search_fields = ()
    payload_search_fields = ["key"]
    search_whole_values = True
    search_help_text = _("Keys, whole.")
    show_full_result_count = False  # a count(*) over every key ever written
    raw_id_fields = ["job"]
    # The job column renders each row's job: one join, not a query per row.
    list_select_related = ["job"]
    readonly_fields = ["result_json"]
    deletion = Deletion(retention.deletable_keys, retention.delete_keys, retention.KEY_DELETION_RULE)

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        shown = super().get_list_display(request)
        # A key is rendered from the call's arguments (charge:order:42): it is payload.
        return shown if can_view_payload(request) else ["withheld_key" if f == "key" else f for f in shown]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        if not can_view_payload(request):
            # The page is titled with its key.
            why = (
                f"{request.user.get_username()} may not open an idempotency key's page: a key is made "
                "of the call's arguments, which needs the jobguard.view_payload permission."
            )
            return refusal(request, self, str(_("Idempotency key")), why)
        return super().change_view(request, object_id, form_url, extra_context)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["key", "scope", "fingerprint", "status", "job", "duplicates"]
        fields += ["created_at", "updated_at", "expires_at"]
        if can_view_payload(request):
            fields.append("result_json")
        return self.with_times_in_fieldsets([(None, {"fields": fields})])

    @admin.display(description=_("key"))
    def withheld_key(self, obj: IdempotencyKey) -> str:
        return str(_("key #%(pk)s (hidden: needs the view payload permission)") % {"pk": obj.pk})

    @admin.display(description=_("stored result"))
    def result_json(self, obj: IdempotencyKey) -> SafeString:
        return pretty_json(readable_json(obj.result, RESULT, "idempotency_key.result"))
