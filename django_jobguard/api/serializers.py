"""What goes in and out of the API. Payload fields (args, kwargs, results, tracebacks, and what
is made of them or echoes them: idempotency keys and error messages) are left out of every response unless
the user holds ``jobguard.view_payload``.

The input serializers only parse and bound the request; the rules (which task, whether the
arguments bind, the replay states and permissions) are the service layer's.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import dlq
from ..conf import get_settings
from ..encryption import is_encrypted
from ..encryption.payloads import (
    ARGS,
    ERROR,
    KWARGS,
    PROGRESS,
    RESULT,
    TRACEBACK,
    readable_json,
    readable_text,
)
from ..models import DeadLetter, Job, JobStatus, ReplayEvent
from ..task import MAX_PRIORITY, MIN_PRIORITY, valid_datetime
from .problems import json_depth

__all__ = [
    "DeadLetterDetailSerializer",
    "DeadLetterSerializer",
    "EnqueueSerializer",
    "JobFilterSerializer",
    "JobProgressSerializer",
    "JobSerializer",
    "ProblemSerializer",
    "QueueSerializer",
    "ReasonSerializer",
    "ReplayEventSerializer",
    "ReplayRequestSerializer",
]


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    if isinstance(value, dict):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    return False


def check_payload(args: Any, kwargs: Any) -> None:
    """Refuse a payload over ``JOBGUARD["API"]["MAX_PAYLOAD_BYTES"]``, too deep, or holding NUL.

    A small check of the API's own: once the shared payload validator of the enqueue path
    is merged, call it from here instead (it applies the same limits to every caller).
    """
    limits = get_settings().api
    errors: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for name, value in (("args", args), ("kwargs", kwargs)):
        if value is None:
            continue
        text = json.dumps(value, separators=(",", ":"))
        sizes[name] = len(text.encode())
        if json_depth(text) > limits.max_depth:
            errors[name] = [
                f'{name} is nested deeper than {limits.max_depth} levels (JOBGUARD["API"]["MAX_DEPTH"]).'
            ]
        elif _has_nul(value):
            # PostgreSQL's jsonb cannot store U+0000; refusing it everywhere keeps databases alike.
            errors[name] = [f"{name} holds a string with a NUL character (U+0000), which cannot be stored."]
    total = sum(sizes.values())
    if not errors and total > limits.max_payload_bytes:
        biggest = max(sizes, key=sizes.__getitem__)
        errors[biggest] = [
            f"args and kwargs take {total} bytes as JSON, more than the {limits.max_payload_bytes} "
            'allowed (JOBGUARD["API"]["MAX_PAYLOAD_BYTES"]).'
        ]
    if errors:
        raise serializers.ValidationError(errors, code="invalid_payload")


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime with a UTC offset; a naive one is refused, not guessed."""

    default_error_messages = {
        "invalid": "Must be an ISO 8601 datetime, such as 2030-01-01T12:00:00Z.",
        "naive": "Must include a UTC offset (Z or +01:00): a naive datetime is ambiguous.",
        "out_of_range": "Must be a time between the years 1 and 9999 in UTC.",
    }

    def to_internal_value(self, value: Any) -> Any:
        if not isinstance(value, str):
            self.fail("invalid")
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
        if parsed is None:
            self.fail("invalid")
            raise AssertionError  # unreachable: fail() raises; tells mypy parsed is set below
        if parsed.tzinfo is None or parsed.utcoffset() is None:
            self.fail("naive")
        try:
            out_of_range = not valid_datetime(parsed)
        except OverflowError:
            out_of_range = True
        if out_of_range:
            self.fail("out_of_range")
        # In UTC: ISO 8601 allows offsets up to ±23:59, PostgreSQL refuses those past ±15:59.
        return parsed.astimezone(datetime.UTC)


