"""What every jobguard admin shares: read-only rows, payloads shown only with permission,
filters limited to what the page offers, and times with seconds and their zone."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.contrib.admin.filters import SimpleListFilter
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import BadRequest, PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator, smart_split, unescape_string_literal
from django.utils.translation import ngettext

from .. import dlq
from ..conf import get_settings
from ..encryption.indexes import search_filter

#: Query-string parameters Django's own list filters send for a field: exact and null (choice
#: and all-values filters), and a date range (date filters).
_FILTER_SUFFIXES = ("", "__exact", "__isnull", "__gte", "__lt")
#: What the date hierarchy sends for its field.
_HIERARCHY_SUFFIXES = ("__year", "__month", "__day")
#: Suffix of the generated read-only field that shows a datetime field with seconds and zone.
TIME_SUFFIX = "_display"


def refuse_nul(request: HttpRequest) -> None:
    """Answer 400 for a NUL character in the query string (PostgreSQL cannot compare text with one)."""
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            raise BadRequest(f"The filter {key.replace(chr(0), '')!r} holds a NUL character (%00).")


def format_time(value: datetime.datetime | None) -> str:
    """``2026-11-30 18:52:03 CST (UTC-06:00)``: seconds, and the zone, in the current time zone.

    In UTC this reads ``2026-12-01 00:52:03 UTC``, as ``jobguard_status`` prints its times.
    """
    if value is None:
        return "-"
    local = timezone.localtime(value)
    text = f"{local:%Y-%m-%d %H:%M:%S %Z}"
    offset = local.strftime("%z")
    if offset != "+0000":
        text += f" (UTC{offset[:3]}:{offset[3:]})"
    return text


def _time_column(field: models.DateTimeField[Any, Any]) -> Callable[[Any], str]:
    @admin.display(description=field.verbose_name, ordering=field.name)
    def show(obj: Any) -> str:
        return format_time(getattr(obj, field.name))

    return show


@dataclasses.dataclass(frozen=True)
class Deletion:
    """The service layer's rule for deleting rows by hand: which may go, how, and why not others."""

    #: The deletable rows of a database alias.
    rows: Callable[[str], QuerySet[Any]]
    #: Deletes those of the given ids that are deletable (checked again by the DELETE).
    delete: Callable[[Iterable[Any]], int]
    #: The rule in one sentence, shown when a deletion is refused.
    rule: str


