"""The flow-control page (the "Circuit breakers" entry of the admin): limits, waiting keys, breakers.

The page is the change list of :class:`~django_jobguard.models.Breaker`, so it is linked from
the admin index. It shows each declared limit with its current use, the limit keys with the
most jobs waiting, and each breaker and retry budget with an open / close form; the forms
call :mod:`django_jobguard.breakers`, which checks ``jobguard.operate_breaker`` again
whatever the page showed. Every change is in the audit trail (:class:`BreakerEventAdmin`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _

from .. import breakers, flow
from ..conf import get_settings
from ..exceptions import BreakerError, BreakerPermissionDenied
from ..models import Breaker, BreakerEvent
from ..monitoring import stats
from ..registry import registry
from .base import OperatorPageAdmin, ReadOnlyAdmin, can_view_payload, format_time, refusal, refuse_nul

#: Limit keys listed by the jobs waiting on them, most first.
WAITING_KEYS_SHOWN = 20
#: Breaker changes listed under the table.
RECENT_EVENTS = 10


def shown_waiting_keys(request: HttpRequest, keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """``keys`` as this user may see them: a keyed limit's key is rendered from the job's
    arguments (``c:<task>|account:42``), so without ``jobguard.view_payload`` it shows as its
    limit and template, as the job pages hide the arguments. Unkeyed limits are names."""
    if can_view_payload(request):
        return keys
    plan = registry.flow_plan()
    templates = plan.templates if plan is not None else {}
    shown = []
    for key, count in keys:
        family = flow.family(key)
        if family != key:
            kind = _("concurrency") if family.startswith("c:") else _("rate")
            key = str(
                _("%(task)s[%(template)s] %(kind)s: a key (hidden: needs the view payload permission)")
            ) % {
                "task": family[2:],
                "template": templates.get(family, ""),
                "kind": kind,
            }
        shown.append((key, count))
    return shown


@admin.register(Breaker)
class FlowControlAdmin(OperatorPageAdmin):
    """Every flow-control limit's use, the keys jobs wait on, and the circuit breakers."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may read jobs may read what holds them back.
        user = request.user
        return bool(
            user.has_perm("jobguard.view_breaker")
            or user.has_perm("jobguard.view_job")
            or breakers.can_operate(user)
        )

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap = self.admin_site.admin_view
        return [
            path("open/", wrap(self.open_view), name="{}_{}_open".format(*info)),
            path("close/", wrap(self.close_view), name="{}_{}_close".format(*info)),
            *super().get_urls()[:1],  # the change list only: a breaker has no change form
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        refuse_nul(request)
        if not self.has_view_permission(request):
            return refusal(
                request,
                self,
                str(_("Circuit breakers")),
                "Viewing flow control needs the jobguard.view_job permission.",
            )
        alias = get_settings().database_alias
        events = list(BreakerEvent.objects.using(alias).order_by("-created_at", "-id")[:RECENT_EVENTS])
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Flow control"),
            "limits": stats.limit_stats(alias),
            "waiting_keys": shown_waiting_keys(request, stats.waiting_keys(alias, WAITING_KEYS_SHOWN)),
            "breakers": [(row, format_time(row.changed_at)) for row in stats.breaker_stats(alias)],
            "events": [(event, format_time(event.created_at)) for event in events],
            "can_operate": breakers.can_operate(request.user),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "django_jobguard/admin/flow_control.html", context)

    def open_view(self, request: HttpRequest) -> HttpResponse:
        return self._change(request, breakers.open_breaker, "Open", "opened")

    def close_view(self, request: HttpRequest) -> HttpResponse:
        return self._change(request, breakers.close, "Close", "closed")

    def _change(self, request: HttpRequest, change: Any, title: str, verb: str) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        name = request.POST.get("limit", "")
        reason = request.POST.get("reason", "")
        try:
            result = change(name, user=request.user, reason=reason)
        except BreakerPermissionDenied as exc:
            return refusal(request, self, f"{title} breaker {name}", str(exc))
        except BreakerError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        else:
            if result.changed:
                row = Breaker.objects.using(get_settings().database_alias).filter(pk=name).first()
                if row is not None:
                    self.log_change(request, row, f"{title}ed by hand: {reason}" if reason else f"{title}ed.")
                self.message_user(request, f"Breaker {name!r} {verb}.", messages.SUCCESS)
            else:
                self.message_user(request, f"Breaker {name!r} was already {verb}.", messages.WARNING)
        return HttpResponseRedirect(reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist"))


@admin.register(BreakerEvent)
class BreakerEventAdmin(ReadOnlyAdmin):
    """The audit trail of breaker changes: by the fleet (``system``) and by operators."""

    list_display = ["created_at", "name", "from_state", "to_state", "actor_name", "reason"]
    list_filter = ["to_state", "name"]
    search_fields = ["name", "actor_name", "reason"]
    show_full_result_count = False
