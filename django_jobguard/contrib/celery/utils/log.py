"""``celery.utils.log``'s loggers: ``from celery.utils.log import get_task_logger`` keeps working."""

from __future__ import annotations

import logging

__all__ = ["get_logger", "get_task_logger"]


def get_task_logger(name: str) -> logging.Logger:
    """The logger ``name``, configured by Django's ``LOGGING`` as any other.

    Celery's is a child of its ``celery.task`` logger, whose format adds the task's name and
    id; jobguard's worker logs each job's start, retry and outcome with its id itself.
    """
    return logging.getLogger(name)


def get_logger(name: str) -> logging.Logger:
    """The logger ``name`` (Celery's ``get_logger``)."""
    return logging.getLogger(name)
