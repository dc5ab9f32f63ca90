"""Forms of the replay views: a reason always, a corrected payload when requesting."""

from __future__ import annotations

import datetime
import json
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.utils.translation import gettext_lazy as _

from ..dlq.patch import PatchError, PatchOperation, parse_patch
from ..models import DeadLetter


class ReplayDecisionForm(forms.Form):
    """Why: every replay transition records a reason in the audit trail."""

    reason = forms.CharField(
        label=_("Reason"),
        max_length=10_000,  # dlq.transitions.MAX_REASON_LENGTH
        # Focused on arrival: a keyboard user types the reason and submits, instead of tabbing
        # through the admin's menus and a bulk page's list (97 presses to reach it before).
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80, "autofocus": True}),
        help_text=_("Recorded in the audit trail with your name and the time."),
    )

    def payload(self) -> dict[str, Any]:
        return {}


class ReplayRequestForm(ReplayDecisionForm):
    """A replay request with the payload to run, pre-filled with the original one."""

    args = forms.CharField(
        label=_("args (JSON array)"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80, "class": "vLargeTextField"}),
    )
    kwargs = forms.CharField(
        label=_("kwargs (JSON object)"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 80, "class": "vLargeTextField"}),
        help_text=_(
            "Leave the payload as it is to replay the original; edit it to replay a corrected one. "
            "It must still fit the task's signature."
        ),
    )

    def _json(self, name: str, kind: type, empty: Any) -> Any:
        text = self.cleaned_data.get(name, "").strip()
        if not text:
            return empty
        try:
            value = json.loads(text, object_pairs_hook=_unique_keys)
        except _DuplicateKeyError as exc:
            raise forms.ValidationError(
                _("The key %(key)s appears twice; JSON keeps only the last, so say which one you mean."),
                params={"key": json.dumps(exc.key)},
            ) from None
        except ValueError as exc:
            raise forms.ValidationError(_("Not valid JSON: %(error)s"), params={"error": exc}) from None
        except RecursionError:
            # json.loads gives up on nesting deeper than the interpreter's recursion limit.
            raise forms.ValidationError(
                _("Nested too deeply to read; the limit is JOBGUARD['MAX_PAYLOAD_DEPTH'] levels.")
            ) from None
        if not isinstance(value, kind):
            raise forms.ValidationError(_("Must be a JSON %(kind)s."), params={"kind": _KINDS[kind]})
        return value

    def clean_args(self) -> list[Any]:
        value: list[Any] = self._json("args", list, [])
        return value

    def clean_kwargs(self) -> dict[str, Any]:
        value: dict[str, Any] = self._json("kwargs", dict, {})
        return value

    def payload(self) -> dict[str, Any]:
        return {"args": self.cleaned_data["args"], "kwargs": self.cleaned_data["kwargs"]}


_KINDS: dict[type, str] = {list: "array", dict: "object"}


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict, refusing a key given twice (json.loads would keep the last)."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise _DuplicateKeyError(key)
        value[key] = item
    return value


def dumps(value: Any) -> str:
    """JSON for a form field: indented, keys sorted, non-ASCII kept."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


class ForceReleaseForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why the lock must go now (kept in the audit trail): e.g. its job died, the TTL is long.",
    )


class RedriveRateForm(forms.Form):
    """The redrive rate every worker applies, set from the console (dlq.set_rate)."""

    rate_per_minute = forms.IntegerField(
        label=_("Replays a minute"),
        required=False,
        min_value=1,
        max_value=60_000,  # dlq.MAX_RATE_PER_MINUTE
        help_text=_("Across all workers. Leave empty to go back to JOBGUARD['REPLAY']['RATE_PER_MINUTE']."),
    )
    reason = forms.CharField(
        label=_("Reason"),
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text=_("Recorded with your name and the time."),
    )


#: The most dead letters "the first N" selects at once.
BATCH_MAX = 50_000


class BatchForm(forms.Form):
    """Narrows a bulk replay's selection: the first N (oldest failure first), last failed between A and B."""

    first = forms.IntegerField(
        label=_("Only the first"),
        required=False,
        min_value=1,
        max_value=BATCH_MAX,
        help_text=_("Dead letters, the oldest last failure first. Empty: all of them."),
    )
    failed_from = forms.DateTimeField(
        label=_("Last failed from (UTC)"),
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"),
    )
    failed_to = forms.DateTimeField(
        label=_("Last failed before (UTC)"),
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"),
    )

    def _utc(self, name: str) -> datetime.datetime | None:
        value: datetime.datetime | None = self.cleaned_data.get(name)
        if value is None:
            return None
        # The console shows times in UTC: what is typed is UTC, whatever TIME_ZONE says.
        return value.replace(tzinfo=datetime.UTC) if value.tzinfo is None else value

    def clean_failed_from(self) -> datetime.datetime | None:
        return self._utc("failed_from")

    def clean_failed_to(self) -> datetime.datetime | None:
        return self._utc("failed_to")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, end = data.get("failed_from"), data.get("failed_to")
        if start is not None and end is not None and start >= end:
            raise forms.ValidationError(_("'Last failed from' must be before 'Last failed before'."))
        return data

    @property
    def narrows(self) -> bool:
        return self.is_valid() and any(self.cleaned_data.get(k) is not None for k in self.fields)

    def narrow(self, queryset: QuerySet[DeadLetter]) -> QuerySet[DeadLetter]:
        """``queryset`` cut to the batch: the time range, then the first N of it (one filter, no id list)."""
        if not self.is_valid():
            return queryset
        start, end, first = (self.cleaned_data.get(k) for k in ("failed_from", "failed_to", "first"))
        if start is not None:
            queryset = queryset.filter(last_failed_at__gte=start)
        if end is not None:
            queryset = queryset.filter(last_failed_at__lt=end)
        if first is not None:
            # The Nth letter's (last_failed_at, id) bounds the batch, so "select all" of any
            # size stays a filter the confirmation page posts back.
            last = queryset.order_by("last_failed_at", "id").values_list("last_failed_at", "id")[
                first - 1 : first
            ]
            edge = next(iter(last), None)
            if edge is not None:
                queryset = queryset.filter(
                    Q(last_failed_at__lt=edge[0]) | Q(last_failed_at=edge[0], id__lte=edge[1])
                )
        return queryset


class PatchField(forms.CharField):
    """One correction for every selected dead letter: a JSON Patch of kwargs (dlq.parse_patch)."""

    def clean(self, value: Any) -> list[PatchOperation] | None:
        text = (super().clean(value) or "").strip()
        if not text:
            return None
        try:
            return parse_patch(text)
        except PatchError as exc:
            raise forms.ValidationError(str(exc)) from None


class BulkCorrectionForm(ReplayDecisionForm):
    """A bulk replay request with one correction for every selected dead letter."""

    patch = PatchField(
        label=_("Correction (JSON Patch)"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80, "class": "vLargeTextField"}),
        help_text=_(
            'Optional: applied to each dead letter\'s kwargs, e.g. [{"op": "replace", "path": '
            '"/kwargs/amount", "value": 500}]. Operations add, replace and remove. Each replay is '
            "then approved with its own corrected payload shown."
        ),
    )
