"""Forms of the replay views: a reason always, a corrected payload when requesting."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _


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
