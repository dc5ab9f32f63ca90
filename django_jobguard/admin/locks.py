"""Admin for the database lock back end's rows: who holds which resource, until when."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Now, Substr
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..conf import get_settings
from ..exceptions import LockReleaseError, LockReleasePermissionDenied
from ..locks import release
from ..models import Job, JobStatus, Lock, LockRelease
from .base import ReadOnlyAdmin, refusal
from .forms import ForceReleaseForm

_FIELDS = (
    "key",
    "is_held",
    "holder",
    "holder_gone",
    "age",
    "ttl",
    "fencing_token",
    "acquired_at",
    "expires_at",
    "running_jobs",
)


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

    list_display = _FIELDS[:-1]
    list_filter = [HeldFilter]
    search_fields = ["key"]
    ordering = ["-acquired_at"]
    fields = _FIELDS
    readonly_fields = _FIELDS
    show_full_result_count = False
    change_form_template = "django_jobguard/admin/lock/change_form.html"

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if get_settings().locks.backend != "database":
            # These rows are the database back end's; the live locks are elsewhere.
            messages.info(
                request,
                _(
                    "Locks are held in Redis (JOBGUARD['LOCKS']['BACKEND'] is 'redis'): this list "
                    "shows only rows left by the database back end, not the live locks. See them "
                    "with redis-cli (SCAN for the key prefix %(prefix)s) or the lock metrics."
                )
                % {"prefix": get_settings().locks.prefix},
            )
        return super().changelist_view(request, extra_context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lock]:
        # The holder, by the lock key the running job carries: one subquery per column, in
        # the list's own query (no query per row).
        prefix = get_settings().locks.prefix
        holders = Job.objects.filter(
            status=JobStatus.RUNNING, lock_key=Substr(OuterRef("key"), len(prefix) + 1)
        ).order_by("-started_at")
        queryset: QuerySet[Lock] = super().get_queryset(request)
        return queryset.annotate(
            holder_job_id=Subquery(holders.values("pk")[:1]),
            holder_worker=Subquery(holders.values("worker_id")[:1]),
            holder_alive=Exists(holders.filter(lease_expires_at__gte=Now())),
        )

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
        lock = self.get_object(request, unquote(object_id))
        if lock is None:
            raise Http404(f"No lock {object_id!r}.")
        title = f"Force the release of {lock.key}"
        form = ForceReleaseForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            try:
                token = release.force_release(lock.key, user=request.user, reason=form.cleaned_data["reason"])
            except LockReleasePermissionDenied as exc:
                return refusal(request, self, title, str(exc))
            except LockReleaseError as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(
                    request,
                    f"Lock {lock.key!r} released; its fencing token is now {token}, so the old holder "
                    "can no longer extend it or write with its token.",
                    messages.SUCCESS,
                )
            return HttpResponseRedirect(reverse("admin:jobguard_lock_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "lock": lock,
            "holder": self.holder(lock),
            "holder_gone": self.holder_gone(lock),
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
        job_id = getattr(obj, "holder_job_id", None)
        if job_id is None or obj.token is None:
            return "-"
        url = reverse("admin:jobguard_job_change", args=[job_id])
        return format_html('<a href="{}">#{}</a> {}', url, job_id, getattr(obj, "holder_worker", "") or "")

    @admin.display(boolean=True, description=_("holder gone"))
    def holder_gone(self, obj: Lock) -> bool | None:
        """Held, yet no running job with a live lease carries its key: nobody will release it."""
        if not self.is_held(obj):
            return None
        return not getattr(obj, "holder_alive", False)

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


@admin.register(LockRelease)
class LockReleaseAdmin(ReadOnlyAdmin):
    """The audit trail of forced lock releases."""

    list_display = ["created_at", "key", "actor_name", "reason", "fencing_token", "holder_job_id"]
    search_fields = ["key", "actor_name", "reason"]
    show_full_result_count = False
