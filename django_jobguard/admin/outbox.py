"""The outbox in the admin: messages by destination and state, the keys a dead message holds, replay and skip.

The list is read-only. Its "Holds its key" filter lists the keys held by a dead message (the
message, its key and its error: the held keys of :func:`django_jobguard.outbox.stats.held_keys`).
Replay and skip are bulk actions that ask for a reason and call
:mod:`django_jobguard.outbox.operations`, which holds the rules; both need the
``jobguard.operate_outbox`` permission. Payloads, headers and errors (which can echo the
payload) show only to users with ``jobguard.view_payload``.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..exceptions import OutboxError
from ..models import OutboxMessage, OutboxState
from ..outbox import operations
from ..outbox.stats import holds_its_key
from .base import ReadOnlyAdmin, done_level, log_to_history, pretty_json

__all__ = ["OPERATE_PERMISSION", "OutboxMessageAdmin"]

#: The permission replay and skip need (declared on OutboxMessage).
OPERATE_PERMISSION = "jobguard.operate_outbox"
#: Messages named on the confirmation page (the action applies to every selected one).
LISTED = 50
#: Characters of the error shown in the list.
ERROR_CHARS = 80


class ResolveForm(forms.Form):
    """Why: a replay or a skip records its reason with the message."""

    reason = forms.CharField(
        label=_("Reason"),
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80, "autofocus": True}),
        help_text=_("Kept with each message, for the next person who reads it."),
    )


class HoldsFilter(admin.SimpleListFilter):
    """The dead messages that hold their key: the held keys, each with its blocking message."""

    title = _("holds its key")
    parameter_name = "holds"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("yes: a held key"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(state=OutboxState.DEAD, resolution="").filter(holds_its_key())
        return queryset


class DestinationFilter(admin.SimpleListFilter):
    """The declared destinations (from the settings: no scan of the table for its distinct values)."""

    title = _("destination")
    parameter_name = "destination"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(get_settings().outbox.destinations)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(destination=value) if value else queryset


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    """Outbox messages, newest first; the held keys through "Holds its key"; replay and skip."""

    list_display = [
        "id",
        "destination",
        "key",
        "seq",
        "state",
        "attempts",
        "published_at",
        "delivered_at",
        "error_short",
        "resolution",
    ]
    list_filter = [HoldsFilter, DestinationFilter, "state"]
    # Links from the health page and jobguard_status name a key.
    extra_lookups = ["key"]
    payload_derived_fields = ["error_short", "last_error", "payload_json", "headers_json"]
    ordering = ["-id"]
    show_full_result_count = False
    actions = ["replay_messages", "skip_messages"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "id",
                    "message_id",
                    "destination",
                    "key",
                    "seq",
                    "state",
                    "attempts",
                    "next_attempt_at",
                    "published_at",
                    "delivered_at",
                ]
            },
        ),
        (_("Last error"), {"fields": ["last_error"]}),
        (
            _("Operator's decision"),
            {"fields": ["resolution", "resolved_by", "resolution_reason", "resolved_at"]},
        ),
        (_("Payload"), {"fields": ["payload_json", "headers_json"]}),
    ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [
            *super().get_readonly_fields(request, obj),
            *(field.name for field in OutboxMessage._meta.fields),
            "payload_json",
            "headers_json",
        ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxMessage]:
        return super().get_queryset(request).using(get_settings().outbox_alias)

    @admin.display(description=_("last error"))
    def error_short(self, obj: OutboxMessage) -> str:
        return Truncator(obj.last_error).chars(ERROR_CHARS)

    @admin.display(description=_("payload"))
    def payload_json(self, obj: OutboxMessage) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description=_("headers"))
    def headers_json(self, obj: OutboxMessage) -> SafeString:
        return pretty_json(obj.headers)

    # -- replay and skip ---------------------------------------------------------------------

    def has_operate_outbox_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(OPERATE_PERMISSION))

    @admin.action(description=_("Replay the selected dead messages"), permissions=["operate_outbox"])
    def replay_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> HttpResponse | None:
        return self._resolve(request, queryset, "replay_messages", "replay", _("Replay"))

    @admin.action(description=_("Skip the selected dead messages"), permissions=["operate_outbox"])
    def skip_messages(self, request: HttpRequest, queryset: QuerySet[OutboxMessage]) -> HttpResponse | None:
        return self._resolve(request, queryset, "skip_messages", "skip", _("Skip"))

    def _resolve(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage], name: str, operation: str, title: Any
    ) -> HttpResponse | None:
        """Ask for one reason, then replay or skip each selected message through the operations."""
        verb = getattr(operations, operation)
        form = ResolveForm(request.POST if "confirm" in request.POST else None)
        if form.is_bound and form.is_valid():
            reason = form.cleaned_data["reason"]
            by = request.user.get_username()
            done: list[int] = []
            refused: list[str] = []
            for pk in queryset.order_by("pk").values_list("pk", flat=True):
                try:
                    verb(pk, by=by, reason=reason)
                except OutboxError as exc:
                    refused.append(f"#{pk}: {exc}")
                else:
                    done.append(pk)
            log_to_history(
                request, OutboxMessage, done, f"{title}: {reason}", using=get_settings().outbox_alias
            )
            summary = f"{title}: {len(done)} done"
            if refused:
                summary += f", {len(refused)} not changed"
            self.message_user(request, summary + ".", done_level(len(done)))
            for line in refused[:20]:
                self.message_user(request, line, messages.WARNING)
            return None
        count = queryset.count()
        across = request.POST.get("select_across") == "1"
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "count": count,
            "listed": list(queryset.order_by("pk")[:LISTED]),
            # "Select all" posts back as the change list's filter, not one field per message.
            "selected_ids": [] if across else list(queryset.values_list("pk", flat=True)),
            "form": form,
            "action_name": name,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "select_across": across,
        }
        return TemplateResponse(request, "django_jobguard/admin/outboxmessage/resolve.html", context)
