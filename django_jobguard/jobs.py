"""Operator actions on jobs: :mod:`django_jobguard.operations.jobs`, under the path the docs use."""

from __future__ import annotations

from .operations.jobs import cancel, request_cancel, requeue_cancelled, retry_now, run_now

__all__ = ["cancel", "request_cancel", "requeue_cancelled", "retry_now", "run_now"]