class RunAfterField(AwareDateTimeField):
    """A ``run_after`` within ``JOBGUARD["API"]``'s window around now (past and future bounds)."""

    default_error_messages = {
        **AwareDateTimeField.default_error_messages,
        "window": "Must lie between {earliest} and {latest}: at most {past} seconds before now and "
        "{future} seconds after (JOBGUARD['API']['RUN_AFTER_PAST'] and ['RUN_AFTER_FUTURE']).",
    }

    def to_internal_value(self, value: Any) -> Any:
        parsed = super().to_internal_value(value)
        api = get_settings().api
        now = timezone.now()
        earliest = now - datetime.timedelta(seconds=api.run_after_past)
        latest = now + datetime.timedelta(seconds=api.run_after_future)
        if not earliest <= parsed <= latest:
            self.fail(
                "window",
                earliest=earliest.isoformat(timespec="seconds"),
                latest=latest.isoformat(timespec="seconds"),
                past=f"{api.run_after_past:g}",
                future=f"{api.run_after_future:g}",
            )
        return parsed


class ProblemSerializer(serializers.Serializer):
    """An RFC 9457 problem-details body (``application/problem+json``)."""

    type = serializers.CharField(read_only=True, help_text="Always about:blank: see status and code.")
    title = serializers.CharField(read_only=True, help_text="The HTTP status phrase.")
    status = serializers.IntegerField(read_only=True)
    detail = serializers.CharField(read_only=True, help_text="What went wrong, for people.")
    code = serializers.CharField(
        read_only=True, help_text="What went wrong, for programs: invalid, idempotency_conflict, ..."
    )
    # DRF's metaclass takes declared fields off the class, so Serializer.errors stays intact.
    errors = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Validation errors only: field name → messages.",
    )


# -- jobs -----------------------------------------------------------------------------------------

_JOB_FIELDS = [
    "id",
    "task_name",
    "queue_name",
    "status",
    "priority",
    "run_after",
    "attempts",
    "max_attempts",
    "enqueued_at",
    "started_at",
    "finished_at",
    "first_failed_at",
    "last_error",
    "idempotency_key",
    "lock_key",
    "handler_version",
    "worker_id",
    "reappearances",
    "lock_contentions",
]


#: What the OpenAPI document says of each field in :attr:`_PayloadHiding.payload_fields`.
PAYLOAD_FIELD_NOTE = "Omitted without the jobguard.view_payload permission."


class _PayloadHiding(serializers.Serializer):
    """Drops :attr:`payload_fields` unless the context says ``show_payload`` (the OpenAPI
    document marks them optional, with :data:`PAYLOAD_FIELD_NOTE`: see ``schema.py``)."""

    payload_fields: tuple[str, ...] = ()

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        if not self.context.get("show_payload", False):
            for name in self.payload_fields:
                data.pop(name, None)
        elif isinstance(instance, Job | DeadLetter):
            # Encrypted at rest: opened for those who may see payloads, and only for them.
            for name in self.payload_fields:
                stored = getattr(instance, name, None)
                if name in data and name in _SEALED_KINDS and is_encrypted(stored):
                    field, kind = _SEALED_KINDS[name]
                    where = f"{instance._meta.model_name}.{name}"
                    data[name] = (
                        readable_json(stored, field, where)
                        if kind == "json"
                        else readable_text(str(stored), field, where)
                    )
        return data


#: The payload fields that may be stored encrypted: the value's kind, and JSON or text.
_SEALED_KINDS = {
    "args": (ARGS, "json"),
    "kwargs": (KWARGS, "json"),
    "replay_args": (ARGS, "json"),
    "replay_kwargs": (KWARGS, "json"),
    "result": (RESULT, "json"),
    "last_error": (ERROR, "text"),
    "error_message": (ERROR, "text"),
    "traceback": (TRACEBACK, "text"),
}


@extend_schema_field({"type": "number", "minimum": 0})
class ProgressAmountField(serializers.Field):
    """A reported amount as stored: an integer stays one (a FloatField would send 3 as 3.0)."""

    def to_representation(self, value: Any) -> Any:
        return value


