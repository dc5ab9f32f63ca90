"""Admin for locks: who holds which resource, until when, and whether that holder is gone.

The holder is read from the lock's own owner token (a worker's token names the job's claim,
see :mod:`django_jobguard.locks.holders`), never from the jobs that carry its key: a job
waiting for the lock carries the same key. With the database back end the list pages through
the lock rows; with the Redis back end it reads the live locks from Redis (SCAN, bounded).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..encryption.indexes import search_values
from ..exceptions import LockReleaseError, LockReleasePermissionDenied, LockUnavailable
from ..locks import holders, release
from ..models import JobStatus, Lock, LockRelease
from .base import ReadOnlyAdmin, refusal
from .forms import ForceReleaseForm

_FIELDS = (
    "key",
    "is_held",
    "holder",
    "holder_gone",
    "stuck",
    "age",
    "ttl",
    "fencing_token",
    "contention",
    "acquired_at",
    "expires_at",
    "holder_why",
    "running_jobs",
)
#: Longest SCAN cursor accepted from the query string (Redis's are unsigned 64-bit).
_MAX_CURSOR = 2**64 - 1


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


class _LockChangeList(ChangeList):
    """Reads the page's holders and contention in three queries, whatever the page's length."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        for row, live in zip(rows, holders.describe(rows), strict=True):
            row.live = live


def _live(obj: Lock) -> holders.LiveLock:
    live = getattr(obj, "live", None)
    if live is None:
        live = obj.live = holders.describe([obj])[0]  # type: ignore[attr-defined]
    return live


def holder_link(live: holders.LiveLock | None) -> SafeString | str:
    """``#<job> <worker>``, the job linked; "-" when free, "not a job" for a lock taken in code."""
    if live is None or not live.held:
        return "-"
    if live.holder is None:
        return str(_("not a job's claim"))
    url = reverse("admin:jobguard_job_change", args=[live.holder.job_id])
    return format_html('<a href="{}">#{}</a> {}', url, live.holder.job_id, live.holder.worker_id)


