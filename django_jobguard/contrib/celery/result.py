"""``AsyncResult``, ``GroupResult`` and ``EagerResult``: Celery's result API over the job rows.

There is no result backend: a job's outcome is its row (``Job.status``, ``Job.result``,
``Job.last_error``), and :meth:`AsyncResult.get` waits with :meth:`Job.wait`. States are
Celery's names, read from the job's status (see :func:`state_of`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Any

from ...encryption.payloads import ERROR, RESULT, open_history, open_json, open_progress, open_text
from ...exceptions import InvalidArgumentsError, JobguardError
from ...models import Job, JobStatus

__all__ = [
    "FAILURE",
    "PENDING",
    "READY_STATES",
    "RETRY",
    "REVOKED",
    "STARTED",
    "SUCCESS",
    "AsyncResult",
    "EagerResult",
    "GroupResult",
    "TaskFailed",
    "TaskRevokedError",
    "state_of",
]

PENDING = "PENDING"
STARTED = "STARTED"
RETRY = "RETRY"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVOKED = "REVOKED"
READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})


class TaskFailed(JobguardError):  # noqa: N818 - reads as a state, as Celery's errors do
    """A job was dead-lettered: ``error_class`` and the message are its last error's."""

    def __init__(self, message: str, error_class: str = "") -> None:
        super().__init__(message)
        self.error_class = error_class


class TaskRevokedError(JobguardError):
    """The job was cancelled (Celery's REVOKED): it has no result."""


def state_of(job: Job | None) -> str:
    """Celery's state of a job: unknown ids are PENDING, as Celery has them.

    waiting, queued → PENDING (queued after a failed attempt → RETRY); running → STARTED;
    succeeded → SUCCESS; dead → FAILURE; cancelled → REVOKED.
    """
    if job is None:
        return PENDING
    status = job.status
    if status == JobStatus.RUNNING:
        return STARTED
    if status == JobStatus.SUCCEEDED:
        return SUCCESS
    if status == JobStatus.DEAD:
        return FAILURE
    if status == JobStatus.CANCELLED:
        return REVOKED
    if status == JobStatus.QUEUED and job.first_failed_at is not None:
        return RETRY
    return PENDING


def _job_id(task_id: Any) -> int:
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        return task_id
    if isinstance(task_id, str) and task_id.isdigit():
        return int(task_id)
    raise InvalidArgumentsError(
        f"{task_id!r} is not a jobguard job id (a whole number). A Celery task id (a UUID) belongs to "
        "a job Celery's broker holds: during a dual run, ask Celery's AsyncResult for it."
    )


def database_alias() -> str:
    from ...conf import get_settings

    return get_settings().database_alias


class AsyncResult:
    """A job's outcome by id, read from its row on each access (Celery's ``AsyncResult``)."""

    def __init__(
        self,
        id: str | int,
        app: Any = None,
        *,
        task_name: str = "",
        parent: AsyncResult | None = None,
    ) -> None:
        self.job_id = _job_id(id)
        self.id = str(self.job_id)
        self.task_name = task_name
        #: In a chain, the previous step's result.
        self.parent = parent

    @property
    def task_id(self) -> str:
        return self.id

    def _job(self) -> Job | None:
        return Job.objects.using(database_alias()).filter(pk=self.job_id).first()

    @property
    def state(self) -> str:
        return state_of(self._job())

    status = state

    @property
    def name(self) -> str:
        job = self._job()
        return job.task_name if job is not None else self.task_name

    def ready(self) -> bool:
        return self.state in READY_STATES

    def successful(self) -> bool:
        return self.state == SUCCESS

    def failed(self) -> bool:
        return self.state == FAILURE

    @property
    def result(self) -> Any:
        """The return value (SUCCESS), the error (FAILURE: a :class:`TaskFailed`), else None."""
        job = self._job()
        state = state_of(job)
        if job is None or state in (PENDING, STARTED):
            return None
        if state == SUCCESS:
            return open_json(job.result, RESULT, "job.result")
        if state == REVOKED:
            return TaskRevokedError(open_text(job.last_error, ERROR, "job.last_error") or "revoked")
        return _failure(job)

    @property
    def info(self) -> Any:
        """As :attr:`result`; while the job runs, the progress it last reported (``update_state``)."""
        job = self._job()
        if job is not None and state_of(job) == STARTED:
            return open_progress(job.progress)
        return self.result

    @property
    def traceback(self) -> str | None:
        job = self._job()
        if job is None or not job.attempt_history:
            return None
        last = open_history(job.attempt_history[-1:])[0]
        return last.get("traceback") if isinstance(last, dict) else None

    @property
    def date_done(self) -> datetime.datetime | None:
        job = self._job()
        return job.finished_at if job is not None else None

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        disable_sync_subtasks: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Wait for the job to settle (``Job.wait``) and return its result.

        A dead job raises its error (:class:`TaskFailed`, or with ``propagate=False`` returns
        it), a cancelled one :class:`TaskRevokedError`; past ``timeout`` seconds,
        ``TimeoutError``. Do not call it in a web request for a long job.
        """
        job = self._job()
        if job is None:
            raise InvalidArgumentsError(f"no job #{self.job_id}: nothing to wait for.")
        try:
            return _wait(job, timeout)
        except TimeoutError:
            raise
        except JobguardError as exc:
            settled = self._job()
            if settled is None or settled.status not in (JobStatus.DEAD, JobStatus.CANCELLED):
                raise
            # A dead job's error is Job.wait()'s (its final error's class and message).
            error: Exception = (
                TaskRevokedError(settled.last_error or "revoked")
                if settled.status == JobStatus.CANCELLED
                else exc
            )
            if not propagate:
                return error
            if error is exc:
                raise
            raise error from exc

    wait = get

    def revoke(self, terminate: bool = False, signal: Any = None, **kwargs: Any) -> None:
        """Cancel the job if it has not started (``operations.jobs.cancel``).

        ``terminate=True`` asks a running job to stop (``request_cancel``): the handler sees
        ``self.request.context.cancel_requested``; nothing is killed.
        """
        from ...operations import jobs

        cancelled = jobs.cancel([self.job_id], reason="revoked (Celery API)")
        if not cancelled and terminate:
            jobs.request_cancel([self.job_id], reason="revoked with terminate=True (Celery API)")

    def forget(self) -> None:
        """Nothing to forget: the job row is pruned with the others (``JOBGUARD["RETENTION"]``)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"


