"""The queue health page (the "Queues" entry of the admin) with pause and resume, and the audit trail.

The page is the change list of :class:`~django_jobguard.models.QueueState`, so it is
linked from the admin index and the app index of whichever admin site registers it. Its
figures come from :func:`django_jobguard.monitoring.health.queue_health` (a fixed number of indexed
queries); pause and resume call :mod:`django_jobguard.operations.queues`, which checks
``jobguard.pause_queue`` again whatever the page showed.
"""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..exceptions import QueueError, QueuePermissionDenied
from ..models import QueueEvent, QueueState
from ..monitoring import health
from ..monitoring.stats import RECENT_WINDOW_SECONDS
from ..operations import queues
from .base import OperatorPageAdmin, ReadOnlyAdmin, format_time, refusal, refuse_nul
from .charts import bar_chart

#: Seconds between two reloads of the health page while it is open.
REFRESH_SECONDS = 15
#: The bounds of ``?refresh=N``, the page's reload interval in seconds.
REFRESH_MIN_SECONDS, REFRESH_MAX_SECONDS = 2, 600
#: Pauses and resumes listed under the table.
RECENT_EVENTS = 10


@admin.register(QueueState)
class QueueHealthAdmin(OperatorPageAdmin):
    """Every queue's causes of trouble, depth, age, dead letters and pause state, with last-hour charts.

    The queues in trouble come first (:meth:`~django_jobguard.monitoring.health.Health.triaged`),
    each with its causes in words; every count links to the jobs or dead letters it counts.
    """

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may read jobs may read the queues they make up.
        user = request.user
        return bool(
            user.has_perm("jobguard.view_queuestate")
            or user.has_perm("jobguard.view_job")
            or queues.can_pause(user)
        )

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("pause/", wrap(self.pause_view), name="{}_{}_pause".format(*info)),
            path("resume/", wrap(self.resume_view), name="{}_{}_resume".format(*info)),
            *super().get_urls()[:1],  # the change list only: a queue has no change form
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        refuse_nul(request)
        if not self.has_view_permission(request):
            return refusal(
                request,
                self,
                str(_("Queues")),
                "Viewing queue health needs the jobguard.view_job permission.",
            )
        alias = get_settings().database_alias
        wanted = request.GET.get("queue") or None
        report = health.queue_health(alias, queue=wanted)
        events = list(QueueEvent.objects.using(alias).order_by("-created_at", "-id")[:RECENT_EVENTS])
        hour_ago = (report.generated_at - datetime.timedelta(seconds=RECENT_WINDOW_SECONDS)).isoformat(
            timespec="seconds"
        )
        rows = []
        for stats in report.triaged():
            name = stats.queue
            pause = report.pauses.get(name)
            causes = report.causes.get(name, [])
            jobs = {"queue_name": name}
            rows.append(
                {
                    "stats": stats,
                    "live_workers": report.live_workers.get(name, 0),
                    "stuck": report.stuck.get(name, 0),
                    "severity": _SEVERITY_CLASS.get(report.severity(name), ""),
                    "causes": [
                        (cause, _cause_url(cause), _SEVERITY_CLASS[cause.severity]) for cause in causes
                    ],
                    "since": format_time(pause.at) if pause else "",
                    "by": pause.by if pause else "",
                    "reason": pause.reason if pause else "",
                    "links": {
                        "depth": _list_url("jobs", {**jobs, "state": "due"}),
                        "scheduled": _list_url("jobs", {**jobs, "state": "scheduled"}),
                        "retrying": _list_url("jobs", {**jobs, "state": "retrying"}),
                        "in_flight": _list_url("jobs", {**jobs, "state": "running"}),
                        "stuck": _list_url("jobs", {**jobs, "state": "stuck"}),
                        "succeeded": _list_url("jobs", {**jobs, "state": "succeeded"}),
                        "failed": _list_url("dead_letters", {**jobs, "created_at__gte": hour_ago}),
                        "dead": _list_url("dead_letters", {**jobs, "replay_state__in": health.UNRESOLVED}),
                        "approvals": _list_url("dead_letters", {**jobs, "replay_state__exact": "requested"}),
                    },
                }
            )
        charts = [
            (title, bar_chart(title, report.minutes, report.series[key], unit=unit, css_class=key))
            for key, title, unit in health.SERIES
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Queue health"),
            "rows": rows,
            "charts": charts,
            "chart_queue": wanted,
            "events": [(event, format_time(event.created_at)) for event in events],
            "generated_at": format_time(report.generated_at),
            "horizon": report.horizon,
            "outbox": [
                {
                    "stats": stats,
                    "severity": _SEVERITY_CLASS.get(
                        max(
                            (c.severity for c in report.outbox_causes.get(stats.destination, [])), default=-1
                        ),
                        "",
                    ),
                    "causes": [
                        (cause, _cause_url(cause), _SEVERITY_CLASS[cause.severity])
                        for cause in report.outbox_causes.get(stats.destination, [])
                    ],
                    "links": {
                        "pending": _list_url(
                            "outbox", {"destination": stats.destination, "state__exact": "pending"}
                        ),
                        "held": _list_url("outbox", {"destination": stats.destination, "holds": "yes"}),
                        "dead": _list_url(
                            "outbox", {"destination": stats.destination, "state__exact": "dead"}
                        ),
                    },
                }
                for stats in report.outbox
            ],
            "refresh_seconds": _refresh_seconds(request),
            "can_pause": queues.can_pause(request.user),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "django_jobguard/admin/queue_health.html", context)

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        return self._change(request, queues.pause, "Pause", "paused")

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._change(request, queues.resume, "Resume", "resumed")

    def _change(self, request: HttpRequest, change: Any, title: str, verb: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        name = request.POST.get("queue", "")
        try:
            result = change(name, user=request.user, reason=request.POST.get("reason", ""))
        except QueuePermissionDenied as exc:
            return refusal(request, self, f"{title} queue {name}", str(exc))
        except QueueError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            if result.changed:
                state = (
                    QueueState.objects.using(get_settings().database_alias).filter(pk=result.queue).first()
                )
                if state is not None:
                    reason = request.POST.get("reason", "")
                    self.log_change(request, state, f"{title}d: {reason}" if reason else f"{title}d.")
                self.message_user(request, f"Queue {result.queue!r} {verb}.", messages.SUCCESS)
            else:
                self.message_user(request, f"Queue {result.queue!r} was already {verb}.", messages.WARNING)
        return HttpResponseRedirect(reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"))


@admin.register(QueueEvent)
class QueueEventAdmin(ReadOnlyAdmin):
    """The audit trail of pauses and resumes."""

    list_display = ["created_at", "queue_name", "action", "actor_name", "reason"]
    list_filter = ["action", "queue_name"]
    search_fields = ["queue_name", "actor_name", "reason"]
    show_full_result_count = False


#: The CSS class of each severity (the row's and each cause's).
_SEVERITY_CLASS = {health.CRITICAL: "critical", health.WARNING: "warning", health.NOTE: "note"}
#: The change list each cause target names.
_LISTS = {
    "jobs": "admin:jobguard_job_changelist",
    "dead_letters": "admin:jobguard_deadletter_changelist",
    "breakers": "admin:jobguard_breaker_changelist",
    "locks": "admin:jobguard_lock_changelist",
    "outbox": "admin:jobguard_outboxmessage_changelist",
}


def _list_url(target: str, params: dict[str, str]) -> str:
    """The change list ``target`` filtered by ``params`` ("" when this admin site has none)."""
    try:
        url = reverse(_LISTS[target])
    except NoReverseMatch:
        return ""
    return f"{url}?{urlencode(params)}" if params else url


def _cause_url(cause: health.Cause) -> str:
    """Where a cause's jobs are listed; a breaker's row is an anchor of the breakers page."""
    anchors = [value for key, value in cause.params if not key]
    url = _list_url(cause.target, {key: value for key, value in cause.params if key})
    return f"{url}#{anchors[0]}" if url and anchors else url


def _refresh_seconds(request: HttpRequest) -> int:
    """The reload interval: ``?refresh=N`` within its bounds, else the default."""
    try:
        wanted = int(request.GET.get("refresh", REFRESH_SECONDS))
    except ValueError:
        return REFRESH_SECONDS
    return min(max(wanted, REFRESH_MIN_SECONDS), REFRESH_MAX_SECONDS)
