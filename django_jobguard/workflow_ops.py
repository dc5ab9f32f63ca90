"""Operator actions on a workflow: :mod:`django_jobguard.operations.workflows`, under the docs' path."""

from __future__ import annotations

from .operations.workflows import (
    CANCEL_PERMISSION,
    CHUNK,
    REPLAY_PERMISSION,
    RETRY_PERMISSION,
    CancelResult,
    RetryResult,
    cancel,
    retry_failed,
)

__all__ = [
    "CANCEL_PERMISSION",
    "CHUNK",
    "REPLAY_PERMISSION",
    "RETRY_PERMISSION",
    "CancelResult",
    "RetryResult",
    "cancel",
    "retry_failed",
]
