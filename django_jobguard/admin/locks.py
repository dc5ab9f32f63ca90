"""Admin for the database lock back end's rows: who holds which resource, until when."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..models import JobStatus, Lock
from .base import ReadOnlyAdmin

_FIELDS = ("key", "is_held", "expires_at", "fencing_token", "acquired_at", "running_jobs")


class HeldFilter(admin.SimpleListFilter):
    title = _("held")
    parameter_name = "held"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Held")), ("no", _("Free or expired"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Lock]) -> QuerySet[Lock]:
        # The database clock decides, as it does for acquire and takeover.
        held = Q(token__isnull=False, expires_at__gt=Now())
        if self.value() == "yes":
            return queryset.filter(held)
        if self.value() == "no":
            return queryset.exclude(held)
        return queryset


@admin.register(Lock)
class LockAdmin(ReadOnlyAdmin):
    """Read-only: a lock is released by its owner's token or by its TTL, never from a form.

    Only the database back end stores rows here; Redis locks live in Redis.
    """

    list_display = _FIELDS
    list_filter = [HeldFilter]
    search_fields = ["key"]
    ordering = ["-acquired_at"]
    fields = _FIELDS
    readonly_fields = _FIELDS

    # No deletion (ReadOnlyAdmin's default): deleting a held lock would let a second job in
    # while the first still runs, and deleting a free one would reset its fencing counter.

    @admin.display(boolean=True, description=_("held"))
    def is_held(self, obj: Lock) -> bool:
        return obj.token is not None and obj.expires_at is not None and obj.expires_at > timezone.now()

    @admin.display(description=_("running jobs with this lock"))
    def running_jobs(self, obj: Lock) -> SafeString | str:
        prefix = get_settings().locks.prefix
        if not obj.key.startswith(prefix):
            return "-"
        query = urlencode({"lock_key": obj.key[len(prefix) :], "status__exact": JobStatus.RUNNING})
        return format_html(
            '<a href="{}?{}">{}</a>', reverse("admin:jobguard_job_changelist"), query, _("show")
        )
