"""``Task``, the ``@task`` decorator and ``Task.using()``.

Shaped after Django's own Tasks framework: a decorated function becomes a ``Task`` whose
``enqueue()`` stores a job, and ``using()`` returns a copy with per-call overrides.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ImproperlyConfigured

from ._json import validate_payload
from .conf import MAX_SCHEDULE_NAME_LENGTH, RetryOverrides, RetryPolicy, get_settings
from .context import JobContext
from .encryption.indexes import blinds_keys, pick
from .exceptions import InvalidArgumentsError, InvalidTaskError
from .flow import (
    MAX_LIMIT_KEY_LENGTH,
    MAX_STORED_RATE_KEY_LENGTH,
    Limit,
    Rate,
    concurrency_spec,
    keyed_rate_room,
    rate_spec,
    template_fields,
)
from .registry import registry

if TYPE_CHECKING:
    from .models import Job

__all__ = ["Task", "task"]

P = ParamSpec("P")
R = TypeVar("R")

MIN_PRIORITY = -100
MAX_PRIORITY = 100
#: The length of ``Job.idempotency_key``.
MAX_IDEMPOTENCY_KEY_LENGTH = 255
#: The length of ``Job.lock_key`` and of the database lock back end's key column, which holds
#: the key behind ``JOBGUARD["LOCKS"]["PREFIX"]``.
MAX_LOCK_KEY_LENGTH = 255
#: The widths of the job's ``task_name`` and ``handler_version`` columns.
MAX_TASK_NAME_LENGTH = 255
MAX_HANDLER_VERSION_LENGTH = 64
#: Lock keys may not end with this: the Redis lock back end keeps a key's fencing counter there
#: (``locks.base.RESERVED_SUFFIX``; that module sits layers above this one).
_RESERVED_LOCK_SUFFIX = ":fencing"

ExceptionTypes = tuple[type[BaseException], ...]

EnqueueOne = Callable[["Task[Any, Any]", Sequence[Any], Mapping[str, Any]], "Job"]
EnqueueMany = Callable[["Task[Any, Any]", Iterable[tuple[Sequence[Any], Mapping[str, Any]]]], "list[Job]"]


def _service() -> tuple[EnqueueOne, EnqueueMany]:
    """The enqueue service (``django_jobguard.enqueue``), imported at the first call.

    It sits layers above this module: it needs idempotency, the store and the metrics, which
    (like nearly everything) import Task. Imported at module level it would close an import
    circle; imported here, it loads once the app registry is ready. This is the one import up
    the layers (the contract in pyproject.toml lists it).
    """
    from . import enqueue

    return enqueue.enqueue, enqueue.bulk_enqueue


def _exception_types(value: Any, option: str) -> ExceptionTypes:
    if value is None:
        return ()
    if isinstance(value, type):
        value = (value,)
    types = tuple(value)
    for item in types:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidTaskError(f"{option} must hold exception classes, not {item!r}.")
    return types


#: The earliest and latest times a job may be scheduled at: a day inside what Python's
#: datetime holds, so the value reads back and shows in any time zone (the admin's lists).
EARLIEST_DATETIME = datetime.datetime.min.replace(tzinfo=datetime.UTC) + datetime.timedelta(days=1)
LATEST_DATETIME = datetime.datetime.max.replace(tzinfo=datetime.UTC) - datetime.timedelta(days=1)


def valid_datetime(value: datetime.datetime) -> bool:
    """Whether an aware datetime lies within [EARLIEST_DATETIME, LATEST_DATETIME] in UTC.

    Raises ``OverflowError`` when its offset takes it outside Python's range altogether.
    """
    return EARLIEST_DATETIME <= value.astimezone(datetime.UTC) <= LATEST_DATETIME


def _valid_run_after(value: datetime.datetime | datetime.timedelta) -> bool:
    try:
        if isinstance(value, datetime.timedelta):
            return abs(value) <= LATEST_DATETIME - EARLIEST_DATETIME and valid_datetime(
                datetime.datetime.now(datetime.UTC) + value
            )
        return valid_datetime(value)
    except OverflowError:
        return False


def blind_lock_key(value: str, alias: str) -> str:
    """Lock key ``value`` as a task with encrypt=True stores it: its blind index under the
    current key, or under an older one while a queued or running job still holds or waits for
    that one (a key rotation), so that the two jobs still exclude each other."""

    def in_use(older: Sequence[str]) -> str | None:
        from .models import Job, JobStatus

        jobs = Job.objects.using(alias).filter(
            lock_key__in=older, status__in=(JobStatus.QUEUED, JobStatus.RUNNING)
        )
        return jobs.values_list("lock_key", flat=True).first()

    return pick(value, in_use)


@dataclasses.dataclass(frozen=True)
class Task(Generic[P, R]):
    """A function registered to run in a worker. Create with :func:`task`."""

    func: Callable[..., R]
    name: str
    queue_name: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    visibility_timeout: float | None = None
    takes_context: bool = False
    atomic: bool = False
    lock: str | None = None
    lock_ttl: float | None = None
    retry_on: ExceptionTypes = ()
    recoverable_on: ExceptionTypes = ()
    fatal_on: ExceptionTypes = ()
    retry: RetryPolicy | RetryOverrides | None = None
    recoverable_retry: RetryPolicy | RetryOverrides | None = None
    timeout: float | None = None
    handler_version: str = ""
    idempotency_scope: str | None = None
    # Classification (the checklist that ``manage.py check`` holds tasks to, see checks/tasks.py):
    # None means "not declared". The decorator's ``idempotency_key=`` is stored as
    # ``idempotency_key_template``, because ``idempotency_key`` below is using()'s per-call key.
    idempotent: bool | None = None
    idempotency_key_template: str | None = None
    parallel: bool = True
    expected_duration: float | None = None
    #: May be enqueued over HTTP through the REST API (``django_jobguard.api``).
    api: bool = False
    #: An API caller may send another declared queue than the task's (``api={"queue_name": True}``).
    api_queue_name: bool = False
    #: The highest priority an API caller may ask for (``api={"max_priority": n}``); None: the
    #: task's own, so a caller cannot put its jobs ahead of the task's other jobs.
    api_max_priority: int | None = None
    #: A cron expression: the scheduler enqueues this task at each of its ticks (UTC).
    schedule: str | None = None
    #: Flow control across the fleet: jobs of this task running at once (per key with a key).
    concurrency: Limit | None = None
    #: Flow control across the fleet: job starts per period (per key with a key).
    rate: Rate | None = None
    #: The name of a shared limit in ``JOBGUARD["LIMITS"]`` (checked by ``manage.py check``).
    limit: str | None = None
    #: Bytes a return value may take as stored JSON; None: ``JOBGUARD["MAX_RESULT_BYTES"]``.
    max_result_bytes: int | None = None
    #: Seconds a job's result may be waited for (``Job.wait()``) after it finished; 0: nobody
    #: waits on this task's results; None: ``JOBGUARD["RETENTION"]["RESULTS"]``.
    result_retention: float | None = None
    #: Store this task's arguments, results, errors, tracebacks, progress and checkpoints
    #: encrypted with ``JOBGUARD["ENCRYPTION"]["KEYS"]`` (see :mod:`django_jobguard.encryption`).
    encrypt: bool = False
    # Per-call overrides set by using():
    run_after: datetime.datetime | datetime.timedelta | None = None
    idempotency_key: str | None = None
    #: Ids of the jobs this call waits for (``using(after=[...])``).
    after: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Each is copied into a column of this width with every job (the scope into the
        # idempotency keys): refused here, not by the database at each enqueue.
        for option, value, width in (
            ("name", self.name, MAX_TASK_NAME_LENGTH),
            ("handler_version", self.handler_version, MAX_HANDLER_VERSION_LENGTH),
            ("idempotency_scope", self.idempotency_scope or "", MAX_IDEMPOTENCY_KEY_LENGTH),
        ):
            if len(value) > width:
                raise InvalidTaskError(
                    f"{option} must be at most {width} characters (the width of its column), "
                    f"not {len(value)}: {value[:40]!r}..."
                )
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise InvalidTaskError(
                f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, not {self.priority}."
            )
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidTaskError(f"max_attempts must be at least 1, not {self.max_attempts}.")
        for option in ("visibility_timeout", "lock_ttl", "timeout", "expected_duration"):
            value = getattr(self, option)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise InvalidTaskError(f"{option} must be a number of seconds, not {value!r}.")
            if value is not None and value <= 0:
                raise InvalidTaskError(f"{option} must be a positive number of seconds, not {value}.")
        retention = self.result_retention
        if retention is not None and (
            isinstance(retention, bool) or not isinstance(retention, int | float) or not retention >= 0
        ):
            raise InvalidTaskError(
                f"result_retention must be a number of seconds, 0 or more (or None for "
                f'JOBGUARD["RETENTION"]["RESULTS"]), not {retention!r}.'
            )
        if not isinstance(self.encrypt, bool):
            raise InvalidTaskError(f"encrypt must be True or False, not {self.encrypt!r}.")
        limit = self.max_result_bytes
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidTaskError(
                f"max_result_bytes must be a whole number of bytes, 1 or more (or None for "
                f'JOBGUARD["MAX_RESULT_BYTES"]), not {limit!r}.'
            )
        if self.lock is not None:
            if not self.lock:
                raise InvalidTaskError("lock must be a non-empty key template such as 'order:{order_id}'.")
            unknown = [f for f in template_fields(self.lock) if f not in self.parameters]
            if unknown:
                raise InvalidTaskError(
                    f"lock template {self.lock!r} names {unknown[0]!r}, which is not a parameter "
                    f"of {self.name}; parameters: {', '.join(self.parameters) or '(none)'}."
                )
        self._check_classification()
        self._check_flow()
        if self.schedule is not None:
            if not isinstance(self.schedule, str) or not self.schedule.strip():
                raise InvalidTaskError(
                    f"schedule must be a cron expression such as '*/5 * * * *', not {self.schedule!r}."
                )
            if len(self.name) > MAX_SCHEDULE_NAME_LENGTH:
                raise InvalidTaskError(
                    f"schedule= names the schedule after the task, and {self.name!r} is longer than "
                    f"{MAX_SCHEDULE_NAME_LENGTH} characters; pass a shorter name=... or declare it in "
                    'JOBGUARD["SCHEDULES"].'
                )
        if self.idempotency_key is not None and not self.idempotency_key:
            raise InvalidArgumentsError("idempotency_key must be a non-empty string.")
        if self.idempotency_key is not None and len(self.idempotency_key) > MAX_IDEMPOTENCY_KEY_LENGTH:
            raise InvalidArgumentsError(
                f"idempotency_key must be at most {MAX_IDEMPOTENCY_KEY_LENGTH} characters."
            )

    def _check_flow(self) -> None:
        if self.concurrency is not None and not isinstance(self.concurrency, Limit):
            raise InvalidTaskError(
                f"concurrency must be a whole number or a Limit(...), not {self.concurrency!r}."
            )
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise InvalidTaskError(
                f"rate must be a string such as '100/m' or a Rate(...), not {self.rate!r}."
            )
        if self.limit is not None and (not isinstance(self.limit, str) or not self.limit):
            raise InvalidTaskError(
                f"limit must name an entry of JOBGUARD['LIMITS'] such as 'stripe', not {self.limit!r}."
            )
        if self.rate is not None:
            # The claim stores the rate's key in the rate table: rate:task:<task>, or
            # r:<task>|<key> with a key of at least one character.
            form, overhead = ("rate:task:<task>", 10) if self.rate.key is None else ("r:<task>|<key>", 4)
            longest = MAX_STORED_RATE_KEY_LENGTH - overhead
            if len(self.name) > longest:
                raise InvalidTaskError(
                    f"a task with a rate may have a name of at most {longest} characters, not "
                    f"{len(self.name)}: the claim stores the rate's key as {form!r} in "
                    f"{MAX_STORED_RATE_KEY_LENGTH} characters. Pass a shorter name=..."
                )
        for option, spec in (("concurrency", self.concurrency), ("rate", self.rate)):
            if spec is None or spec.key is None:
                continue
            unknown = [f for f in template_fields(spec.key) if f not in self.parameters]
            if unknown:
                raise InvalidTaskError(
                    f"{option} key template {spec.key!r} names {unknown[0]!r}, which is not a parameter "
                    f"of {self.name}; parameters: {', '.join(self.parameters) or '(none)'}."
                )

    @property
    def limited(self) -> bool:
        """Whether the task declares any flow control (``concurrency``, ``rate`` or ``limit``)."""
        return self.concurrency is not None or self.rate is not None or self.limit is not None

    def _check_classification(self) -> None:
        if self.idempotent is not None and not isinstance(self.idempotent, bool):
            raise InvalidTaskError(f"idempotent must be True or False, not {self.idempotent!r}.")
        if not isinstance(self.parallel, bool):
            raise InvalidTaskError(f"parallel must be True or False, not {self.parallel!r}.")
        if not self.parallel and self.lock is None:
            raise InvalidTaskError(
                f"{self.name} has parallel=False but no lock: name the resource two runs must not "
                "share, e.g. lock='order:{order_id}' (the lock is what keeps them apart)."
            )
        template = self.idempotency_key_template
        if template is None:
            return
        if not isinstance(template, str) or not template:
            raise InvalidTaskError(
                "idempotency_key must be a non-empty key template such as 'charge:order:{order_id}'."
            )
        if self.idempotent is False:
            raise InvalidTaskError(
                f"{self.name} has idempotent=False and an idempotency_key template: a key makes "
                "the task safe to run twice, so drop idempotent=False (or the key)."
            )
        fields = template_fields(template)
        if not fields:
            raise InvalidTaskError(
                f"idempotency_key template {template!r} names no parameter, so every call of "
                f"{self.name} would share one key; name the business identity, e.g. "
                "'charge:order:{order_id}' (or pass a fixed key per call with using())."
            )
        unknown = [f for f in fields if f not in self.parameters]
        if unknown:
            raise InvalidTaskError(
                f"idempotency_key template {template!r} names {unknown[0]!r}, which is not a "
                f"parameter of {self.name}; parameters: {', '.join(self.parameters) or '(none)'}."
            )

    # -- signature -----------------------------------------------------------------------

    @property
    def signature(self) -> inspect.Signature:
        """The handler's signature as callers see it (without the context parameter)."""
        return _signature(self.func, self.takes_context)

    @property
    def parameters(self) -> list[str]:
        return list(self.signature.parameters)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> inspect.BoundArguments:
        """Bind arguments to the handler's signature, raising :class:`InvalidArgumentsError`."""
        try:
            return self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            problems = _binding_problems(self.signature, args, kwargs) or [str(exc)]
            raise InvalidArgumentsError(
                f"Arguments do not fit {self.name}{self.signature}: {'; '.join(problems)}."
            ) from None

    def _arguments(self, bound: inspect.BoundArguments) -> dict[str, Any]:
        arguments = dict(bound.arguments)
        for name, param in self.signature.parameters.items():
            if name not in arguments and param.default is not inspect.Parameter.empty:
                arguments[name] = param.default
        return arguments

    def lock_key_for(self, bound: inspect.BoundArguments) -> str:
        """The lock key of a call: the ``lock`` template formatted with its arguments."""
        if self.lock is None:
            return ""
        try:
            key = self.lock.format_map(self._arguments(bound))
        except (KeyError, IndexError, AttributeError) as exc:
            raise InvalidArgumentsError(f"lock template {self.lock!r} cannot be formatted: {exc}") from None
        # Refused here, before anything is written: a longer key failed the insert (a 500
        # through the API on PostgreSQL), or was stored (SQLite) and dead-lettered by the
        # worker, which cannot take such a lock; an empty one would run the job unlocked.
        limit = MAX_LOCK_KEY_LENGTH - len(get_settings().locks.prefix)
        if not key or len(key) > limit:
            raise InvalidArgumentsError(
                f"lock template {self.lock!r} gave a key of {len(key)} characters; a lock key must "
                f"have 1 to {limit} (the {MAX_LOCK_KEY_LENGTH} of the lock key column, less "
                'JOBGUARD["LOCKS"]["PREFIX"]).'
            )
        if key.endswith(_RESERVED_LOCK_SUFFIX):
            raise InvalidArgumentsError(
                f"lock template {self.lock!r} gave a key ending with {_RESERVED_LOCK_SUFFIX!r}, "
                "which the lock back ends reserve."
            )
        if blinds_keys(self.encrypt):
            # Stored (job, dead letter, lock row, Redis) as its blind index, not the business value.
            return blind_lock_key(key, get_settings().database_alias)
        return key

    def flow_keys_for(self, bound: inspect.BoundArguments) -> list[str]:
        """The keyed limits of a call, stored with its job: ``c:<task>|<key>``, ``r:<task>|<key>``.

        Unkeyed and named limits are not stored: the claim finds them from the task's name,
        so a limit declared later applies to the jobs already queued too.
        """
        keys = [self._flow_key("c", self.concurrency, bound), self.rate_key_for(bound)]
        return [key for key in keys if key is not None]

    def rate_key_for(self, bound: inspect.BoundArguments) -> str | None:
        """The stored key of a call's keyed rate (``r:<task>|<key>``); None without one.

        Raises :class:`InvalidArgumentsError` when the key cannot be stored: the claim keeps
        its rate state in the rate table, whose key column holds
        :data:`~django_jobguard.flow.MAX_STORED_RATE_KEY_LENGTH` characters.
        """
        return self._flow_key("r", self.rate, bound)

    def _flow_key(self, kind: str, spec: Limit | Rate | None, bound: inspect.BoundArguments) -> str | None:
        if spec is None or spec.key is None:
            return None
        try:
            key = spec.key.format_map(self._arguments(bound))
        except (KeyError, IndexError, AttributeError, ValueError) as exc:
            raise InvalidArgumentsError(
                f"limit key template {spec.key!r} cannot be formatted: {exc}"
            ) from None
        if kind == "r":
            # Refused here, before anything is written: the claim stores a rate key as
            # r:<task>|<key> in the rate table, and a longer one failed every claim of the
            # queue (PostgreSQL, MariaDB) while the other jobs waited.
            room = keyed_rate_room(self.name)
            if not key or len(key) > room:
                raise InvalidArgumentsError(
                    f"limit key template {spec.key!r} gave a key of {len(key)} characters; a rate key "
                    f"of {self.name} must have 1 to {room} characters (it is stored as "
                    f"'r:<task>|<key>' in the {MAX_STORED_RATE_KEY_LENGTH} characters of the rate "
                    "table's key column)."
                )
        elif not key or len(key) > MAX_LIMIT_KEY_LENGTH:
            raise InvalidArgumentsError(
                f"limit key template {spec.key!r} gave a key of {len(key)} characters; a limit key "
                f"must have 1 to {MAX_LIMIT_KEY_LENGTH}."
            )
        return f"{kind}:{self.name}|{key}"

    def idempotency_key_for(self, bound: inspect.BoundArguments) -> str | None:
        """The idempotency key of a call: ``using(idempotency_key=...)``, else the template's.

        None when the task has neither. The template is formatted from the bound arguments
        (defaults included), so every enqueue of one business action gets the same key.
        """
        if self.idempotency_key is not None:
            return self.idempotency_key
        template = self.idempotency_key_template
        if template is None:
            return None
        try:
            key = template.format_map(self._arguments(bound))
        except (KeyError, IndexError, AttributeError, ValueError) as exc:
            raise InvalidArgumentsError(
                f"idempotency_key template {template!r} cannot be formatted: {exc}"
            ) from None
        if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH:
            raise InvalidArgumentsError(
                f"idempotency_key template {template!r} gave a key of {len(key)} characters; "
                f"a key must have 1 to {MAX_IDEMPOTENCY_KEY_LENGTH}."
            )
        return key

    # -- enqueue ---------------------------------------------------------------------------

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime.datetime | datetime.timedelta | None = None,
        idempotency_key: str | None = None,
        after: Iterable[Any] | None = None,
    ) -> Task[P, R]:
        """A copy of this task with per-call options; chain ``.enqueue(...)`` on it.

        ``after``: jobs (or their ids) the new job waits for; it runs once every one of them
        succeeded, and is cancelled if one of them is dead-lettered or cancelled.
        """
        changes: dict[str, Any] = {}
        if after is not None:
            changes["after"] = _job_ids(after)
        if priority is not None:
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise InvalidArgumentsError(f"priority must be an integer, not {priority!r}.")
            if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
                raise InvalidArgumentsError(
                    f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, not {priority}."
                )
            changes["priority"] = priority
        if queue_name is not None:
            if not isinstance(queue_name, str) or not queue_name:
                raise InvalidArgumentsError(f"queue_name must be a non-empty string, not {queue_name!r}.")
            changes["queue_name"] = queue_name
        if run_after is not None:
            if not isinstance(run_after, datetime.datetime | datetime.timedelta):
                raise InvalidArgumentsError(
                    f"run_after must be an aware datetime or a timedelta, not {type(run_after).__name__} "
                    f"{run_after!r} (for example timezone.now() + timedelta(days=1), or timedelta(days=1))."
                )
            if isinstance(run_after, datetime.datetime) and run_after.utcoffset() is None:
                raise InvalidArgumentsError("run_after must be an aware datetime (or a timedelta).")
            if not _valid_run_after(run_after):
                raise InvalidArgumentsError(
                    f"run_after {run_after!r} is out of range: it must lie between the years 1 and 9999 "
                    "in UTC, with a day to spare for any time zone it is shown in."
                )
            # In UTC: Python takes offsets up to ±23:59, PostgreSQL refuses those past ±15:59.
            if isinstance(run_after, datetime.datetime):
                run_after = run_after.astimezone(datetime.UTC)
            changes["run_after"] = run_after
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str):
                raise InvalidArgumentsError(f"idempotency_key must be a string, not {idempotency_key!r}.")
            changes["idempotency_key"] = idempotency_key
        return dataclasses.replace(self, **changes)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store a job for this call and return it. Joins the caller's transaction."""
        if self.after:
            # The workflow service sits above this module, as the enqueue service does.
            from . import workflows

            return workflows.enqueue_after(self, args, kwargs)
        return _service()[0](self, args, kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """:meth:`enqueue` from async code: run on the thread Django gives the caller's sync work
        (``thread_sensitive``), so it joins the transaction of that thread's connection as
        :meth:`enqueue` would, and blocks no event loop."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A step of a workflow: this task with its arguments, checked now (nothing is written)."""
        return Signature(self, tuple(args), dict(kwargs))

    def bulk_enqueue(self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Job]:
        """Store many jobs in one statement: ``calls`` yields ``(args, kwargs)`` pairs."""
        return _service()[1](self, calls)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the handler here and now, without a job (``takes_context`` tasks get a dry context)."""
        call_args: tuple[Any, ...] = args
        if self.takes_context:
            call_args = (JobContext.detached(self), *args)
        if inspect.iscoroutinefunction(self.func):
            return async_to_sync(self.func)(*call_args, **kwargs)  # type: ignore[no-any-return]
        return self.func(*call_args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


#: Where a step receives a value as its first positional argument (``receives()`` with no
#: name); a keyword argument's name is stored otherwise, "" for nothing.
POSITIONAL = "*"


@dataclasses.dataclass(frozen=True)
class Signature:
    """A task bound to its arguments: one step of a chain, a member or callback of a batch.

    Made by :meth:`Task.s`, which checks the arguments at once (each names a parameter, and
    they are JSON): a bad step fails where it is written. That they are complete is checked
    when its workflow is enqueued, before anything is written (a step may receive the
    previous step's result, see :meth:`receives`, and a callback its members' results, see
    :meth:`receives_results`).
    """

    task: Task[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: Where the previous step's result (chains), or the workflow's summary (callbacks), goes:
    #: a keyword argument's name, :data:`POSITIONAL`, or "" for nowhere.
    result_as: str = ""
    #: Where a group's or batch's callback takes its members' results: a keyword argument's
    #: name, :data:`POSITIONAL`, or "" for nowhere (the default: nothing is loaded).
    results_as: str = ""

    def __post_init__(self) -> None:
        if self.task.after:
            raise InvalidArgumentsError(
                f"{self.task.name}: a workflow step takes no after=; "
                "its place in the workflow says what it waits for."
            )
        try:
            self.task.signature.bind_partial(*self.args, **self.kwargs)
        except TypeError:
            self.task.bind(self.args, self.kwargs)  # raises InvalidArgumentsError, naming the problems
            raise
        validate_payload(self.args, self.kwargs)

    def prepared(self) -> dict[str, Any]:
        """The job row this step becomes (see :func:`django_jobguard.enqueue.prepare`).

        A step that receives a value gets None in its place until the value is known.
        """
        from . import enqueue  # the one import up the layers, as in Task.enqueue

        args, kwargs = _placeheld(self)
        return enqueue.prepare(self.task, args, kwargs)

    def receives(self, name: str | None = None) -> Signature:
        """This step, given the previous step's result (a callback: the workflow's summary).

        ``name``: as that keyword argument. No name: as the first positional argument, before
        the step's own (``add.s(10).receives()`` runs ``add(result, 10)``, as a Celery chain
        passes it). Refused now if the task has no place for it.
        """
        return self._receiving(name, "result_as", "a result")

    def receives_results(self, name: str | None = None) -> Signature:
        """This group's or batch's callback, given its members' results as a list, in member order.

        ``name``: as that keyword argument; no name: as the first positional argument. A
        member that failed (dead-lettered or cancelled) is marked in its place with a dict
        ``{"jobguard_failed": True, "job_id": ..., "status": ..., "error": ...}``. Opt-in: the
        results are read when the callback is enqueued, in one query over every member.
        """
        return self._receiving(name, "results_as", "the results")

    def _receiving(self, name: str | None, slot: str, what: str) -> Signature:
        """This step with ``slot`` set to ``name`` (None: positional), checked against the task."""
        other = self.results_as if slot == "result_as" else self.result_as
        if name is None:
            if other == POSITIONAL:
                raise InvalidArgumentsError(
                    f"{self.task.name}: its first positional argument receives a value already; "
                    f"name a keyword argument for {what}."
                )
            value = POSITIONAL
        else:
            if not isinstance(name, str) or not name or name == POSITIONAL:
                raise InvalidArgumentsError(
                    f"{self.task.name}: name the parameter that receives {what} with a string, not "
                    f"{name!r} (no name: the first positional argument)."
                )
            if name not in self.task.parameters and not _takes_var_keywords(self.task):
                raise InvalidArgumentsError(
                    f"{self.task.name} has no parameter {name!r} to receive {what} in."
                )
            if name in self.kwargs or name == other:
                raise InvalidArgumentsError(
                    f"{self.task.name}: {name!r} is given already; it cannot also receive {what}."
                )
            value = name
        changes: dict[str, Any] = {slot: value}
        step = dataclasses.replace(self, **changes)
        args, kwargs = _placeheld(step)
        try:
            self.task.signature.bind_partial(*args, **kwargs)
        except TypeError:
            where = "as its first positional argument" if value == POSITIONAL else f"as {value!r}"
            raise InvalidArgumentsError(
                f"{self.task.name}{self.task.signature} cannot take {what} {where} with the arguments "
                f"given ({len(self.args)} positional, keywords {sorted(self.kwargs)})."
            ) from None
        return step

    def __repr__(self) -> str:
        return f"<Signature {self.task.name} args={self.args!r} kwargs={self.kwargs!r}>"


def _placeheld(step: Signature) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The step's arguments with None where the values it receives will go."""
    args, kwargs = step.args, step.kwargs
    for slot in (step.result_as, step.results_as):
        if slot == POSITIONAL:
            args = (None, *args)
        elif slot:
            kwargs = {**kwargs, slot: None}
    return args, kwargs