@admin.register(Lock)
class LockAdmin(ReadOnlyAdmin):
    """Read-only: a lock is released by its owner's token, by its TTL, or by a forced release.

    Only the database back end stores rows here; with the Redis back end the list reads Redis.
    """

    list_display = [name for name in _FIELDS if name not in ("holder_why", "running_jobs")]
    list_filter = [HeldFilter]
    search_fields = ["key"]
    ordering = ["-acquired_at"]
    fields = _FIELDS
    readonly_fields = _FIELDS
    show_full_result_count = False
    change_form_template = "django_jobguard/admin/lock/change_form.html"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _LockChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Lock], search_term: str
    ) -> tuple[QuerySet[Lock], bool]:
        found, duplicates = super().get_search_results(request, queryset, search_term)
        # A task with encrypt=True stores its lock key as a blind index: a search for the
        # clear key finds that lock too (as the job search does), by its index under each key.
        prefix = get_settings().locks.prefix
        names = [prefix + index for word in search_term.split() for index in search_values(word)[1:]]
        return (found | queryset.filter(key__in=names), duplicates) if names else (found, duplicates)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if get_settings().locks.backend == "redis":
            return self.redis_changelist_view(request)
        return super().changelist_view(request, extra_context)

    def redis_changelist_view(self, request: HttpRequest) -> HttpResponse:
        """The live Redis locks, a bounded SCAN per page: stuck ones first."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        raw_cursor = request.GET.get("cursor", "0")
        if not raw_cursor.isdigit() or int(raw_cursor) > _MAX_CURSOR:
            return refusal(
                request,
                self,
                "Locks in Redis",
                f"cursor must be a SCAN cursor (digits), not {raw_cursor!r}.",
                status=400,
            )
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Locks in Redis"),
            "prefix": get_settings().locks.prefix,
            "cap": holders.SCAN_CAP,
            "can_force_release": release.can_force_release(request.user),
            "cursor": int(raw_cursor),
        }
        try:
            page = holders.redis_page(int(raw_cursor))
        except (LockUnavailable, ImproperlyConfigured) as exc:
            context["error"] = str(exc)
        else:
            context["page"] = page
            context["rows"] = [
                {"live": live, "holder": holder_link(live), "ttl": _seconds(live.ttl_left)}
                for live in page.locks
            ]
        return TemplateResponse(request, "django_jobguard/admin/lock/redis_list.html", context)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Lock | None:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            _live(obj)
        return obj

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_force_release"
        view = self.admin_site.admin_view(self.force_release_view)
        return [path("<path:object_id>/force-release/", view, name=name), *super().get_urls()]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        context = {"can_force_release": release.can_force_release(request.user), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def force_release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Confirm with a reason, then free the lock through the service (which checks again)."""
        # The permission first: a 404 would tell someone without it which keys exist.
        if not release.can_force_release(request.user):
            return refusal(
                request,
                self,
                "Force the release of a lock",
                f"Forcing a lock's release needs the {release.PERMISSION!r} permission.",
            )
        name = unquote(object_id)
        try:
            live = holders.live_lock(name)
        except (LockUnavailable, ImproperlyConfigured) as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:jobguard_lock_changelist"))
        if live is None:
            raise Http404(f"No lock {name!r}.")
        title = f"Force the release of {live.name}"
        form = ForceReleaseForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            # The owner token the operator confirmed against: a lock taken since is not freed.
            seen = request.POST.get("token", "")
            try:
                token = release.force_release(
                    live.name, user=request.user, reason=form.cleaned_data["reason"], token=seen
                )
            except LockReleasePermissionDenied as exc:
                return refusal(request, self, title, str(exc))
            except LockReleaseError as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(
                    request,
                    f"Lock {live.name!r} released; its fencing token is now {token}, so the old holder "
                    "can no longer extend it or write with its token.",
                    messages.SUCCESS,
                )
            return HttpResponseRedirect(reverse("admin:jobguard_lock_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "lock": live,
            "holder": holder_link(live),
            "holder_gone": live.holder_gone,
            "form": form,
        }
        return TemplateResponse(request, "django_jobguard/admin/lock/force_release.html", context)

    # No deletion (ReadOnlyAdmin's default): deleting a held lock would let a second job in
    # while the first still runs, and deleting a free one would reset its fencing counter.

    @admin.display(boolean=True, description=_("held"))
    def is_held(self, obj: Lock) -> bool:
        return obj.token is not None and obj.expires_at is not None and obj.expires_at > timezone.now()

    @admin.display(description=_("holder (job, worker)"))
    def holder(self, obj: Lock) -> SafeString | str:
        return holder_link(_live(obj))

    @admin.display(boolean=True, description=_("holder gone"))
    def holder_gone(self, obj: Lock) -> bool | None:
        """Held by a claim that can no longer release it (see ``holder_why``); unknown: not a job's."""
        return _live(obj).holder_gone

    @admin.display(boolean=True, description=_("stuck"))
    def stuck(self, obj: Lock) -> bool | None:
        live = _live(obj)
        return live.stuck if live.held else None

    @admin.display(description=_("holder"))
    def holder_why(self, obj: Lock) -> str:
        live = _live(obj)
        if not live.held:
            return "-"
        if live.holder is None:
            return "Its owner token names no job: it was taken in code (lock()), not by a worker for a job."
        return live.holder.why

    @admin.display(description=_("waiting jobs (put back)"))
    def contention(self, obj: Lock) -> str:
        live = _live(obj)
        return f"{live.waiting} ({live.put_backs})" if live.waiting else "-"

    @admin.display(description=_("age"))
    def age(self, obj: Lock) -> str:
        if obj.acquired_at is None or obj.token is None:
            return "-"
        return f"{max(0.0, (timezone.now() - obj.acquired_at).total_seconds()):.0f} s"

    @admin.display(description=_("TTL left"))
    def ttl(self, obj: Lock) -> str:
        if obj.expires_at is None or obj.token is None:
            return "-"
        return f"{max(0.0, (obj.expires_at - timezone.now()).total_seconds()):.1f} s"

    @admin.display(description=_("running jobs with this lock"))
    def running_jobs(self, obj: Lock) -> SafeString | str:
        prefix = get_settings().locks.prefix
        if not obj.key.startswith(prefix):
            return "-"
        query = urlencode({"lock_key": obj.key[len(prefix) :], "status__exact": JobStatus.RUNNING})
        return format_html(
            '<a href="{}?{}">{}</a>', reverse("admin:jobguard_job_changelist"), query, _("show")
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{max(0.0, value):.1f} s"


@admin.register(LockRelease)
class LockReleaseAdmin(ReadOnlyAdmin):
    """The audit trail of forced lock releases."""

    list_display = ["created_at", "key", "actor_name", "reason", "fencing_token", "holder_job_id"]
    search_fields = ["key", "actor_name", "reason"]
    show_full_result_count = False