class OperatorPageAdmin(admin.ModelAdmin):
    """A console page over a model, not a form: nobody adds, changes or deletes its rows here.

    The page's own views (pause, resume, open, close) change state through the service layer.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows change through the worker and the service layer, never by hand in a form.

    - The change list accepts only the lookups its filters, its date hierarchy and
      :attr:`extra_lookups` send: Django would otherwise answer any lookup in the query
      string (``?kwargs__note__startswith=a``), which reads payloads out a character at a
      time. A refused lookup is a 400.
    - :attr:`payload_search_fields` join the search for users with ``jobguard.view_payload`` only.
      With :attr:`search_whole_values`, each word of the search must equal a whole value of
      one of the (indexed) search fields, or the row's id; words are alternatives, so pasted
      ids or keys list every row they name.
    - Every datetime field shows through :func:`format_time` (list columns and the detail
      page), so times compare with the commands' output.
    - Nothing is deleted unless :attr:`deletion` names the service layer's rule, and then
      only the rows it allows (and the user's ``delete_…`` permission).
    """

    #: What may be deleted here; ``None``: nothing.
    deletion: Deletion | None = None
    #: Why rows of an admin without a :attr:`deletion` rule are never deleted here.
    undeletable = "They change only through the worker and the service layer, never by hand."

    #: Lookups allowed besides the filters' (links from other admin pages).
    extra_lookups: Sequence[str] = ()
    #: Searched only for users who may see payloads.
    payload_search_fields: Sequence[str] = ()
    #: Fields whose text can carry payload values (a key rendered from the arguments, an
    #: error that echoes them): left out of lists, pages and lookups for users without
    #: ``jobguard.view_payload``. Search leaves them out through payload_search_fields.
    payload_derived_fields: Sequence[str] = ()
    #: Search by equality on indexed columns instead of Django's ``icontains``, which scans
    #: every row (seconds at a million jobs, and a scan of every payload).
    search_whole_values = False

    def __init__(self, model: type[models.Model], admin_site: admin.AdminSite) -> None:
        super().__init__(model, admin_site)
        self._times: dict[str, str] = {}
        for field in model._meta.get_fields():
            if isinstance(field, models.DateTimeField):
                name = field.name + TIME_SUFFIX
                self._times[field.name] = name
                setattr(self, name, _time_column(field))

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        refuse_nul(request)
        return super().changelist_view(request, extra_context)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # -- deletion ----------------------------------------------------------------------------

    def _rule(self) -> Deletion:
        if self.deletion is None:  # has_delete_permission refuses first; this guards overrides
            raise PermissionDenied
        return self.deletion

    def _deletable(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        rows = self._rule().rows(get_settings().database_alias)
        return rows.filter(pk__in=queryset.values("pk"))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if self.deletion is None or not super().has_delete_permission(request, obj):
            return False
        return obj is None or self._deletable(self.model._default_manager.filter(pk=obj.pk)).exists()

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: Any = None) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        if obj is not None and not self.has_delete_permission(request, obj):
            # Django's bare 403 would not say why: the refusal names the rule.
            title = f"Delete {obj}"
            if self.deletion is None:
                name = str(self.opts.verbose_name_plural).capitalize()
                return refusal(request, self, title, f"{name} are not deleted by hand. {self.undeletable}")
            if super().has_delete_permission(request, obj):  # allowed in general, not this row
                return refusal(request, self, title, self.deletion.rule)
            return refusal(request, self, title, f"{self._needs(request, 'delete')} {self.deletion.rule}")
        return super().delete_view(request, object_id, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        # Without the object: the page would load it again, and its name may be payload.
        if not self.has_view_or_change_permission(request):
            title = str(self.opts.verbose_name).capitalize()
            return refusal(request, self, title, self._needs(request, "view"))
        return super().change_view(request, object_id, form_url, extra_context)

    def _needs(self, request: HttpRequest, action: str) -> str:
        """Who may not do ``action`` here, and the permission it takes (for a refusal page)."""
        opts = self.opts
        return (
            f"{request.user.get_username()} may not {action} {opts.verbose_name_plural}: "
            f"that needs the {opts.app_label}.{action}_{opts.model_name} permission."
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self._rule().delete([obj.pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        # Checked again by the DELETE: a row may have changed since the confirmation page.
        self._rule().delete(queryset.values_list("pk", flat=True))

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes action_location (actions on the change form too) and gives Action
        # objects; 5.2 and 6.0 call get_actions(request) and give (func, name, description).
        where = {} if action_location is None else {"action_location": action_location}
        actions: dict[str, Any] = super().get_actions(request, **where)
        delete = actions.get("delete_selected")
        if isinstance(delete, tuple):
            _, name, description = delete
            actions["delete_selected"] = (ReadOnlyAdmin._delete_selected, name, description)
        elif delete is not None:
            actions["delete_selected"] = dataclasses.replace(delete, func=ReadOnlyAdmin._delete_selected)
        return actions

    def _delete_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        """Django's "Delete selected", for a selection of deletable rows only; else why not."""
        kept = queryset.count() - self._deletable(queryset).count()
        if kept:
            self.message_user(
                request,
                ngettext(
                    "%(count)d selected row may not be deleted, so nothing was: %(rule)s",
                    "%(count)d selected rows may not be deleted, so nothing was: %(rule)s",
                    kept,
                )
                % {"count": kept, "rule": self._rule().rule},
                messages.ERROR,
            )
            return None
        return delete_selected(self, request, queryset)

    # -- times -----------------------------------------------------------------------------

    def with_times(self, names: Sequence[Any]) -> list[Any]:
        """``names`` with each datetime field replaced by its formatted read-only field."""
        return [self._times.get(name, name) if isinstance(name, str) else name for name in names]

    def with_times_in_fieldsets(self, fieldsets: Any) -> list[Any]:
        """``fieldsets`` with :meth:`with_times` applied to each one's fields."""
        return [(title, {**opts, "fields": self.with_times(opts["fields"])}) for title, opts in fieldsets]

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        return self.with_times(self._visible(request, super().get_list_display(request)))

    def visible_fieldsets(self, request: HttpRequest, fieldsets: Any) -> list[Any]:
        """``fieldsets`` as this user may see them: payload-derived fields out, times formatted."""
        shown = [
            (title, {**opts, "fields": self._visible(request, opts["fields"])}) for title, opts in fieldsets
        ]
        return self.with_times_in_fieldsets([(title, opts) for title, opts in shown if opts["fields"]])

    def _visible(self, request: HttpRequest, names: Sequence[Any]) -> list[Any]:
        if not self.payload_derived_fields or can_view_payload(request):
            return list(names)
        return [name for name in names if name not in self.payload_derived_fields]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.visible_fieldsets(request, super().get_fieldsets(request, obj))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*super().get_readonly_fields(request, obj), *self._times.values()]

    # -- filters and search ----------------------------------------------------------------

    def offered_lookups(self, request: HttpRequest) -> set[str]:
        """The query-string lookups this change list's filters and links use."""
        offered = set(self.extra_lookups)
        for item in self.get_list_filter(request):
            if isinstance(item, type) and issubclass(item, SimpleListFilter):
                offered.add(str(item.parameter_name))
                continue
            name = item[0] if isinstance(item, list | tuple) else item
            offered.update(f"{name}{suffix}" for suffix in _FILTER_SUFFIXES)
        if self.date_hierarchy:
            offered.update(f"{self.date_hierarchy}{suffix}" for suffix in _HIERARCHY_SUFFIXES)
        return offered

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if lookup.split("__")[0] in self.payload_derived_fields and not can_view_payload(request):
            return False  # a filter by key would tell whether a guessed value exists
        return lookup in self.offered_lookups(request) and super().lookup_allowed(lookup, value, request)

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        fields = list(super().get_search_fields(request))
        if can_view_payload(request):
            fields += self.payload_search_fields
        return fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        if not self.search_whole_values or not search_term.strip():
            return super().get_search_results(request, queryset, search_term)
        fields = [field for field in self.get_search_fields(request) if field != "id"]
        matches: list[models.Q] = []
        for word in smart_split(search_term):
            if word[:1] in {'"', "'"} and word[0] == word[-1] and len(word) > 1:
                word = unescape_string_literal(word)
            if word.isdigit() and int(word) < 2**63:
                matches.append(models.Q(pk=int(word)))
            # A key stored as its blind index (a task with encrypt=True) is found by its value.
            matches += [
                search_filter(field, word) if field in BLIND_SEARCH_FIELDS else models.Q(**{field: word})
                for field in fields
            ]
        if not matches:
            return queryset.none(), False
        return queryset.filter(functools.reduce(operator.or_, matches)), False


#: Key fields that a task with encrypt=True stores as blind indexes: a whole-value search for
#: a business value matches its index too.
BLIND_SEARCH_FIELDS = frozenset({"idempotency_key", "lock_key", "key"})


def done_level(done: int) -> int:
    """The message level of an action's summary: success if it changed something, else a
    warning (a green box saying "0 jobs are due now" reads as if the refusal had worked)."""
    return messages.SUCCESS if done else messages.WARNING


def can_view_payload(request: HttpRequest) -> bool:
    """Whether the request's user may see payloads, results and tracebacks."""
    return dlq.can_view_payload(request.user)


def refusal(
    request: HttpRequest, admin: admin.ModelAdmin, title: str, message: str, *, status: int = 403
) -> TemplateResponse:
    """A 403 admin page that says why (instead of Django's bare "403 Forbidden").

    ``status=409`` for an action the object's state does not allow now.
    """
    context = {
        **admin.admin_site.each_context(request),
        "opts": admin.opts,
        "title": title,
        "message": message,
    }
    return TemplateResponse(request, "django_jobguard/admin/refused.html", context, status=status)


def pretty_json(value: Any) -> SafeString:
    """JSON indented in a ``<pre>`` block, escaped."""
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def pre(text: str) -> SafeString:
    return format_html("<pre>{}</pre>", text)


def admin_link(obj: Any, label: str | None = None) -> SafeString | str:
    """A link to ``obj``'s admin page, or ``-``."""
    if obj is None:
        return "-"
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, label or str(obj))


#: Characters of the change list's query string kept in a bulk action's admin-log entry.
SELECTION_CHARS = 500
#: Query-string parameters of a change list that select no rows (page, order, popups).
_NOT_FILTERS = frozenset({"p", "o", "_popup", "_to_field", "_changelist_filters"})


def selection_summary(request: HttpRequest) -> str:
    """What a change-list action ran on: the rows ticked, or every row the filters match."""
    if request.POST.get("select_across") != "1":
        return "rows ticked on the page"
    filters = QueryDict(mutable=True)
    for key, values in request.GET.lists():
        if key not in _NOT_FILTERS:
            filters.setlist(key, values)
    if not filters:
        return "select all, no filter"
    return f"select all matching {Truncator(filters.urlencode()).chars(SELECTION_CHARS)}"


def log_to_history(
    request: HttpRequest,
    model: type[models.Model],
    ids: Iterable[Any],
    message: str,
    *,
    using: str,
    selection: str | None = None,
) -> None:
    """Record an operator's action in Django's admin log (*Recent actions*, an object's *History*).

    One object: an entry on it, in its History. More: one entry for the whole action, with
    the count and what was selected (:func:`selection_summary`, or ``selection``), so a bulk
    action on 15,000 jobs is one line that does not bury the pauses and approvals around it
    in *Recent actions*. The service layer keeps each object's own audit trail.
    """
    pending = list(ids)
    user_id = request.user.pk
    if user_id is None or not pending:  # the admin views require a logged-in user
        return
    if len(pending) == 1:
        objects = list(model._default_manager.using(using).filter(pk=pending[0]))
        if objects:
            LogEntry.objects.log_actions(
                user_id=user_id, queryset=objects, action_flag=CHANGE, change_message=message
            )
        return
    opts = model._meta
    count = f"{len(pending):,} {opts.verbose_name_plural}"
    LogEntry.objects.create(
        user_id=user_id,
        content_type_id=ContentType.objects.get_for_model(model, for_concrete_model=False).pk,
        object_id=None,
        # The count first: Recent actions shows only this, and a long reason is cut at the end.
        object_repr=Truncator(f"{count}: {message}").chars(LOG_REPR_CHARS),
        action_flag=CHANGE,
        change_message=f"{message} ({count}; {selection or selection_summary(request)})",
    )


#: The length of ``LogEntry.object_repr``.
LOG_REPR_CHARS = 200
