"""Django admin for jobs, dead letters and idempotency keys (read-only views of the queue)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import DeadLetter, IdempotencyKey, Job


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows change through the worker and the service layer, never by hand in a form."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "task_name",
        "queue_name",
        "status",
        "priority",
        "attempts",
        "run_after",
        "finished_at",
    ]
    list_filter = ["status", "queue_name", "task_name"]
    search_fields = ["=id", "task_name", "idempotency_key", "lock_key"]
    date_hierarchy = "enqueued_at"
    ordering = ["-id"]
    show_full_result_count = False  # a count(*) over millions of finished rows is slow


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "task_name",
        "queue_name",
        "reason",
        "error_class",
        "attempts",
        "replay_state",
        "created_at",
    ]
    list_filter = ["replay_state", "reason", "queue_name", "task_name", "error_class", "created_at"]
    search_fields = ["=id", "task_name", "error_message", "idempotency_key"]


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = ["key", "scope", "status", "duplicates", "job", "created_at", "expires_at"]
    list_filter = ["status", "scope"]
    search_fields = ["key"]
    raw_id_fields = ["job"]
