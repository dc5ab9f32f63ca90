"""Sentry: each dead letter reported once, as an error with the job's context.

Add the integration where you call ``sentry_sdk.init`` (extra: ``[sentry]``)::

    sentry_sdk.init(dsn=..., integrations=[JobguardIntegration()])

A failed attempt that will be retried is not an error yet (the retry is what a transient
failure is for); the attempt that dead-letters the job is, whatever made it (a permanent
error, attempts exhausted, a lease that expired, a payload the handler cannot take). It is
reported once, when the dead letter commits. Tags: ``jobguard.task``, ``jobguard.queue``,
``jobguard.attempt``, ``jobguard.job_id``, ``jobguard.dead_letter_reason``; the payload is
sent only with ``JobguardIntegration(send_payload=True)`` (with ``JOBGUARD["REDACT"]``
values replaced).

A dead letter of a task whose data is encrypted at rest (``@task(encrypt=True)``) sends none of
it in clear: its error message, traceback and payload (even with ``send_payload=True``) are
replaced by :data:`NOT_SENT`, and neither is its ciphertext sent. Its error class, tags and
keys (blind indexes, ``h:...``) are, as for any other task.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

import sentry_sdk
from sentry_sdk.integrations import Integration

from .. import signals
from .._redact import payload_secrets, redact
from ..encryption import is_encrypted

if TYPE_CHECKING:
    from sentry_sdk._types import Event

__all__ = ["NOT_SENT", "JobguardIntegration"]

#: What an event holds in place of a value stored encrypted (see the module's docstring).
NOT_SENT = "(encrypted at rest: not sent to Sentry)"


class JobguardIntegration(Integration):
    """Reports dead letters to Sentry (see the module's docstring)."""

    identifier = "django_jobguard"

    def __init__(self, *, send_payload: bool = False) -> None:
        #: Whether events carry the job's arguments (off by default: they may hold personal data).
        self.send_payload = send_payload

    @staticmethod
    def setup_once() -> None:
        signals.job_dead_lettered.connect(_report_dead_letter, dispatch_uid="jobguard_sentry_dead_letter")


def _report_dead_letter(sender: Any, dead_letter: Any, **kwargs: Any) -> None:
    integration = sentry_sdk.get_client().get_integration(JobguardIntegration)
    if integration is None:  # Sentry is not set up in this process, or without this integration
        return
    event = dead_letter_event(dead_letter, send_payload=integration.send_payload)
    sentry_sdk.capture_event(cast("Event", event))


def dead_letter_event(letter: Any, *, send_payload: bool = False) -> dict[str, Any]:
    """The Sentry event of one dead letter: its error, tags and the job's context."""
    module, _, name = letter.error_class.rpartition(".")
    context: dict[str, Any] = {
        "dead_letter_id": letter.pk,
        "job_id": letter.job_id,
        "attempts": letter.attempts,
        "max_attempts": letter.max_attempts,
        "error_category": letter.category,
        "worker_id": letter.worker_id,
        "handler_version": letter.handler_version,
        "idempotency_key": letter.idempotency_key,
        "lock_key": letter.lock_key,
        "traceback": _clear(letter.traceback),
    }
    secrets = payload_secrets(letter)
    if secrets:
        for key in ("idempotency_key", "lock_key"):
            if context[key]:
                context[key] = redact(context[key], secrets)
    if send_payload and (is_encrypted(letter.args) or is_encrypted(letter.kwargs)):
        context["payload"] = NOT_SENT  # the task's promise: its payload leaves nowhere in clear
    elif send_payload:
        payload = json.dumps({"args": letter.args, "kwargs": letter.kwargs})
        context["payload"] = redact(payload, secrets) if secrets else payload
    trace_context = letter.trace_context if isinstance(letter.trace_context, dict) else {}
    if isinstance(trace_context.get("traceparent"), str):
        context["traceparent"] = trace_context["traceparent"]
    return {
        "level": "error",
        "logger": "django_jobguard.dlq",
        "message": f"job {letter.job_id} dead-lettered ({letter.reason}): {letter.error_class}",
        "exception": {
            "values": [
                {
                    "type": name or letter.error_class or "DeadLetter",
                    "module": module or None,
                    "value": _clear(letter.error_message),
                    "mechanism": {"type": "django_jobguard", "handled": False},
                }
            ]
        },
        "tags": {
            "jobguard.task": letter.task_name,
            "jobguard.queue": letter.queue_name,
            "jobguard.attempt": str(letter.attempts),
            "jobguard.job_id": str(letter.job_id),
            "jobguard.dead_letter_reason": letter.reason,
        },
        "contexts": {"jobguard": context},
        # One issue per task and error class, however the messages vary.
        "fingerprint": ["django_jobguard", letter.task_name, letter.error_class],
    }


def _clear(stored: str) -> str:
    """A dead letter's text as an event may carry it: as stored, or :data:`NOT_SENT` when it is
    encrypted (the ciphertext would tell Sentry nothing, and opening it would break the promise)."""
    return NOT_SENT if is_encrypted(stored) else stored
