"""The ``CELERY_*`` settings the Celery compatibility module reads, as a Django project writes them."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from django.conf import settings

__all__ = ["celery_setting", "priority_direction", "route_for"]


def celery_setting(name: str, default: Any = None) -> Any:
    """A Celery setting as a Django project writes it (``CELERY_<NAME>``), or ``default``."""
    if not settings.configured:
        return default
    return getattr(settings, f"CELERY_{name}", default)


def priority_direction() -> str:
    """Which way Celery's priorities ran for this project: from ``CELERY_BROKER_URL``.

    Redis runs 0 first ("lowest-first"); RabbitMQ runs the highest first
    ("highest-first", jobguard's own direction). Without a broker URL, "highest-first".
    """
    url = str(celery_setting("BROKER_URL", "") or "")
    scheme = url.split("://", 1)[0].lower()
    if scheme in ("redis", "rediss", "sentinel", "redis+socket"):
        return "lowest-first"
    return "highest-first"


def route_for(name: str) -> str | None:
    """The queue ``CELERY_TASK_ROUTES`` sends the task to (exact names, then glob patterns), or None."""
    routes = celery_setting("TASK_ROUTES", None) or {}
    if isinstance(routes, list | tuple):
        merged: dict[str, Any] = {}
        for item in routes:
            if isinstance(item, Mapping):
                merged.update(item)
        routes = merged
    if not isinstance(routes, Mapping):
        return None
    route = routes.get(name)
    if route is None:
        route = next((value for pattern, value in routes.items() if fnmatch.fnmatchcase(name, pattern)), None)
    if isinstance(route, Mapping):
        queue = route.get("queue")
        return queue if isinstance(queue, str) and queue else None
    return None