class JobProgressSerializer(_PayloadHiding, serializers.Serializer):
    """What the job's handler last reported (``context.report_progress``); the message only
    with ``jobguard.view_payload`` (a handler's words may echo its arguments)."""

    payload_fields = ("message",)

    done = ProgressAmountField(help_text="How much is done.")
    total = ProgressAmountField(allow_null=True, help_text="How much there is in all; null if unknown.")
    message = serializers.CharField(help_text="What the handler said with it; may be empty.")
    at = serializers.DateTimeField(
        allow_null=True, help_text="When the handler reported it (the worker's clock, UTC)."
    )

    def to_representation(self, instance: Any) -> Any:
        # The column may be written by hand: anything but a report of ours reads as none.
        if not isinstance(instance, dict) or not _is_amount(instance.get("done")):
            return None
        total = instance.get("total")
        report = {
            "done": instance["done"],
            "total": total if _is_amount(total) else None,
            "message": _progress_message(instance, self.context.get("show_payload", False)),
            "at": instance["at"] if isinstance(instance.get("at"), str) else None,
        }
        return super().to_representation(report)


def _progress_message(progress: dict[str, Any], show_payload: bool) -> str:
    """The reported message: opened (if encrypted) only for those who may see it."""
    message = progress.get("message")
    if not isinstance(message, str):
        return ""
    return readable_text(message, PROGRESS, "job.progress.message") if show_payload else message


def _is_amount(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class JobSerializer(_PayloadHiding, serializers.ModelSerializer):
    """A job; payload fields only with ``jobguard.view_payload``.

    Besides ``args``, ``kwargs`` and ``result``, the idempotency key (made of the arguments)
    and the last error (which often echoes them). The lock key names a resource, as the locks
    admin does: it stays.
    """

    payload_fields = ("args", "kwargs", "result", "idempotency_key", "last_error")

    args = serializers.ListField(child=serializers.JSONField(), required=False)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False)
    result = serializers.JSONField(required=False, allow_null=True)
    progress = JobProgressSerializer(
        read_only=True, allow_null=True, help_text="What the handler last reported; null if nothing."
    )

    class Meta:
        model = Job
        fields = [*_JOB_FIELDS, "args", "kwargs", "result", "progress"]
        read_only_fields = _JOB_FIELDS


class JobFilterSerializer(serializers.Serializer):
    """Filters of ``GET jobs/`` (all optional, combined with AND)."""

    status = serializers.ChoiceField(choices=JobStatus.choices, required=False)
    queue_name = serializers.CharField(max_length=100, required=False)
    task_name = serializers.CharField(max_length=255, required=False)
    idempotency_key = serializers.CharField(max_length=255, required=False)


