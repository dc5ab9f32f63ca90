"""Admin for dead letters: diagnosis, and the replay workflow's request / approve / reject.

The views only parse input and render; :mod:`django_jobguard.dlq` decides who may do what
(a :class:`ReplayPermissionDenied` becomes a 403 page with its message), which transitions
can succeed now, and makes the transition. Dead letters are never deleted here: their replay
audit trail would go with them (retention is ``jobguard_prune``'s).
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import unquote
from django.core.exceptions import ObjectDoesNotExist
from django.db import connections
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.safestring import SafeString
from django.utils.text import smart_split, unescape_string_literal
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import dlq
from ..conf import get_settings
from ..encryption.payloads import ARGS, ERROR, KWARGS, TRACEBACK, readable_json, readable_text
from ..exceptions import InvalidArgumentsError, ReplayError, ReplayPermissionDenied
from ..models import DeadLetter, ReplayRateChange
from . import diff
from .base import (
    ReadOnlyAdmin,
    admin_link,
    can_view_payload,
    format_time,
    log_to_history,
    pre,
    pretty_json,
    refusal,
)
from .forms import (
    BatchForm,
    BulkCorrectionForm,
    RedriveRateForm,
    ReplayDecisionForm,
    ReplayRequestForm,
    dumps,
)

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: Dead letters a bulk confirmation page lists (it says how many more it stands for).
BULK_LISTED = 50
#: Corrected replays a bulk approval lists first, each with its path diffs: only those listed
#: are approved (each bound to the digest shown); a bigger batch is approved in several.
CORRECTED_LISTED = 200
#: Characters a key prefix search needs before its ``*``: a shorter one lists most keys.
KEY_PREFIX_MIN = 3
#: Changes of the redrive rate its page lists, newest first.
RATE_HISTORY = 20

_SERVICES: dict[str, Callable[..., DeadLetter]] = {
    dlq.REQUEST: dlq.request_replay,
    dlq.APPROVE: dlq.approve_replay,
    dlq.REJECT: dlq.reject_replay,
}
_LABELS: dict[str, StrOrPromise] = {
    dlq.REQUEST: _("Request replay"),
    dlq.APPROVE: _("Approve replay"),
    dlq.REJECT: _("Reject replay"),
}
_DONE: dict[str, StrOrPromise] = {
    dlq.REQUEST: _("Replay requested; it needs approval by another user."),
    dlq.APPROVE: _("Replay approved; a worker will redrive it within the replay rate limit."),
    dlq.REJECT: _("Replay rejected."),
}


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    undeletable = (
        "They are the record of jobs that failed for good, kept for the audit: request a "
        "replay, or reject one."
    )
    list_display = [
        "id",
        "task_name",
        "queue_name",
        "reason",
        "category",
        "error_class",
        "attempts",
        "replay_state",
        "last_failed_at",
    ]
    list_filter = [
        "replay_state",
        "reason",
        "category",
        "queue_name",
        "task_name",
        "error_class",
        "created_at",
    ]
    search_fields = ["id", "task_name", "error_class", "lock_key"]
    payload_search_fields = ["idempotency_key"]
    search_whole_values = True
    # The queue health page links a queue's unresolved dead letters (not replayed, not rejected).
    extra_lookups = ["replay_state__in"]
    search_help_text = _(
        "Dead-letter ids, task names, error classes, lock keys or idempotency keys, whole; "
        "an idempotency key's start followed by * (order-50012*) with jobguard.view_payload."
    )
    payload_derived_fields = ["error_message", "error_message_text", "idempotency_key"]
    date_hierarchy = "created_at"
    ordering = ["-id"]
    show_full_result_count = False
    list_select_related = False
    # No deletion (ReadOnlyAdmin's default): deleting a dead letter would cascade its
    # append-only replay audit trail away and leave its job dead with nothing to replay it
    # (jobguard_audit's dead_without_dead_letter).
    actions = ["request_replays", "approve_replays", "reject_replays"]
    change_form_template = "django_jobguard/admin/deadletter/change_form.html"
    change_list_template = "django_jobguard/admin/deadletter/change_list.html"
    readonly_fields = [
        "job_link",
        "origin_link",
        "payload_json",
        "replay_payload_json",
        "traceback_text",
        "replay_job_link",
        "idempotency_status",
        "error_message_text",
    ]

    # -- detail page -----------------------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets: list[Any] = [
            (
                None,
                {
                    "fields": [
                        "job_link",
                        "origin_link",
                        "task_name",
                        "queue_name",
                        "reason",
                        "category",
                        "attempts",
                        "max_attempts",
                        "handler_version",
                        "worker_id",
                    ]
                },
            ),
            (
                _("Error"),
                {
                    "fields": [
                        "error_class",
                        "error_message_text",
                        "first_failed_at",
                        "last_failed_at",
                        "created_at",
                    ]
                },
            ),
            (
                _("Replay"),
                {
                    "fields": [
                        "replay_state",
                        "replay_requested_by",
                        "replay_requested_at",
                        "replay_reason",
                        "replay_decided_by",
                        "replay_decided_at",
                        "replay_job_link",
                        "replayed_at",
                        "idempotency_key",
                        "idempotency_status",
                        "lock_key",
                    ]
                },
            ),
        ]
        if can_view_payload(request):
            payload = ["payload_json", "replay_payload_json", "traceback_text"]
            fieldsets.insert(1, (_("Payload and traceback"), {"fields": payload}))
        return self.visible_fieldsets(request, fieldsets)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        letter = self.get_object(request, unquote(object_id))
        context = dict(extra_context or {})
        if letter is not None:
            # The service layer says which transitions can succeed now, and why the others cannot.
            offered = dlq.replay_actions(letter, request.user)
            context["replay_actions"] = [(a, _LABELS[a]) for a, why in offered.items() if why is None]
            context["replay_refusals"] = [(_LABELS[a], why) for a, why in offered.items() if why is not None]
            context["replay_events"] = self._events(request, letter)
            context.update(_correction_context(request, _stored_review(letter)))
        return super().change_view(request, object_id, form_url, context)

    def _events(self, request: HttpRequest, letter: DeadLetter) -> list[dict[str, Any]]:
        show_payload = can_view_payload(request)
        events = []
        for event in letter.replay_events.all():
            data = dlq.visible_event_data(event.data, show_payload)
            events.append(
                {
                    "created_at": format_time(event.created_at),
                    "action": event.get_action_display(),
                    "actor": event.actor_name or _("system"),
                    "reason": event.reason,
                    "data": dumps(data) if data else "",
                }
            )
        return events

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[DeadLetter], search_term: str
    ) -> tuple[QuerySet[DeadLetter], bool]:
        """Whole values as every change list here searches them, and ``prefix*`` on idempotency keys.

        A word ending in ``*`` (at least :data:`KEY_PREFIX_MIN` characters before it) finds the
        dead letters whose idempotency key starts with it (``order-50012*``): only for users
        with ``jobguard.view_payload``, as the key carries argument values; read from an index
        on each database (:func:`key_prefix`).
        """
        words = list(smart_split(search_term))
        prefix_words = [
            word for word in words if _unquoted(word).endswith("*") and len(_unquoted(word)) > KEY_PREFIX_MIN
        ]
        prefixes = [_unquoted(word)[:-1] for word in prefix_words]
        if not prefixes or not can_view_payload(request):
            return super().get_search_results(request, queryset, search_term)
        rest = " ".join(word for word in words if word not in prefix_words)
        found = queryset.filter(functools.reduce(operator.or_, (key_prefix(p) for p in prefixes)))
        if rest.strip():
            whole, _duplicates = super().get_search_results(request, queryset, rest)
            found = found | whole
        return found, False

    @admin.display(description=_("job"))
    def job_link(self, obj: DeadLetter) -> SafeString | str:
        return admin_link(obj.job)

    @admin.display(description=_("replay of"))
    def origin_link(self, obj: DeadLetter) -> SafeString | str:
        """The dead letter whose replay this job was, if it was one."""
        try:
            return admin_link(obj.job.replayed_from) if obj.job else "-"
        except ObjectDoesNotExist:
            return "-"

    # Payload fields, shown only with jobguard.view_payload: each opened here if encrypted.

    @admin.display(description=_("payload"))
    def payload_json(self, obj: DeadLetter) -> SafeString:
        return pretty_json(_payload(obj.args, obj.kwargs))

    @admin.display(description=_("corrected payload"))
    def replay_payload_json(self, obj: DeadLetter) -> SafeString | str:
        if obj.replay_args is None and obj.replay_kwargs is None:
            return "-"
        return pretty_json(_payload(obj.replay_args, obj.replay_kwargs))

    @admin.display(description=_("traceback"))
    def traceback_text(self, obj: DeadLetter) -> SafeString:
        return pre(readable_text(obj.traceback, TRACEBACK, "dead_letter.traceback") or "-")

    @admin.display(description=_("error message"))
    def error_message_text(self, obj: DeadLetter) -> str:
        return readable_text(obj.error_message, ERROR, "dead_letter.error_message") or "-"

    @admin.display(description=_("replay job"))
    def replay_job_link(self, obj: DeadLetter) -> SafeString | str:
        return admin_link(obj.replay_job)

    @admin.display(description=_("idempotency key now"))
    def idempotency_status(self, obj: DeadLetter) -> str:
        """What the key's row says today, and what that means for the replay (from dlq)."""
        return dlq.describe_key(obj) or "-"

    # -- replay views ----------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view(self.replay_view)
        rate = self.admin_site.admin_view(self.rate_view)
        return [
            path("redrive-rate/", rate, name=f"{prefix}_redrive_rate"),
            path("<path:object_id>/replay/<str:action>/", view, name=f"{prefix}_replay"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        # The rate in force, linked to its page: the first thing to change in an incident.
        context = {"redrive_rate": dlq.current_rate(), **(extra_context or {})}
        return super().changelist_view(request, context)

    def rate_view(self, request: HttpRequest) -> HttpResponse:
        """The redrive rate in force and its history; approvers change it for every worker here."""
        title = _("Redrive rate")
        if not self.has_view_permission(request):
            name = request.user.get_username()
            why = f"{name} may not view dead letters: that needs the jobguard.view_deadletter permission."
            return refusal(request, self, str(title), why)
        may_change = request.user.has_perm(dlq.RATE_PERMISSION)
        current = dlq.current_rate()
        form = RedriveRateForm(
            request.POST if request.method == "POST" else None,
            initial={"rate_per_minute": current.rate_per_minute},
        )
        if request.method == "POST":
            if not may_change:
                why = (
                    f"{request.user.get_username()} may not change the redrive rate: that needs the "
                    f"{dlq.RATE_PERMISSION} permission."
                )
                return refusal(request, self, str(title), why)
            if form.is_valid():
                rate = form.cleaned_data["rate_per_minute"]
                try:
                    change = dlq.set_rate(request.user, rate, form.cleaned_data["reason"])
                except ReplayPermissionDenied as exc:
                    return refusal(request, self, str(title), str(exc))
                except ReplayError as exc:
                    form.add_error(None, str(exc))
                else:
                    said = f"{rate}/min" if rate is not None else f"the setting ({current.setting}/min)"
                    message = f"Redrive rate set to {said}: {form.cleaned_data['reason']}"
                    log_to_history(
                        request, ReplayRateChange, [change.pk], message, using=get_settings().database_alias
                    )
                    self.message_user(
                        request,
                        _("Redrive rate set to %(rate)s: every worker applies it at its next redrive pass.")
                        % {"rate": said},
                        messages.SUCCESS,
                    )
                    return HttpResponseRedirect(
                        reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_redrive_rate")
                    )
        alias = get_settings().database_alias
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "current": current,
            "changed_at": format_time(current.change.created_at) if current.change else "",
            "history": [
                {
                    "rate": change.rate_per_minute,
                    "actor": change.actor_name or _("system"),
                    "at": format_time(change.created_at),
                    "reason": change.reason,
                }
                for change in ReplayRateChange.objects.using(alias).order_by("-id")[:RATE_HISTORY]
            ],
            "waiting": DeadLetter.objects.using(alias).awaiting_redrive().count(),
            "estimate_text": "",
            "form": form if may_change else None,
            "reaper_interval": get_settings().reaper_interval,
        }
        if context["waiting"]:
            context["estimate_text"] = _duration(
                context["waiting"] * dlq.RATE_WINDOW_SECONDS / current.rate_per_minute
            )
        return TemplateResponse(request, "django_jobguard/admin/deadletter/redrive_rate.html", context)

    def replay_view(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        """GET: a form (reason; payload when requesting); POST: the transition through dlq."""
        if action not in _SERVICES:
            raise Http404(f"No replay action {action!r}.")
        letter = self.get_object(request, unquote(object_id))
        if letter is None:
            raise Http404(f"No dead letter {object_id!r}.")
        if not self.has_view_permission(request, letter):
            name = request.user.get_username()
            why = f"{name} may not view dead letters: that needs the jobguard.view_deadletter permission."
            return refusal(request, self, f"{_LABELS[action]}: {letter}", why)
        try:
            dlq.check_permission(letter, request.user, action)
        except ReplayPermissionDenied as exc:
            return refusal(request, self, f"{_LABELS[action]}: {letter}", str(exc))
        # A form that could only fail (the state moved on, the corrected payload no longer
        # fits) is not shown: the reason is.
        blocked = dlq.refusal_reason(letter, request.user, action)
        if blocked is not None:
            return refusal(request, self, f"{_LABELS[action]}: {letter}", blocked, status=409)
        show_payload = action == dlq.REQUEST and can_view_payload(request)
        form_class = ReplayRequestForm if show_payload else ReplayDecisionForm
        review = None if action == dlq.REQUEST else _stored_review(letter)
        confirm = ""
        if request.method == "POST":
            form = form_class(request.POST)
            if form.is_valid():
                try:
                    if action == dlq.REQUEST and show_payload:
                        review = _review(letter, form.payload())
                        # A correction that moves the key's fingerprint or the lock is shown with
                        # its warnings before it is requested; submitting that same payload again
                        # requests it (an edited payload is reviewed afresh).
                        token = _payload_token(form.payload())
                        if review and review.warnings and request.POST.get("confirm_correction") != token:
                            confirm = token
                    if not confirm and action == dlq.APPROVE:
                        # Bound to the correction this page showed: a change since is refused.
                        reviewed = request.POST.get("correction_digest") or None
                        dlq.approve_replay(
                            letter,
                            request.user,
                            form.cleaned_data["reason"],
                            reviewed=reviewed,
                            require_review=True,
                        )
                    elif not confirm:
                        _SERVICES[action](letter, request.user, form.cleaned_data["reason"], **form.payload())
                except ReplayPermissionDenied as exc:
                    return refusal(request, self, f"{_LABELS[action]}: {letter}", str(exc))
                except (ReplayError, InvalidArgumentsError) as exc:
                    form.add_error(None, str(exc))
                else:
                    if confirm:
                        return self._replay_form(request, letter, action, form, review, show_payload, confirm)
                    self.log_change(request, letter, f"{_LABELS[action]}: {form.cleaned_data['reason']}")
                    self.message_user(request, _DONE[action], messages.SUCCESS)
                    url = reverse(
                        f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[letter.pk]
                    )
                    return HttpResponseRedirect(url)
        else:
            initial = {}
            if show_payload:
                shown = _payload(letter.args, letter.kwargs)
                initial = {"args": dumps(shown["args"]), "kwargs": dumps(shown["kwargs"])}
            form = form_class(initial=initial)
        return self._replay_form(request, letter, action, form, review, show_payload, confirm)

    def _replay_form(
        self,
        request: HttpRequest,
        letter: DeadLetter,
        action: str,
        form: ReplayDecisionForm,
        review: dlq.CorrectionReview | None,
        show_payload: bool,
        confirm: str,
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": letter,
            "form": form,
            "correction_digest": dlq.correction_digest(letter) if action == dlq.APPROVE else "",
            "action": action,
            "title": f"{_LABELS[action]}: {letter}",
            "button": _LABELS[action],
            "show_payload": can_view_payload(request),
            "corrected": letter.replay_args is not None or letter.replay_kwargs is not None,
            "replay_payload": dumps(_payload(letter.replay_args, letter.replay_kwargs))
            if show_payload
            else "",
            "requested_at": format_time(letter.replay_requested_at),
            "confirm_correction": confirm,
            # Django refuses a bigger request before any view runs (a bare 400 page): the
            # form's script checks the size first and says so.
            "upload_limit": settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0,
            **_correction_context(request, review),
        }
        return TemplateResponse(request, "django_jobguard/admin/deadletter/replay_form.html", context)

    # -- bulk actions ----------------------------------------------------------------------

    def has_request_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(dlq.PERMISSIONS[dlq.REQUEST])

    def has_approve_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(dlq.PERMISSIONS[dlq.APPROVE])

    @admin.action(
        description=_("Request replay of the selected dead letters"), permissions=["request_replay"]
    )
    def request_replays(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> HttpResponse | None:
        return self._bulk(request, queryset, dlq.REQUEST, "request_replays")

    @admin.action(
        description=_("Approve replay of the selected dead letters"), permissions=["approve_replay"]
    )
    def approve_replays(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> HttpResponse | None:
        return self._bulk(request, queryset, dlq.APPROVE, "approve_replays")

    @admin.action(description=_("Reject replay of the selected dead letters"), permissions=["approve_replay"])
    def reject_replays(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> HttpResponse | None:
        return self._bulk(request, queryset, dlq.REJECT, "reject_replays")

    def _bulk(
        self, request: HttpRequest, queryset: QuerySet[DeadLetter], action: str, name: str
    ) -> HttpResponse | None:
        """Ask for one reason, then make the transition on each dead letter.

        "Select all" is carried to the confirmation as the change list's filter (the page
        posts back to the filtered URL with ``select_across``), never as one field per row,
        so any number of dead letters fits in the request. The page narrows the selection to
        a batch (:class:`BatchForm`: the first N, a last-failed range), again as a filter; a
        request may carry one correction for all of them (a JSON Patch of kwargs). An
        approval lists the corrected replays first, each with its path diffs, and binds each
        to the digest of the correction shown.
        """
        across = request.POST.get("select_across") == "1"
        matching = queryset
        batch = BatchForm(request.POST if "batch" in request.POST else None, prefix="batch")
        queryset = batch.narrow(queryset)
        corrected_q = Q(replay_args__isnull=False) | Q(replay_kwargs__isnull=False)
        exclude_corrected = request.POST.get("exclude_corrected") == "1"
        if exclude_corrected:
            queryset = queryset.exclude(corrected_q)
        sees_payloads = dlq.can_view_payload(request.user)
        corrects = action == dlq.REQUEST and sees_payloads
        form_class = BulkCorrectionForm if corrects else ReplayDecisionForm
        if action == dlq.REQUEST and not corrects and request.POST.get("patch", "").strip():
            # Never drop a correction silently (the replays would run the original payloads).
            why = (
                f"{request.user.get_username()} may not correct payloads: that needs the "
                f"{dlq.VIEW_PAYLOAD} permission."
            )
            return refusal(request, self, str(_LABELS[action]), why)
        # "Update the counts" (preview) or a batch that does not validate shows the page again.
        confirming = "confirm" in request.POST and "preview" not in request.POST
        confirming = confirming and (not batch.is_bound or batch.is_valid())
        if confirming:
            form = form_class(request.POST)
        elif "confirm" in request.POST:
            # A changed batch is shown with its counts before anything happens; what was typed stays.
            form = form_class(initial={k: request.POST.get(k, "") for k in ("reason", "patch")})
        else:
            form = form_class()
        corrected = queryset.filter(corrected_q).count() if action == dlq.APPROVE else 0
        if confirming and form.is_valid():
            if corrected and not sees_payloads:
                self.message_user(
                    request,
                    ngettext(
                        "Not approved: %(n)d of these replays runs a corrected payload, and approving "
                        "a correction needs the jobguard.view_payload permission to see it. Exclude "
                        "corrected payloads, or ask someone who may see them.",
                        "Not approved: %(n)d of these replays run corrected payloads, and approving "
                        "a correction needs the jobguard.view_payload permission to see it. Exclude "
                        "corrected payloads, or ask someone who may see them.",
                        corrected,
                    )
                    % {"n": corrected},
                    messages.ERROR,
                )
                return None
            ids = queryset.values_list("pk", flat=True)
            patch = form.cleaned_data.get("patch") if corrects else None
            reason = form.cleaned_data["reason"]
            try:
                if patch:
                    decision = dlq.request_many_corrected(ids, request.user, reason, patch)
                else:
                    decision = dlq.decide_many(
                        action,
                        ids,
                        request.user,
                        reason,
                        # Each approval is bound to the payload its letter had on the confirmation page.
                        reviewed=_reviewed(request) if action == dlq.APPROVE else None,
                    )
            except ReplayPermissionDenied as exc:
                return refusal(request, self, str(_LABELS[action]), str(exc))
            moved = decision.moved
            failed = [f"#{pk}: {why}" for pk, why in decision.refused]
            done = len(moved)
            message = f"{_LABELS[action]} (bulk): {reason}"
            if patch:
                message += f" (correction {json.dumps([op.as_json() for op in patch])})"
            if batch.narrows:
                message += f" (batch {_batch_text(batch)})"
            log_to_history(request, DeadLetter, moved, message, using=get_settings().database_alias)
            summary = f"{_LABELS[action]}: {done} done"
            if patch:
                summary += " with the correction"
            if failed:
                summary += f", {len(failed)} not changed"
            self.message_user(request, summary + ".", messages.SUCCESS if done else messages.WARNING)
            for line in failed[:20]:
                self.message_user(request, line, messages.WARNING)
            if len(failed) > 20:
                self.message_user(request, f"... and {len(failed) - 20} more not changed.", messages.WARNING)
            return None
        count = queryset.count()
        estimate = dlq.redrive_estimate(count) if action in (dlq.REQUEST, dlq.APPROVE) else None
        # An approval lists the corrected replays first, with what each changes, whatever the
        # selection's size: they are what the approver must read. The others follow.
        corrected_shown = (
            list(queryset.filter(corrected_q).order_by("id")[:CORRECTED_LISTED]) if corrected else []
        )
        others = queryset.exclude(corrected_q) if corrected else queryset
        shown = list(others.order_by("id")[:BULK_LISTED])
        others_count = count - corrected
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _LABELS[action],
            "corrected_listed": [
                self._bulk_item(request, letter, action, sees_payloads) for letter in corrected_shown
            ],
            "listed": [self._bulk_item(request, letter, action, sees_payloads) for letter in shown],
            "count": count,
            "matching": matching.count() if batch.narrows else count,
            "others_count": others_count,
            "listed_count": len(shown),
            "corrected_listed_count": len(corrected_shown),
            "corrected": corrected,
            "sees_payloads": sees_payloads,
            "approving": action == dlq.APPROVE,
            "requesting": action == dlq.REQUEST,
            "corrects": corrects,
            "select_across": across,
            "first_pk": (corrected_shown + shown)[0].pk if corrected_shown or shown else None,
            "exclude_corrected": exclude_corrected,
            "selected_ids": [] if across else [letter.pk for letter in matching.only("pk")],
            "estimate": estimate,
            "estimate_text": _duration(estimate.seconds) if estimate else "",
            "ahead_text": _ahead(estimate.ahead) if estimate else "",
            "rate_url": reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_redrive_rate"),
            "form": form,
            "batch": batch,
            "action_name": name,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "django_jobguard/admin/deadletter/replay_bulk.html", context)

    def _bulk_item(
        self, request: HttpRequest, letter: DeadLetter, action: str, sees_payloads: bool
    ) -> dict[str, Any]:
        corrected = letter.replay_args is not None or letter.replay_kwargs is not None
        review = _stored_review(letter) if corrected else None
        return {
            "letter": letter,
            "corrected": corrected,
            "review": review,
            # The path diffs (values) for users who may see payloads; the names for the others.
            "rows": _diff_rows(review) if review is not None and sees_payloads else [],
            "digest": dlq.correction_digest(letter) if action == dlq.APPROVE else "",
        }


def _unquoted(word: str) -> str:
    if word[:1] in {'"', "'"} and word[0] == word[-1] and len(word) > 1:
        return unescape_string_literal(word)
    return word


def key_prefix(prefix: str) -> Q:
    """Dead letters whose idempotency key starts with ``prefix``, as a lookup an index answers.

    PostgreSQL: ``LIKE 'prefix%'``, which ``jobguard_dl_idem_like_idx`` (migration 0023,
    ``varchar_pattern_ops``) serves under any collation. SQLite and MariaDB/MySQL compare
    the keys by code point (0022 gave MariaDB a binary collation), so a range of
    ``jobguard_dl_idem_idx`` holds every key with the prefix; ``startswith`` keeps it exact.
    """
    starts = Q(idempotency_key__startswith=prefix)
    if connections[get_settings().database_alias].vendor == "postgresql" or ord(prefix[-1]) >= 0x10FFFF:
        return starts
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return Q(idempotency_key__gte=prefix, idempotency_key__lt=upper) & starts


def _batch_text(batch: BatchForm) -> str:
    """The batch as the admin log records it: ``first 500, last failed from ... before ...``."""
    data = batch.cleaned_data
    parts = []
    if data.get("first") is not None:
        parts.append(f"first {data['first']}")
    if data.get("failed_from") is not None:
        parts.append(f"last failed from {format_time(data['failed_from'])}")
    if data.get("failed_to") is not None:
        parts.append(f"last failed before {format_time(data['failed_to'])}")
    return ", ".join(parts)


def _reviewed(request: HttpRequest) -> dict[int, str]:
    """The correction digest of each dead letter the bulk confirmation page listed (``id:digest``).

    A malformed entry binds nothing: a letter without a digest here is approved only if it
    carries no correction (the service refuses the rest, saying so).
    """
    reviewed: dict[int, str] = {}
    for entry in request.POST.getlist("reviewed"):
        pk, _sep, digest = entry.partition(":")
        if pk.isascii() and pk.isdecimal() and digest:
            reviewed[int(pk)] = digest
    return reviewed


def _payload_token(payload: dict[str, Any]) -> str:
    """Names the payload whose warnings the requester saw (not a secret: a form round-trip)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _payload(args: Any, kwargs: Any) -> dict[str, Any]:
    """A payload as shown to a user who may see payloads: opened where it is encrypted."""
    return {
        "args": readable_json(args, ARGS, "dead_letter.args"),
        "kwargs": readable_json(kwargs, KWARGS, "dead_letter.kwargs"),
    }


def _review(letter: DeadLetter, payload: dict[str, Any]) -> dlq.CorrectionReview | None:
    try:
        return dlq.review_correction(letter, **payload)
    except (ReplayError, InvalidArgumentsError):
        return None  # the request refuses it, with the state checked first, and says why


def _stored_review(letter: DeadLetter) -> dlq.CorrectionReview | None:
    """The review of the correction stored on ``letter``; None if it has none or it no longer fits."""
    if letter.replay_args is None and letter.replay_kwargs is None:
        return None
    try:
        return dlq.review_correction(letter)
    except (ReplayError, InvalidArgumentsError):
        return None  # the task changed since: approval refuses it, saying why


def _correction_context(request: HttpRequest, review: dlq.CorrectionReview | None) -> dict[str, Any]:
    """What _correction.html renders: values only for users who may see payloads."""
    if review is None:
        return {"correction": None}
    show_payload = can_view_payload(request)
    rows = _diff_rows(review) if show_payload else []
    return {"correction": review, "correction_rows": rows, "show_payload": show_payload}


def _diff_rows(review: dlq.CorrectionReview) -> list[dict[str, str]]:
    """The correction's path diffs, with values: only for users who may see payloads."""
    absent = str(_("(not given)"))
    # Only the leaves that changed (a nested qty 2 -> 30 is one row, items[0].qty), so
    # the reviewer sees exactly what the replay will run differently.
    rows = []
    for change in review.changes:
        for leaf in diff.changes(change.name, change.original, change.corrected):
            rows.append(
                {
                    "name": leaf.path,
                    "original": absent if leaf.original is diff.ABSENT else dumps(leaf.original),
                    "corrected": absent if leaf.corrected is diff.ABSENT else dumps(leaf.corrected),
                }
            )
    return rows


def _duration(seconds: float) -> str:
    """``45 seconds``, ``12 minutes``, ``2.5 hours``: how long a redrive takes, roughly."""
    if seconds < 90:
        n = round(seconds)
        return ngettext("%(n)d second", "%(n)d seconds", n) % {"n": n}
    if seconds < 5400:
        n = round(seconds / 60)
        return ngettext("%(n)d minute", "%(n)d minutes", n) % {"n": n}
    return f"{seconds / 3600:.1f} hours"


def _ahead(count: int) -> str:
    """Who goes first: ``no approved replay waits before``, or how many do."""
    if count == 0:
        return str(_("with no approved replay waiting before"))
    return ngettext(
        "after the %(n)d approved replay already waiting",
        "after the %(n)d approved replays already waiting",
        count,
    ) % {"n": count}
