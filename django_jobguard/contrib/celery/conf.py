"""The ``CELERY_*`` settings the Celery compatibility module reads, as a Django project writes them."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

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


def route_for(
    name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *, task: Any = None
) -> str | None:
    """The queue ``CELERY_TASK_ROUTES`` sends the task to, or None.

    As Celery reads it: a dict (exact names, then glob patterns), a router function
    ``(name, args, kwargs, options, task=None, **kw)`` or its dotted path, or a list of these,
    asked in order until one answers. A route is a dict with ``"queue"`` or a queue's name.
    """
    routes = celery_setting("TASK_ROUTES", None) or ()
    for router in routes if isinstance(routes, list | tuple) else (routes,):
        if isinstance(router, str):
            router = import_string(router)
        if isinstance(router, Mapping):
            route = router.get(name)
            if route is None:
                route = next(
                    (value for pattern, value in router.items() if fnmatch.fnmatchcase(name, pattern)), None
                )
        elif callable(router):
            route = router(name, list(args), dict(kwargs or {}), {}, task=task)
        else:
            continue
        if isinstance(route, Mapping):
            route = route.get("queue")
        if isinstance(route, str) and route:
            return route
    return None