def _failure(job: Job) -> TaskFailed:
    error_class = ""
    if job.attempt_history:
        last = job.attempt_history[-1]
        if isinstance(last, dict):
            error_class = str(last.get("error_class") or "")
    return TaskFailed(
        open_text(job.last_error, ERROR, "job.last_error") or "the job was dead-lettered", error_class
    )


def _wait(job: Job, timeout: float | None) -> Any:
    """The job's result once it settles: ``Job.wait(timeout=...)``, woken when the job settles."""
    return job.wait(timeout=timeout)


class GroupResult:
    """The results of a group's members, in member order (Celery's ``GroupResult``)."""

    def __init__(self, id: str | int | None, results: Sequence[AsyncResult | EagerResult]) -> None:
        self.id = None if id is None else str(id)
        self.results = list(results)

    def __iter__(self) -> Any:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> AsyncResult | EagerResult:
        return self.results[index]

    def ready(self) -> bool:
        return all(result.ready() for result in self.results)

    def successful(self) -> bool:
        return all(result.successful() for result in self.results)

    def failed(self) -> bool:
        return any(result.failed() for result in self.results)

    def completed_count(self) -> int:
        return sum(result.successful() for result in self.results)

    def get(self, timeout: float | None = None, propagate: bool = True, **kwargs: Any) -> list[Any]:
        """Every member's result, in order; ``timeout`` bounds the whole wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        values = []
        for result in self.results:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            values.append(result.get(timeout=left, propagate=propagate))
        return values

    join = get

    def revoke(self, terminate: bool = False, **kwargs: Any) -> None:
        for result in self.results:
            result.revoke(terminate=terminate)

    def __repr__(self) -> str:
        return f"<GroupResult: {self.id} [{', '.join(str(r.id) for r in self.results)}]>"


class EagerResult:
    """The outcome of a task run here and now (``apply()``, ``CELERY_TASK_ALWAYS_EAGER``)."""

    def __init__(self, id: str | None, value: Any, state: str, *, task_name: str = "") -> None:
        self.id = id
        self.task_id = id
        self._value = value
        self.state = self.status = state
        self.task_name = task_name
        self.parent: Any = None

    @property
    def result(self) -> Any:
        return self._value

    info = result

    def ready(self) -> bool:
        return True

    def successful(self) -> bool:
        return self.state == SUCCESS

    def failed(self) -> bool:
        return self.state == FAILURE

    def get(self, timeout: float | None = None, propagate: bool = True, **kwargs: Any) -> Any:
        if self.state == FAILURE and propagate:
            raise self._value
        return self._value

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to revoke: it ran already."""

    def __repr__(self) -> str:
        return f"<EagerResult: {self.state}>"
