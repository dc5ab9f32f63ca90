"""The ``CELERY_*`` settings the Celery compatibility module reads, as a Django project writes them."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from django.conf import settings

__all__ = ["broker_url", "broker_urls", "celery_setting", "priority_direction", "route_for"]


def celery_setting(name: str, default: Any = None) -> Any:
    """A Celery setting as a Django project writes it (``CELERY_<NAME>``), or ``default``."""
    if not settings.configured:
        return default
    return getattr(settings, f"CELERY_{name}", default)


#: Broker URLs given to ``Celery(main, broker=...)`` in this process (when no setting names one).
broker_urls: list[str] = []


def broker_url() -> str:
    """``CELERY_BROKER_URL``, else the ``broker=`` of a ``Celery()`` app; "" without either."""
    return str(celery_setting("BROKER_URL", "") or (broker_urls[0] if broker_urls else ""))


def priority_direction() -> str:
    """Which way Celery's priorities ran for this project: from its broker's URL (:func:`broker_url`).

    Redis runs 0 first ("lowest-first"); RabbitMQ runs the highest first
    ("highest-first", jobguard's own direction). Without a broker URL, "highest-first".
    """
    url = broker_url()
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
