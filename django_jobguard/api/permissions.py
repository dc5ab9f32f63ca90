"""Who may call which endpoint: Django model permissions, denied unless a view names one."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from .. import dlq

__all__ = ["JobguardPermission", "can_view_payload"]


class JobguardPermission(BasePermission):
    """Allow a request only if its user holds every permission the view lists for its method.

    Views declare ``required_permissions = {"GET": ("jobguard.view_job",), ...}``; a method
    the view does not list is refused, and so is an anonymous user (401 or 403, as the
    project's authentication classes decide).
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        method = (request.method or "").lower()
        if method not in getattr(view, "http_method_names", ()) or not hasattr(view, method):
            return True  # no such operation: let DRF answer 405, which grants nothing
        required = getattr(view, "required_permissions", {}).get(request.method or "")
        if required is None:
            # OPTIONS and HEAD follow GET; anything else not listed is denied.
            required = view.required_permissions.get("GET") if request.method in ("OPTIONS", "HEAD") else None
        if required is None:
            return False
        user = request.user
        return bool(user and user.is_authenticated and all(user.has_perm(perm) for perm in required))


def can_view_payload(request: Request) -> bool:
    """Whether the request's user may see args, kwargs, results and tracebacks (the admin's rule)."""
    return dlq.can_view_payload(request.user)
