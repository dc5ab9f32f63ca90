"""What a dead letter's idempotency key row says today, and what it means for a replay."""

from __future__ import annotations

from .. import idempotency
from ..conf import get_settings
from ..models import DeadLetter, IdempotencyKey, IdempotencyStatus, Job, JobStatus, ReplayState

__all__ = ["describe_key"]


def describe_key(dead_letter: DeadLetter, *, using: str | None = None) -> str:
    """What the dead letter's idempotency key row says today, and what that means for its replay.

    ``""`` when the dead letter has no key. Names jobs by id, never payload values.
    """
    letter = dead_letter
    if not letter.idempotency_key:
        return ""
    alias = using or get_settings().database_alias
    scope = idempotency.scope_of_name(letter.task_name)
    row = IdempotencyKey.objects.using(alias).filter(scope=scope, key=letter.idempotency_key).first()
    replayed = letter.replay_state == ReplayState.REPLAYED
    if row is None:
        if replayed:
            return "no row (expired and pruned after the replay)"
        return "no row (expired and pruned): a replay recreates it"
    status = row.get_status_display()
    if row.job_id is not None and row.job_id == letter.replay_job_id:
        outcome = {
            IdempotencyStatus.SUCCEEDED: "the replay ran the action",
            IdempotencyStatus.IN_PROGRESS: "the replay holds the key and has not finished",
            IdempotencyStatus.FAILED: "the replay failed too",
        }[IdempotencyStatus(row.status)]
        return f"{status} (job #{row.job_id}, this dead letter's replay): {outcome}"
    if row.job_id is not None and row.job_id == letter.job_id:
        text = f"{status} (job #{row.job_id}, the dead job)"
        return text if replayed else f"{text}: a replay takes the key over"
    text = f"{status} (job #{row.job_id}, another job)" if row.job_id is not None else f"{status} (no job)"
    return text + _key_held_elsewhere(alias, letter, row, replayed)


def _key_held_elsewhere(alias: str, letter: DeadLetter, row: IdempotencyKey, replayed: bool) -> str:
    """What a key row owned by neither the dead job nor its replay means for the replay."""
    succeeded = row.status == IdempotencyStatus.SUCCEEDED
    if replayed:
        if succeeded and letter.replay_job_id is not None:
            replay = Job.objects.using(alias).filter(pk=letter.replay_job_id).values_list("status", flat=True)
            if replay.first() == JobStatus.SUCCEEDED:
                return ": the action succeeded through that job; the replay was acked as a duplicate"
        return ""
    if succeeded:
        return ": the action succeeded since; a replay is acked as a duplicate without running"
    active = (JobStatus.QUEUED, JobStatus.RUNNING)
    if row.job_id is not None and Job.objects.using(alias).filter(pk=row.job_id, status__in=active).exists():
        return ": that job owns the action now, so an approved replay waits until it finishes"
    return ": a replay takes the key over"
