"""Pausing and resuming queues: :mod:`django_jobguard.operations.queues`, under the path the docs use."""

from __future__ import annotations

from .operations.queues import (
    MAX_QUEUE_NAME_LENGTH,
    MAX_REASON_LENGTH,
    PERMISSION,
    QueueChange,
    can_pause,
    pause,
    paused_queues,
    resume,
    states,
)

__all__ = [
    "MAX_QUEUE_NAME_LENGTH",
    "MAX_REASON_LENGTH",
    "PERMISSION",
    "QueueChange",
    "can_pause",
    "pause",
    "paused_queues",
    "resume",
    "states",
]