class EnqueueSerializer(serializers.Serializer):
    """``POST jobs/``: one call of a task declared ``@task(api=True)``."""

    task = serializers.CharField(
        max_length=255,
        help_text="The task's registered name (its dotted path). A name not registered and a task "
        "not declared @task(api=True) get the same 400 (code unknown_task): the task is not "
        "available through the API.",
    )
    args = serializers.ListField(
        child=serializers.JSONField(),
        required=False,
        default=list,
        help_text="The positional arguments (none when left out). Refused with 400 naming the field: "
        "null instead of the list, null as an argument (args.0; a null inside a list or an object "
        "argument is kept), a string holding a NUL character (U+0000) at any depth, a payload "
        "nested deeper or larger than JOBGUARD['API'] allows, arguments that do not bind to the "
        "task's signature.",
    )
    kwargs = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        default=dict,
        help_text="The keyword arguments (none when left out). Refused with 400 naming the field: "
        "null instead of the object, null as a value (kwargs.<name>; a null inside a list or an "
        "object value is kept), a string holding a NUL character (U+0000) at any depth, as key or "
        "value, and the rest as for args.",
    )
    queue_name = serializers.CharField(
        max_length=100,
        required=False,
        help_text="Another declared queue than the task's own, if the task allows it "
        "(@task(api={'queue_name': True})).",
    )
    priority = serializers.IntegerField(
        min_value=MIN_PRIORITY,
        max_value=MAX_PRIORITY,
        required=False,
        help_text="Higher runs first: at most the task's own priority, or its api max_priority.",
    )
    run_after = RunAfterField(required=False, help_text="Not before this time: ISO 8601 with a UTC offset.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        check_payload(attrs.get("args"), attrs.get("kwargs"))
        return attrs


# -- dead letters and replays ----------------------------------------------------------------------


class ReplayEventSerializer(serializers.ModelSerializer):
    """One step of the replay audit trail; corrected payloads only with ``jobguard.view_payload``."""

    actor = serializers.SerializerMethodField()
    # As with ProblemSerializer.errors: the field does not replace Serializer.data.
    data = serializers.SerializerMethodField()  # type: ignore[assignment]

    class Meta:
        model = ReplayEvent
        fields = ["id", "action", "actor", "reason", "data", "created_at"]
        read_only_fields = fields

    def get_actor(self, event: ReplayEvent) -> str:
        """The user's name as it was, or "system" for a worker's redrive."""
        return event.actor_name or "system"

    def get_data(self, event: ReplayEvent) -> dict[str, Any]:
        """Details of the step (whether the payload was corrected, the new job...)."""
        return dlq.visible_event_data(event.data, self.context.get("show_payload", False))


_LETTER_FIELDS = [
    "id",
    "job_id",
    "task_name",
    "queue_name",
    "attempts",
    "max_attempts",
    "reason",
    "category",
    "error_class",
    "error_message",
    "first_failed_at",
    "last_failed_at",
    "handler_version",
    "worker_id",
    "idempotency_key",
    "lock_key",
    "created_at",
    "replay_state",
    "replay_requested_by",
    "replay_requested_at",
    "replay_reason",
    "replay_decided_by",
    "replay_decided_at",
    "replay_job_id",
    "replayed_at",
]


class DeadLetterSerializer(_PayloadHiding, serializers.ModelSerializer):
    """A dead letter; payloads, keys, error message and traceback only with ``jobguard.view_payload``."""

    payload_fields = (
        "args",
        "kwargs",
        "replay_args",
        "replay_kwargs",
        "traceback",
        "error_message",
        "idempotency_key",
    )

    job_id = serializers.IntegerField(read_only=True, allow_null=True)
    replay_job_id = serializers.IntegerField(read_only=True, allow_null=True)
    replay_requested_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    replay_decided_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    args = serializers.ListField(child=serializers.JSONField(), required=False)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False)
    replay_args = serializers.ListField(child=serializers.JSONField(), required=False, allow_null=True)
    replay_kwargs = serializers.DictField(child=serializers.JSONField(), required=False, allow_null=True)
    traceback = serializers.CharField(required=False)

    class Meta:
        model = DeadLetter
        fields = [*_LETTER_FIELDS, "args", "kwargs", "replay_args", "replay_kwargs", "traceback"]
        read_only_fields = _LETTER_FIELDS


class DeadLetterDetailSerializer(DeadLetterSerializer):
    """A dead letter with its replay audit trail and the replay steps the user may take now."""

    replay_events = serializers.SerializerMethodField()
    available_actions = serializers.SerializerMethodField()
    correction_digest = serializers.SerializerMethodField()

    class Meta(DeadLetterSerializer.Meta):
        fields = [
            *DeadLetterSerializer.Meta.fields,
            "replay_events",
            "available_actions",
            "correction_digest",
        ]
        read_only_fields = [*_LETTER_FIELDS, "replay_events", "available_actions", "correction_digest"]

    def get_correction_digest(self, letter: DeadLetter) -> str:
        """What a replay would run, keyed digest: send it back with an approval to bind it to this review."""
        return dlq.correction_digest(letter)

    def get_replay_events(self, letter: DeadLetter) -> list[dict[str, Any]]:
        """Every step of the replay, oldest first."""
        events: Any = ReplayEventSerializer(letter.replay_events.all(), many=True, context=self.context)
        return list(events.data)

    def get_available_actions(self, letter: DeadLetter) -> list[str]:
        """The transitions (request, approve, reject) the user may make now; each call checks again."""
        return dlq.available_actions(letter, self.context.get("user"))


