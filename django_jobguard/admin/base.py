"""What every jobguard admin shares: read-only rows, and payloads shown only with permission."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import dlq


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows change through the worker and the service layer, never by hand in a form."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def can_view_payload(request: HttpRequest) -> bool:
    """Whether the request's user may see payloads, results and tracebacks."""
    return dlq.can_view_payload(request.user)


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
