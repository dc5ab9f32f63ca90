"""``Task``, the ``@task`` decorator and ``Task.using()``.

Shaped after Django's own Tasks framework: a decorated function becomes a ``Task`` whose
``enqueue()`` stores a job, and ``using()`` returns a copy with per-call overrides.
"""

from __future__ import annotations

import dataclasses
import datetime
import inspect
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from .conf import RetryOverrides, RetryPolicy
from .exceptions import InvalidArgumentsError, InvalidTaskError
from .registry import registry

if TYPE_CHECKING:
    from .models import Job

__all__ = ["Task", "task"]

P = ParamSpec("P")
R = TypeVar("R")

MIN_PRIORITY = -100
MAX_PRIORITY = 100

ExceptionTypes = tuple[type[BaseException], ...]


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


def _template_fields(template: str) -> list[str]:
    fields = []
    for _literal, field, _spec, _conv in string.Formatter().parse(template):
        if field is not None:
            fields.append(field.split(".")[0].split("[")[0])
    return fields


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
    #: A cron expression: the scheduler enqueues this task at each of its ticks (UTC).
    schedule: str | None = None
    # Per-call overrides set by using():
    run_after: datetime.datetime | datetime.timedelta | None = None
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise InvalidTaskError(
                f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}, not {self.priority}."
            )
        if self.max_attempts is not None and self.max_attempts < 1:
            raise InvalidTaskError(f"max_attempts must be at least 1, not {self.max_attempts}.")
        for option in ("visibility_timeout", "lock_ttl", "timeout"):
            value = getattr(self, option)
            if value is not None and value <= 0:
                raise InvalidTaskError(f"{option} must be a positive number of seconds, not {value}.")
        if self.lock is not None:
            if not self.lock:
                raise InvalidTaskError("lock must be a non-empty key template such as 'order:{order_id}'.")
            unknown = [f for f in _template_fields(self.lock) if f not in self.parameters]
            if unknown:
                raise InvalidTaskError(
                    f"lock template {self.lock!r} names {unknown[0]!r}, which is not a parameter "
                    f"of {self.name}; parameters: {', '.join(self.parameters) or '(none)'}."
                )
        if self.schedule is not None:
            from .conf import MAX_SCHEDULE_NAME_LENGTH

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
        if self.idempotency_key is not None and len(self.idempotency_key) > 255:
            raise InvalidArgumentsError("idempotency_key must be at most 255 characters.")

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
            raise InvalidArgumentsError(f"Arguments do not fit {self.name}{self.signature}: {exc}") from None

    def lock_key_for(self, bound: inspect.BoundArguments) -> str:
        """The lock key of a call: the ``lock`` template formatted with its arguments."""
        if self.lock is None:
            return ""
        arguments = dict(bound.arguments)
        for name, param in self.signature.parameters.items():
            if name not in arguments and param.default is not inspect.Parameter.empty:
                arguments[name] = param.default
        try:
            return self.lock.format_map(arguments)
        except (KeyError, IndexError, AttributeError) as exc:
            raise InvalidArgumentsError(f"lock template {self.lock!r} cannot be formatted: {exc}") from None

    # -- enqueue ---------------------------------------------------------------------------

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime.datetime | datetime.timedelta | None = None,
        idempotency_key: str | None = None,
    ) -> Task[P, R]:
        """A copy of this task with per-call options; chain ``.enqueue(...)`` on it."""
        changes: dict[str, Any] = {}
        if priority is not None:
            changes["priority"] = priority
        if queue_name is not None:
            changes["queue_name"] = queue_name
        if run_after is not None:
            if isinstance(run_after, datetime.datetime) and run_after.tzinfo is None:
                raise InvalidArgumentsError("run_after must be an aware datetime (or a timedelta).")
            changes["run_after"] = run_after
        if idempotency_key is not None:
            changes["idempotency_key"] = idempotency_key
        return dataclasses.replace(self, **changes)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store a job for this call and return it. Joins the caller's transaction."""
        from .enqueue import enqueue

        return enqueue(self, args, kwargs)

    def bulk_enqueue(self, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]) -> list[Job]:
        """Store many jobs in one statement: ``calls`` yields ``(args, kwargs)`` pairs."""
        from .enqueue import bulk_enqueue

        return bulk_enqueue(self, calls)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the handler here and now, without a job (``takes_context`` tasks get a dry context)."""
        if self.takes_context:
            from .context import JobContext

            return self.func(JobContext.detached(self), *args, **kwargs)
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


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


def _policy(value: Any, option: str) -> RetryPolicy | RetryOverrides | None:
    if value is None or isinstance(value, RetryPolicy | RetryOverrides):
        return value
    from django.core.exceptions import ImproperlyConfigured

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
    schedule: str | None = None,
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
    schedule: str | None = None,
) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
    """Register a function as a task. Options left unset fall back to the queue, then globals.

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
    - ``schedule``: a cron expression (UTC; six fields for seconds); every worker's scheduler
      enqueues the task once per tick, with no arguments. See docs/how-to/recurring-jobs.md.
    """

    def decorate(func: Callable[P, R]) -> Task[P, R]:
        if not callable(func):
            raise InvalidTaskError(f"@task decorates functions, not {func!r}.")
        if inspect.iscoroutinefunction(func):
            raise InvalidTaskError(f"{func.__qualname__}: coroutine tasks are not supported yet.")
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
            schedule=schedule,
        )
        created.signature  # noqa: B018 - validates takes_context against the signature now
        registry.register(created)
        return created

    if function is not None:
        return decorate(function)
    return decorate