class ReasonSerializer(serializers.Serializer):
    """``approve/`` and ``reject/``: the reason goes into the audit trail."""

    reason = serializers.CharField(max_length=10_000, help_text="Why; required, kept in the audit trail.")


class ApproveSerializer(ReasonSerializer):
    """``approve/``: a reason, and the correction digest the approver reviewed."""

    correction_digest = serializers.CharField(
        max_length=64,
        required=False,
        help_text="The dead letter's correction_digest as you reviewed it; required when the dead "
        "letter carries a corrected payload (400 without it). If the payload changed since, the "
        "approval is refused (409, code payload_changed).",
    )


class ReplayRequestSerializer(ReasonSerializer):
    """``request-replay/``: a reason, and optionally a corrected payload (needs ``jobguard.view_payload``)."""

    args = serializers.ListField(child=serializers.JSONField(), required=False)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        check_payload(attrs.get("args"), attrs.get("kwargs"))
        return attrs


# -- queues ---------------------------------------------------------------------------------------


class QueueSerializer(serializers.Serializer):
    """The figures ``jobguard_status`` shows for one queue."""

    queue = serializers.CharField(read_only=True)
    depth = serializers.IntegerField(read_only=True, help_text="Queued jobs that are due.")
    scheduled = serializers.IntegerField(read_only=True, help_text="Queued jobs with a future run_after.")
    in_flight = serializers.IntegerField(read_only=True, help_text="Running jobs whose lease is live.")
    stuck = serializers.IntegerField(
        read_only=True, help_text="Running jobs whose lease expired, until the reaper hands them back."
    )
    oldest_age_seconds = serializers.FloatField(
        read_only=True, help_text="Seconds the oldest due job has waited."
    )
    dead_letters = serializers.IntegerField(
        read_only=True, help_text="Dead letters not replayed or rejected."
    )
    pending_approvals = serializers.IntegerField(read_only=True, help_text="Replays awaiting approval.")
    succeeded_last_hour = serializers.IntegerField(read_only=True)
    failed_last_hour = serializers.IntegerField(read_only=True)


class LimitSerializer(serializers.Serializer):
    """The figures ``jobguard_status`` shows for one flow-control limit."""

    limit = serializers.CharField(
        read_only=True,
        help_text="queue:<name>, task:<task>, limit:<name>, rate:task:<task>, rate:limit:<name>, "
        "or <task>[<key template>] for a keyed one.",
    )
    kind = serializers.ChoiceField(choices=["concurrency", "rate"], read_only=True)
    bound = serializers.CharField(read_only=True, help_text="Jobs at once (per key), or the rate and burst.")
    running = serializers.IntegerField(read_only=True, help_text="Running jobs counted under it.")
    full_keys = serializers.IntegerField(read_only=True, help_text="Keys at their bound.")
    waiting = serializers.IntegerField(read_only=True, help_text="Due queued jobs counted under it.")


