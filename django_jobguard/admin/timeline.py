"""A job's story for its admin page: enqueued, each attempt, the retries' backoff, the dead
letter and its replay, built from the row, its stored attempt history and the replay audit
trail (one query for the trail, however many attempts and steps)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..encryption.payloads import ERROR, readable_history, readable_text
from ..exceptions import LeaseLost
from ..models import DeadLetter, Job, JobStatus, ReplayAction, ReplayEvent
from .base import admin_link, can_view_payload, format_time

#: The error class the history records for an attempt whose lease ran out (see store/).
LEASE_LOST = f"{LeaseLost.__module__}.{LeaseLost.__qualname__}"
#: The Outcome column's words, and the class the template colours them by.
OUTCOMES: dict[str, tuple[Any, str]] = {
    "succeeded": (gettext_lazy("succeeded"), "ok"),
    "failed": (gettext_lazy("failed"), "bad"),
    "lease_expired": (gettext_lazy("lease expired"), "bad"),
    "running": (gettext_lazy("running"), "busy"),
    "stuck": (gettext_lazy("lease expired (stuck)"), "bad"),
    "dead": (gettext_lazy("dead"), "bad"),
    "cancelled": (gettext_lazy("cancelled"), "quiet"),
    "waited": (gettext_lazy("waited"), "quiet"),
    "waiting": (gettext_lazy("waiting"), "busy"),
    "unknown": ("-", "quiet"),
}


@dataclasses.dataclass
class Step:
    """One row of the timeline."""

    kind: str
    label: str
    start: str = "-"
    end: str = "-"
    who: str = "-"
    outcome: str = ""
    details: Any = ""
    error: str = ""
    #: Shown only to users with ``jobguard.view_payload``, folded.
    traceback: str = ""
    link: Any = ""

    @property
    def outcome_label(self) -> str:
        return str(OUTCOMES[self.outcome][0]) if self.outcome else ""

    @property
    def outcome_class(self) -> str:
        return OUTCOMES[self.outcome][1] if self.outcome else ""


def history_time(value: Any) -> datetime.datetime | None:
    """A time of the attempt history (ISO text; SQLite's is naive UTC), aware."""
    if not value:
        return None
    parsed = parse_datetime(str(value))
    if parsed is None:
        return None
    return parsed.replace(tzinfo=datetime.UTC) if parsed.tzinfo is None else parsed


def span(start: datetime.datetime | None, end: datetime.datetime | None) -> str:
    """``0.250 s``, ``12.0 s``, ``4 min 5 s``, ``2 h 3 min``: how long from ``start`` to ``end``."""
    if start is None or end is None:
        return ""
    seconds = max((end - start).total_seconds(), 0.0)
    if seconds < 10:
        return f"{seconds:.3f} s"
    if seconds < 90:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 90:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def _cancel_reason(job: Job) -> str:
    """Why a job was cancelled, when the text is jobguard's own (an operator's reason, or the
    dependency that failed): a handler's error may echo its payload, and is not shown here."""
    text = job.last_error or ""
    return text if text.startswith(("cancelled", "upstream failed")) else ""


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""


def _related(job: Job, name: str) -> DeadLetter | None:
    try:
        letter: DeadLetter | None = getattr(job, name)
    except ObjectDoesNotExist:
        return None
    return letter


def replay_events(letters: Iterable[DeadLetter | None]) -> dict[int, list[ReplayEvent]]:
    """The replay audit trail of each of ``letters``, by dead letter id, in one query."""
    ids = [letter.pk for letter in letters if letter is not None]
    events: dict[int, list[ReplayEvent]] = {pk: [] for pk in ids}
    if ids:
        for event in ReplayEvent.objects.filter(dead_letter_id__in=ids).order_by("created_at", "id"):
            events[event.dead_letter_id].append(event)
    return events


def build(job: Job, request: HttpRequest, now: datetime.datetime | None = None) -> list[Step]:
    """The steps of ``job``'s timeline, oldest first, as ``request``'s user may see them.

    Tracebacks only with ``jobguard.view_payload``; who asked for a replay and why only with
    ``jobguard.view_deadletter`` (the dead letter's page shows the same to the same users).
    """
    now = now or timezone.now()
    show_traceback = can_view_payload(request)
    show_replay = request.user.has_perm("jobguard.view_deadletter")
    origin = _related(job, "replayed_from")
    letter = _related(job, "dead_letter")
    trails = replay_events([origin, letter]) if show_replay else {}

    steps: list[Step] = []
    if origin is not None:
        steps.append(_origin_step(origin, trails.get(origin.pk, []), show_replay))
    history = list(job.attempt_history or [])
    if show_traceback:  # errors and tracebacks are opened for those who may see them, only
        history = readable_history(history)
    steps.extend(_enqueued_steps(job, history))
    steps.extend(_attempt_steps(job, history, show_traceback, now))
    if job.status == JobStatus.CANCELLED and not any(step.outcome == "cancelled" for step in steps):
        # Cancelled while queued (before its first attempt, or waiting for a retry).
        steps.append(
            Step(
                "cancelled",
                _("Cancelled"),
                start=format_time(job.finished_at),
                outcome="cancelled",
                details=_cancel_reason(job),
            )
        )
    if letter is not None:
        steps.append(_dead_letter_step(letter))
        steps.extend(_replay_steps(trails.get(letter.pk, [])) if show_replay else [])
    return steps


def _enqueued_steps(job: Job, history: list[dict[str, Any]]) -> list[Step]:
    """The enqueue, and the attempts made before the history was kept (if any)."""
    enqueued = Step("enqueued", _("Enqueued"), start=format_time(job.enqueued_at))
    enqueued.details = _("queue %(queue)s, priority %(priority)s, at most %(max)s attempts") % {
        "queue": job.queue_name,
        "priority": job.priority,
        "max": job.max_attempts,
    }
    if not history and job.status == JobStatus.QUEUED and job.run_after and job.run_after > job.enqueued_at:
        enqueued.details += "; " + _("not before %(time)s") % {"time": format_time(job.run_after)}
    steps = [enqueued]
    missing = job.attempts - len(history)
    if missing > 0:
        # Attempts claimed before the history was kept (migration 0007) have no entry.
        steps.append(
            Step(
                "unrecorded",
                _("Earlier attempts"),
                details=_("%(count)d attempt(s) made before the history was kept") % {"count": missing},
            )
        )
    return steps


def _attempt_steps(
    job: Job, history: list[dict[str, Any]], show_traceback: bool, now: datetime.datetime
) -> list[Step]:
    """One step per recorded attempt, each failed one followed by its backoff (if any)."""
    missing = job.attempts - len(history)
    steps: list[Step] = []
    for index, entry in enumerate(history):
        last = index == len(history) - 1
        started = history_time(entry.get("started_at"))
        finished = history_time(entry.get("finished_at"))
        step = Step(
            "attempt",
            _("Attempt %(number)d of %(max)d")
            % {"number": max(missing, 0) + index + 1, "max": job.max_attempts},
            start=format_time(started),
            who=str(entry.get("worker_id") or "-"),
        )
        error_class = str(entry.get("error_class") or "")
        if error_class:
            step.outcome = "lease_expired" if error_class == LEASE_LOST else "failed"
            # The message can echo the payload: its class alone without view_payload.
            step.error = f"{error_class}: {entry.get('error', '')}" if show_traceback else error_class
            if show_traceback:
                step.traceback = str(entry.get("traceback") or "")
        elif last:
            finished = _settle_last(job, step, now, show_traceback)
        else:
            step.outcome = "unknown"
        step.end = format_time(finished)
        step.details = step.details or span(started, finished)
        steps.append(step)
        if error_class:
            backoff = _backoff(job, finished, history[index + 1] if not last else None, now)
            if backoff is not None:
                steps.append(backoff)
    return steps


def _settle_last(job: Job, step: Step, now: datetime.datetime, show_error: bool) -> datetime.datetime | None:
    """The outcome of the last attempt, which the history leaves open unless it failed: the row says."""
    if job.status == JobStatus.RUNNING:
        stuck = job.lease_expires_at is not None and job.lease_expires_at < now
        step.outcome = "stuck" if stuck else "running"
        step.details = _("lease expires at %(time)s") % {"time": format_time(job.lease_expires_at)}
        if job.cancel_requested:
            step.details += "; " + _("cancel requested")
        return None
    if job.status == JobStatus.SUCCEEDED:
        step.outcome = "succeeded"
    elif job.status == JobStatus.CANCELLED:
        step.outcome = "cancelled"
    elif job.status == JobStatus.DEAD:
        step.outcome = "dead"
        step.error = _first_line(readable_text(job.last_error, ERROR, "job.last_error")) if show_error else ""
    else:
        step.outcome = "unknown"
        return None
    return job.finished_at


def _backoff(
    job: Job, failed_at: datetime.datetime | None, following: dict[str, Any] | None, now: datetime.datetime
) -> Step | None:
    """The wait after a failed attempt: until the next attempt's start, or the job's ``run_after``."""
    if following is not None:
        started = history_time(following.get("started_at"))
        step = Step("backoff", _("Retry backoff"), start=format_time(failed_at), end=format_time(started))
        step.outcome = "waited"
        step.details = _("%(span)s until the next attempt") % {"span": span(failed_at, started)}
        return step
    if job.status != JobStatus.QUEUED:
        return None
    step = Step("backoff", _("Retry backoff"), start=format_time(failed_at), end=format_time(job.run_after))
    step.outcome = "waiting"
    if job.run_after is not None and job.run_after > now:
        step.details = _("next attempt due at %(time)s (a %(span)s backoff; in %(left)s)") % {
            "time": format_time(job.run_after),
            "span": span(failed_at, job.run_after),
            "left": span(now, job.run_after),
        }
    else:
        step.details = _("due since %(time)s, waiting for a worker") % {"time": format_time(job.run_after)}
    return step


def _dead_letter_step(letter: DeadLetter) -> Step:
    step = Step("dead_letter", _("Dead-lettered"), start=format_time(letter.created_at), outcome="dead")
    step.link = admin_link(letter, _("dead letter #%(id)s") % {"id": letter.pk})
    step.details = f"{letter.get_reason_display()} ({letter.get_category_display()})"
    return step


def _replay_steps(events: list[ReplayEvent]) -> list[Step]:
    labels = {
        ReplayAction.REQUESTED: _("Replay requested"),
        ReplayAction.APPROVED: _("Replay approved"),
        ReplayAction.REJECTED: _("Replay rejected"),
        ReplayAction.REPLAYED: _("Replayed"),
    }
    steps = []
    for event in events:
        step = Step(
            f"replay_{event.action}",
            str(labels.get(event.action, event.action)),  # type: ignore[call-overload]
            start=format_time(event.created_at),
            who=event.actor_name or _("system"),
            details=event.reason,
        )
        if event.action == ReplayAction.REPLAYED and event.data.get("job_id"):
            step.link = _job_link(int(event.data["job_id"]))
        steps.append(step)
    return steps


def _origin_step(origin: DeadLetter, events: list[ReplayEvent], show_replay: bool) -> Step:
    """The first row of a replayed job: whose dead letter it replays, and who let it run."""
    step = Step("replay_of", _("Replay of dead letter"), start=format_time(origin.replayed_at))
    step.link = admin_link(origin, _("#%(id)s") % {"id": origin.pk})
    if show_replay:
        said = {
            event.action: event.actor_name or _("system")
            for event in events
            if event.action in (ReplayAction.REQUESTED, ReplayAction.APPROVED)
        }
        step.who = said.get(ReplayAction.APPROVED, "-")
        step.details = _("requested by %(requester)s, approved by %(approver)s") % {
            "requester": said.get(ReplayAction.REQUESTED, "-"),
            "approver": said.get(ReplayAction.APPROVED, "-"),
        }
    return step


def _job_link(job_id: int) -> SafeString:
    return format_html(
        '<a href="{}">{}</a>', reverse("admin:jobguard_job_change", args=[job_id]), f"job #{job_id}"
    )
