"""The workers page: one row per worker process, the beat row it upserts (beats.py)."""

from __future__ import annotations

import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.db.models import BooleanField, Case, Exists, OuterRef, QuerySet, Value, When
from django.db.models.functions import Concat, Now
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import JobStatus, WorkerBeat
from ..monitoring import beats
from .base import ReadOnlyAdmin


def _stale_cutoff() -> Any:
    return Now() - datetime.timedelta(seconds=beats.STALE_AFTER_SECONDS)


class StaleFilter(admin.SimpleListFilter):
    """Live or stale, by the database clock (the clock the beats are written with)."""

    title = _("last beat")
    parameter_name = "stale"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("no", _("live")), ("yes", _("stale (missed three beats)"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkerBeat]) -> QuerySet[WorkerBeat]:
        if self.value() == "yes":
            return queryset.filter(last_beat_at__lt=_stale_cutoff())
        if self.value() == "no":
            return queryset.filter(last_beat_at__gte=_stale_cutoff())
        return queryset


@admin.register(WorkerBeat)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = [
        "worker_id",
        "liveness",
        "host",
        "pid",
        "queues",
        "concurrency",
        "async_slots_in_use",
        "loop_lag",
        "jobs_in_hand_link",
        "started_at",
        "last_beat_at",
    ]
    list_filter = [StaleFilter, "host"]
    search_fields = ["worker_id", "host"]
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerBeat]:
        # The stale flag is computed by the database, whose clock wrote last_beat_at.
        queryset: QuerySet[WorkerBeat] = super().get_queryset(request)
        return queryset.annotate(
            is_stale=Case(
                When(last_beat_at__lt=_stale_cutoff(), then=Value(True)),
                default=Value(False),
                output_field=BooleanField(),
            ),
            # A live process beating in a row of its own under this row's worker id
            # (beats.clash_row_id): two processes share the id.
            shared_live=Exists(
                WorkerBeat.objects.filter(
                    worker_id__startswith=Concat(OuterRef("worker_id"), Value(" (pid ")),
                    last_beat_at__gte=_stale_cutoff(),
                )
            ),
        )

    @admin.display(description=_("last beat"), ordering="last_beat_at")
    def liveness(self, obj: WorkerBeat) -> SafeString:
        stale = getattr(obj, "is_stale", None)
        if stale is None:
            stale = beats.is_stale(obj.last_beat_at)
        if stale:
            return format_html(
                '<span class="jobguard-badge state-stale" style="background:#ba2121;color:#fff;'
                'padding:1px 6px;border-radius:8px">{}</span>',
                _("stale"),
            )
        live = format_html(
            '<span class="jobguard-badge state-live" style="background:#2e7d32;color:#fff;'
            'padding:1px 6px;border-radius:8px">{}</span>',
            _("live"),
        )
        shared = beats.shared_worker_id(obj.worker_id) or (
            obj.worker_id if getattr(obj, "shared_live", False) else None
        )
        if shared is None:
            return live
        return format_html(
            '{} <span class="jobguard-badge worker-id-clash" title="{}" style="background:#8a5300;'
            'color:#fff;padding:1px 6px;border-radius:8px;white-space:nowrap">{}</span>',
            live,
            _(
                "Another live process beats under the worker id %(id)r: give each process its own "
                "(--worker-id, WORKER_ID). Their jobs share the id."
            )
            % {"id": shared},
            _("worker id shared"),
        )

    @admin.display(description=_("async slots in use"), ordering="async_in_use")
    def async_slots_in_use(self, obj: WorkerBeat) -> str:
        return f"{obj.async_in_use}/{obj.async_slots}" if obj.async_slots else "-"

    @admin.display(description=_("event loop lag"), ordering="loop_lag_ms")
    def loop_lag(self, obj: WorkerBeat) -> str:
        return f"{obj.loop_lag_ms} ms" if obj.async_slots else "-"

    @admin.display(description=_("jobs in hand"), ordering="jobs_in_hand")
    def jobs_in_hand_link(self, obj: WorkerBeat) -> SafeString | str:
        stale = getattr(obj, "is_stale", None)
        if stale is None:
            stale = beats.is_stale(obj.last_beat_at)
        if stale:
            # Its last count is history: the reaper hands its jobs back once their leases expire.
            return "-"
        # A process of a shared worker id beats in a row of its own; its jobs carry the id.
        worker_id = beats.shared_worker_id(obj.worker_id) or obj.worker_id
        query = urlencode({"worker_id": worker_id, "status__exact": JobStatus.RUNNING})
        return format_html(
            '<a href="{}?{}">{}</a>', reverse("admin:jobguard_job_changelist"), query, obj.jobs_in_hand
        )