class BreakerSerializer(serializers.Serializer):
    """A named limit's circuit breaker and retry budget, as ``jobguard_status`` shows them."""

    limit = serializers.CharField(read_only=True, help_text="The JOBGUARD['LIMITS'] entry.")
    state = serializers.ChoiceField(
        choices=["closed", "open", "half_open"],
        read_only=True,
        help_text="open: its jobs wait unclaimed; half_open: probes only.",
    )
    manual = serializers.BooleanField(read_only=True, help_text="Opened or closed by an operator.")
    opens_in = serializers.FloatField(
        read_only=True, allow_null=True, help_text="Seconds until an open breaker half-opens."
    )
    calls = serializers.IntegerField(read_only=True, help_text="Attempts that ended in the current window.")
    failures = serializers.IntegerField(read_only=True, help_text="Of those, transient failures.")
    breaker = serializers.CharField(read_only=True, help_text="The declared breaker, or empty.")
    budget = serializers.CharField(read_only=True, help_text="The declared retry budget, or empty.")
    first_attempts = serializers.IntegerField(read_only=True, help_text="First attempts in the window.")
    retries = serializers.IntegerField(read_only=True, help_text="Retries started in the window.")
    budget_remaining = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Retries the window still allows."
    )
    waiting = serializers.IntegerField(read_only=True, help_text="Due queued jobs of its tasks.")
    waiting_retries = serializers.IntegerField(read_only=True, help_text="Of those, retries.")
    changed_at = serializers.CharField(read_only=True, allow_null=True)
    changed_by = serializers.CharField(read_only=True)
    reason = serializers.CharField(read_only=True)


class WorkflowMemberSerializer(serializers.Serializer):
    """A member of a workflow: its job id, task, status and reported progress."""

    id = serializers.IntegerField()
    task_name = serializers.CharField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    progress = JobProgressSerializer(
        allow_null=True, help_text="What its handler last reported; null if nothing."
    )


class WorkflowCallbackSerializer(serializers.Serializer):
    """A callback a finished workflow enqueued: when it runs (success, complete, dead) and its job."""

    when = serializers.CharField()
    job_id = serializers.IntegerField()


class WorkflowSerializer(serializers.Serializer):
    """A chain, group, batch or dependency graph: its state, progress, callbacks and first members."""

    id = serializers.IntegerField()
    kind = serializers.CharField()
    state = serializers.CharField(help_text="open (members may be added), closed, or finished.")
    name = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    closed_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    total = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="Members dead-lettered or cancelled.")
    pending = serializers.IntegerField()
    callbacks = WorkflowCallbackSerializer(many=True)
    members = WorkflowMemberSerializer(many=True, help_text="The first members, by job id.")


class WorkflowCancelSerializer(serializers.Serializer):
    """``POST workflows/{id}/cancel/``: an optional reason, kept in each cancelled member's ``last_error``."""

    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class WorkflowCancelResultSerializer(serializers.Serializer):
    """What a workflow's cancel did."""

    workflow_id = serializers.IntegerField()
    cancelled = serializers.ListField(
        child=serializers.IntegerField(), help_text="Members (and their dependents) cancelled."
    )
    asked_to_stop = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Running members asked to stop (their handlers see it at the next heartbeat).",
    )
    closed = serializers.BooleanField(help_text="Whether an open batch was closed.")


class WorkflowRetrySerializer(serializers.Serializer):
    """``POST workflows/{id}/retry-failed/``: the reason goes into each replay's audit trail."""

    reason = serializers.CharField(max_length=1000, help_text="Why; required, kept in the audit trail.")


class RefusedMemberSerializer(serializers.Serializer):
    """A member left alone, and why."""

    job_id = serializers.IntegerField()
    reason = serializers.CharField()


class WorkflowRetryResultSerializer(serializers.Serializer):
    """What retrying a workflow's failed members did."""

    workflow_id = serializers.IntegerField()
    requeued = serializers.ListField(
        child=serializers.IntegerField(), help_text="Cancelled members queued (or waiting) again."
    )
    replays_requested = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Dead letters of dead members whose replay now awaits another user's approval.",
    )
    awaiting_approval = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Dead letters whose replay was requested or approved before.",
    )
    refused = RefusedMemberSerializer(many=True, help_text="Members left alone, each with why.")