def _takes_var_keywords(task: Task[Any, Any]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in task.signature.parameters.values())


def _job_ids(after: Iterable[Any]) -> tuple[int, ...]:
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise InvalidArgumentsError(f"after must be a list of jobs or job ids, not {after!r}.")
    ids = []
    for item in after:
        pk = getattr(item, "pk", item)
        if isinstance(pk, bool) or not isinstance(pk, int):
            raise InvalidArgumentsError(f"after: {item!r} is not a job or a job id.")
        ids.append(pk)
    if not ids:
        raise InvalidArgumentsError("after must name at least one job.")
    return tuple(dict.fromkeys(ids))


def _binding_problems(
    signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[str]:
    """Every reason ``args`` / ``kwargs`` do not bind: unexpected and missing arguments together.

    ``Signature.bind`` stops at the first problem, so a misspelt keyword was reported as
    only the unexpected one or only the missing one; naming both shows the typo.
    """
    kind = inspect.Parameter
    params = list(signature.parameters.values())
    positional = [p for p in params if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
    var_args = any(p.kind is kind.VAR_POSITIONAL for p in params)
    var_kwargs = any(p.kind is kind.VAR_KEYWORD for p in params)
    by_name = {p.name for p in params if p.kind in (kind.POSITIONAL_OR_KEYWORD, kind.KEYWORD_ONLY)}
    filled = {p.name for p in positional[: len(args)]}
    problems: list[str] = []
    if len(args) > len(positional) and not var_args:
        problems.append(f"too many positional arguments ({len(args)} given, {len(positional)} taken)")
    if not var_kwargs:
        unexpected = [name for name in kwargs if name not in by_name]
        if unexpected:
            problems.append(_names("unexpected keyword argument", unexpected))
    twice = [name for name in kwargs if name in filled and name in by_name]
    if twice:
        problems.append(_names("multiple values for argument", twice))
    missing = [
        p.name
        for p in params
        if p.default is kind.empty
        and p.kind not in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD)
        and p.name not in filled
        and not (p.name in kwargs and p.kind is not kind.POSITIONAL_ONLY)
    ]
    if len(missing) == 1:
        problems.append(f"missing a required argument: {missing[0]!r}")
    elif missing:
        problems.append(f"missing required arguments: {', '.join(map(repr, missing))}")
    return problems


def _names(what: str, names: list[str]) -> str:
    return f"{what}{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"


_signature_cache: dict[tuple[Callable[..., Any], bool], inspect.Signature] = {}


def _signature(func: Callable[..., Any], takes_context: bool) -> inspect.Signature:
    key = (func, takes_context)
    sig = _signature_cache.get(key)
    if sig is None:
        sig = inspect.signature(func)
        if takes_context:
            params = list(sig.parameters.values())
            if not params or params[0].kind not in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                raise InvalidTaskError(
                    f"{func.__qualname__} has takes_context=True, so its first parameter must "
                    "accept the context positionally."
                )
            sig = sig.replace(parameters=params[1:])
        _signature_cache[key] = sig
    return sig


#: The keys of ``@task(api={...})``.
API_OPTIONS = ("queue_name", "max_priority")


def _api_options(value: Any, priority: int) -> dict[str, Any]:
    """The Task fields of ``@task(api=...)``: True, False, or a mapping of :data:`API_OPTIONS`."""
    if isinstance(value, bool):
        return {"api": value}
    if not isinstance(value, Mapping):
        raise InvalidTaskError(
            f"api must be True, False or a dict such as {{'queue_name': True, 'max_priority': 10}}, "
            f"not {value!r}."
        )
    unknown = sorted(set(value) - set(API_OPTIONS))
    if unknown:
        raise InvalidTaskError(f"api has no option {unknown[0]!r}; options: {', '.join(API_OPTIONS)}.")
    queue_name = value.get("queue_name", False)
    if not isinstance(queue_name, bool):
        raise InvalidTaskError(f"api['queue_name'] must be True or False, not {queue_name!r}.")
    max_priority = value.get("max_priority")
    if max_priority is not None and (
        isinstance(max_priority, bool)
        or not isinstance(max_priority, int)
        or not priority <= max_priority <= MAX_PRIORITY
    ):
        raise InvalidTaskError(
            f"api['max_priority'] must be an integer from the task's priority ({priority}) to "
            f"{MAX_PRIORITY}, not {max_priority!r}."
        )
    return {"api": True, "api_queue_name": queue_name, "api_max_priority": max_priority}


def _policy(value: Any, option: str) -> RetryPolicy | RetryOverrides | None:
    if value is None or isinstance(value, RetryPolicy | RetryOverrides):
        return value
    try:
        return RetryOverrides.parse(value, (option,))
    except ImproperlyConfigured as exc:
        # The parser names settings keys; here the value is a task option, so say that.
        message = str(exc).replace(f"JOBGUARD[{option!r}]", option)
        raise InvalidTaskError(f"@task({option}=...): {message}") from None


@overload
def task(function: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(
    function: None = None,
    /,
    *,
    name: str | None = None,
    queue_name: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    visibility_timeout: float | None = None,
    takes_context: bool = False,
    atomic: bool = False,
    lock: str | None = None,
    lock_ttl: float | None = None,
    retry_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    recoverable_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    fatal_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    retry: Mapping[str, float] | RetryPolicy | None = None,
    recoverable_retry: Mapping[str, float] | RetryPolicy | None = None,
    timeout: float | None = None,
    handler_version: str = "",
    idempotency_scope: str | None = None,
    idempotent: bool | None = None,
    idempotency_key: str | None = None,
    parallel: bool = True,
    expected_duration: float | None = None,
    api: bool | Mapping[str, Any] = False,
    schedule: str | None = None,
    concurrency: int | Limit | None = None,
    rate: str | Rate | None = None,
    limit: str | None = None,
    max_result_bytes: int | None = None,
    result_retention: float | None = None,
    encrypt: bool = False,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(
    function: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    queue_name: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    visibility_timeout: float | None = None,
    takes_context: bool = False,
    atomic: bool = False,
    lock: str | None = None,
    lock_ttl: float | None = None,
    retry_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    recoverable_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    fatal_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
    retry: Mapping[str, float] | RetryPolicy | None = None,
    recoverable_retry: Mapping[str, float] | RetryPolicy | None = None,
    timeout: float | None = None,
    handler_version: str = "",
    idempotency_scope: str | None = None,
    idempotent: bool | None = None,
    idempotency_key: str | None = None,
    parallel: bool = True,
    expected_duration: float | None = None,
    api: bool | Mapping[str, Any] = False,
    schedule: str | None = None,
    concurrency: int | Limit | None = None,
    rate: str | Rate | None = None,
    limit: str | None = None,
    max_result_bytes: int | None = None,
    result_retention: float | None = None,
    encrypt: bool = False,
) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
    """Register a function as a task. Options left unset fall back to the queue, then globals.

    ``async def`` functions are tasks too: the worker runs each job's coroutine to the end
    in its executor thread, with the same heartbeat, hard timeout and fenced ack.

    - ``queue_name``, ``priority`` (-100..100, higher first), ``max_attempts``,
      ``visibility_timeout`` (seconds a claim lasts without heartbeat).
    - ``takes_context``: the handler's first argument is a :class:`~django_jobguard.context.JobContext`.
    - ``atomic``: the handler, the ack and the idempotency record commit in one transaction.
    - ``lock``: a key template (``"order:{order_id}"``) locked around the run; ``lock_ttl`` seconds.
    - ``retry_on`` / ``recoverable_on`` / ``fatal_on``: map your exception types to
      transient / recoverable / permanent (the most specific class wins); ``retry`` /
      ``recoverable_retry`` override keys of the queue's schedule (``{"base": 1, "max": 60}``).
    - ``timeout``: hard limit in seconds; a job past it is failed and its thread abandoned.
    - ``handler_version``: recorded on jobs and dead letters.
    - ``idempotency_scope``: where idempotency keys are unique (the task name by default).
    - Classification, checked by ``manage.py check``: ``idempotent`` (True: running twice
      has the effect of once; False: explicitly not), or ``idempotency_key``, a key template
      over the parameters (``"charge:order:{order_id}"``) formatted at every enqueue;
      ``parallel=False`` (two runs must never overlap: needs ``lock``); ``expected_duration``
      (seconds the author expects a run to take, its p99).
    - ``api``: other systems may enqueue it through the REST API (``POST jobs/``); off by
      default, so a task is exposed over HTTP only when its author says so. With ``True`` a
      caller's job goes to the task's queue, at the task's priority or lower; a dict opts in
      to more: ``{"queue_name": True}`` lets callers pick any declared queue, and
      ``{"max_priority": 50}`` lets them ask for priorities up to 50.
    - ``schedule``: a cron expression (UTC; six fields for seconds); every worker's scheduler
      enqueues the task once per tick, with no arguments. See docs/how-to/recurring-jobs.md.
    - Flow control across every worker, enforced when jobs are claimed (a waiting job costs
      no attempt): ``concurrency`` (``3``, or ``Limit(1, key="account:{account_id}")``),
      ``rate`` (``"100/m"``, or ``Rate("10/s", key="partner:{partner_id}", burst=20)``) and
      ``limit``, the name of a shared limit in ``JOBGUARD["LIMITS"]``. See
      docs/how-to/protect-a-dependency.md.
    - ``max_result_bytes``: bytes the return value may take as stored JSON (default
      ``JOBGUARD["MAX_RESULT_BYTES"]``, 1 MiB); a larger one dead-letters the job as permanent.
    - ``result_retention``: seconds a job's result can be waited for (``Job.wait()``) after it
      finished; 0 when nobody waits on this task's results (``wait()`` refuses at once); None:
      ``JOBGUARD["RETENTION"]["RESULTS"]``. See docs/how-to/wait-for-a-result.md.
    - ``encrypt``: its jobs' arguments, results, errors, tracebacks, progress and checkpoints
      are stored encrypted (AES-256-GCM under ``JOBGUARD["ENCRYPTION"]["KEYS"]``); see
      docs/how-to/encrypt-payloads.md.
    """

    def decorate(func: Callable[P, R]) -> Task[P, R]:
        if not callable(func):
            raise InvalidTaskError(f"@task decorates functions, not {func!r}.")
        if "<locals>" in func.__qualname__ and name is None:
            raise InvalidTaskError(
                f"{func.__qualname__} is defined inside a function, so a worker could not import "
                "it; define tasks at module level (or pass name=... in tests)."
            )
        created: Task[P, R] = Task(
            func=func,
            name=name or f"{func.__module__}.{func.__qualname__}",
            queue_name=queue_name,
            priority=priority,
            max_attempts=max_attempts,
            visibility_timeout=visibility_timeout,
            takes_context=takes_context,
            atomic=atomic,
            lock=lock,
            lock_ttl=lock_ttl,
            retry_on=_exception_types(retry_on, "retry_on"),
            recoverable_on=_exception_types(recoverable_on, "recoverable_on"),
            fatal_on=_exception_types(fatal_on, "fatal_on"),
            retry=_policy(retry, "retry"),
            recoverable_retry=_policy(recoverable_retry, "recoverable_retry"),
            timeout=timeout,
            handler_version=handler_version,
            idempotency_scope=idempotency_scope,
            idempotent=idempotent,
            idempotency_key_template=idempotency_key,
            parallel=parallel,
            expected_duration=expected_duration,
            **_api_options(api, priority),
            schedule=schedule,
            concurrency=concurrency_spec(concurrency),
            rate=rate_spec(rate),
            limit=limit,
            max_result_bytes=max_result_bytes,
            result_retention=result_retention,
            encrypt=encrypt,
        )
        created.signature  # noqa: B018 - validates takes_context against the signature now
        registry.register(created)
        return created

    if function is not None:
        return decorate(function)
    return decorate
