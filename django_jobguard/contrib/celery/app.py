"""``shared_task``, ``Celery().task`` and the task object they return, over jobguard's ``task()``.

A Celery task becomes a jobguard task of the same name (the function's dotted path, which is
Celery's default name too), so a job enqueued under it finds its handler in any worker.
Celery's options are read by :mod:`.options`; ``bind=True`` hands the function a
:class:`BoundTask` (``self.request``, ``self.retry()``) built from the job's context.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings

from ...context import JobContext
from ...exceptions import InvalidArgumentsError, InvalidTaskError, PermanentError, TransientError
from ...registry import registry
from ...retry import PERMANENT, classify
from ...task import Task, task
from . import signals
from .conf import broker_urls, celery_setting, priority_direction, route_for
from .options import Mapped, map_options

if TYPE_CHECKING:
    from .canvas import Signature
    from .result import AsyncResult, EagerResult

__all__ = [
    "BoundTask",
    "Celery",
    "CeleryTask",
    "MaxRetriesExceededError",
    "Request",
    "Retry",
    "apps",
    "declared_tasks",
    "shared_task",
]


class Retry(TransientError):  # noqa: N818 - Celery's name
    """Raised by ``self.retry()``: the job is run again after ``retry_after`` seconds (a countdown)."""


class MaxRetriesExceededError(PermanentError):
    """``self.retry()`` was called with no retries left: the job is dead-lettered (Celery's FAILURE)."""


#: apply_async() options that concern Celery's broker or result store, and mean nothing here.
_BROKER_OPTIONS = frozenset(
    {
        "retry",
        "retry_policy",
        "serializer",
        "compression",
        "exchange",
        "routing_key",
        "headers",
        "connection",
        "producer",
        "add_to_parent",
        "ignore_result",
        "shadow",
        "publisher",
        "reply_to",
    }
)


class Request:
    """What ``self.request`` holds in a bound task: Celery's names over the job's context."""

    def __init__(
        self,
        *,
        id: str | None,
        retries: int,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        task: str,
        queue: str = "",
        hostname: str = "",
        is_eager: bool = False,
        eta: datetime.datetime | None = None,
    ) -> None:
        self.id = id
        self.retries = retries
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.task = task
        self.hostname = hostname
        self.is_eager = is_eager
        self.called_directly = id is None
        self.delivery_info = {"routing_key": queue, "exchange": "", "priority": None}
        self.eta = eta
        #: jobguard's context (None when called directly): checkpoints, the lease, cancellation.
        self.context: JobContext | None = None

    def __repr__(self) -> str:
        return f"<Request {self.task} id={self.id} retries={self.retries}>"


#: The request of each Celery task running in this thread (or coroutine), by task name.
#: The dict is replaced, never changed in place, so the shared default is safe.
_running: contextvars.ContextVar[dict[str, Request]] = contextvars.ContextVar(
    "celery_requests",
    default={},  # noqa: B039
)


class BoundTask:
    """``self`` of a ``bind=True`` task: the task's attributes, with ``request`` and ``retry()``."""

    def __init__(self, celery_task: CeleryTask, request: Request) -> None:
        self._task = celery_task
        self.request = request

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def update_state(
        self,
        task_id: str | None = None,
        state: str | None = None,
        meta: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Celery's progress report: ``meta`` with ``current`` (or ``done``) and ``total`` numbers.

        Becomes ``context.report_progress(done, total, message=state)``: the job's progress on
        its page, in the API and in ``AsyncResult.info`` while it runs. The state itself stays
        STARTED (jobguard has no custom states).
        """
        meta = dict(meta or {})
        done = meta.get("current", meta.get("done", 0))
        total = meta.get("total")
        if self.request.context is None:
            return  # called directly: nobody reads the progress
        self.request.context.report_progress(done, total, message=str(state or "")[:100])

    def retry(self, *args: Any, **kwargs: Any) -> Retry:
        """Run this job again later: the task's :meth:`CeleryTask.retry` (so a test that patches
        ``task.retry`` sees the calls made through ``self.retry()``, as with Celery)."""
        return self._task.retry(*args, **kwargs)


class CeleryTask:
    """What ``@shared_task`` returns: Celery's task API over a jobguard :class:`~django_jobguard.Task`."""

    def __init__(self, func: Callable[..., Any], *, bind: bool, options: Mapping[str, Any]) -> None:
        self.run = func
        self.bind = bind
        self.options = dict(options)
        self.mapped: Mapped = map_options(options, direction=priority_direction())
        self.max_retries = self.mapped.max_retries
        self.default_retry_delay = self.mapped.default_retry_delay
        self.ignore_result = self.mapped.ignore_result
        self.priority = self.mapped.priority
        #: The jobguard task the jobs run as.
        self.task: Task[Any, Any] = task(takes_context=True, **self.mapped.task_options)(self._handler(func))
        self.name = self.task.name
        functools.update_wrapper(self, func)
        _declared[self.name] = self

    # -- the handler the worker runs ----------------------------------------------------------

    def _handler(self, func: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(func):
            raise InvalidTaskError(
                f"{func.__qualname__} is async def: Celery runs no coroutines, and this module runs what "
                "Celery runs. Declare it with django_jobguard's @task, which runs async def tasks."
            )
        params = list(inspect.signature(func).parameters.values())
        if self.bind:
            if not params:
                raise InvalidTaskError(f"{func.__qualname__} has bind=True, so it must take self first.")
            params = params[1:]
        celery_task = self

        def handler(context: JobContext, /, *args: Any, **kwargs: Any) -> Any:
            return celery_task._run(context, args, kwargs)

        handler.__module__ = func.__module__
        handler.__qualname__ = func.__qualname__
        handler.__name__ = func.__name__
        handler.__doc__ = func.__doc__
        context_param = inspect.Parameter("context", inspect.Parameter.POSITIONAL_ONLY)
        handler.__signature__ = inspect.Signature([context_param, *params])  # type: ignore[attr-defined]
        return handler

    def _run(self, context: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = Request(
            id=None if context.job_id is None else str(context.job_id),
            retries=max(context.attempt - 1, 0),
            args=args,
            kwargs=kwargs,
            task=self.name,
            queue=context.queue_name,
            hostname=context.worker_id,
            is_eager=context.job_id is None,
        )
        request.context = context
        task_id = request.id
        signals.task_prerun.send(sender=self, task_id=task_id, task=self, args=args, kwargs=kwargs)
        try:
            result = self._call(request, args, kwargs)
        except Retry:
            signals.task_postrun.send(
                sender=self, task_id=task_id, task=self, args=args, kwargs=kwargs, retval=None, state="RETRY"
            )
            raise
        except Exception as exc:
            if classify(exc, self.task) != PERMANENT and not context.is_last_attempt:
                # autoretry_for: the worker runs it again, as Celery's autoretry would.
                signals.task_retry.send(sender=self, request=request, reason=exc, einfo=None)
                signals.task_postrun.send(
                    sender=self,
                    task_id=task_id,
                    task=self,
                    args=args,
                    kwargs=kwargs,
                    retval=exc,
                    state="RETRY",
                )
                raise
            signals.task_failure.send(
                sender=self,
                task_id=task_id,
                exception=exc,
                args=args,
                kwargs=kwargs,
                traceback=exc.__traceback__,
                einfo=None,
            )
            signals.task_postrun.send(
                sender=self, task_id=task_id, task=self, args=args, kwargs=kwargs, retval=exc, state="FAILURE"
            )
            raise
        signals.task_success.send(sender=self, result=result)
        signals.task_postrun.send(
            sender=self, task_id=task_id, task=self, args=args, kwargs=kwargs, retval=result, state="SUCCESS"
        )
        return None if self.ignore_result else result

    def _call(self, request: Request, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        token = _running.set({**_running.get(), self.name: request})
        try:
            if self.bind:
                return self.run(BoundTask(self, request), *args, **kwargs)
            return self.run(*args, **kwargs)
        finally:
            _running.reset(token)

    @property
    def request(self) -> Request:
        """The request of this task's run in progress in this thread, as Celery's ``task.request``
        (outside a run: an empty one, ``called_directly``)."""
        found = _running.get().get(self.name)
        if found is not None:
            return found
        return Request(id=None, retries=0, args=(), kwargs={}, task=self.name, is_eager=True)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: datetime.datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Run this job again later: raises :class:`Retry` (or, with no retries left, dead-letters).

        Called on the task (``task.retry(...)``) or through a bound task's ``self``, it retries
        the run in progress in this thread (:attr:`request`).

        ``countdown`` (or ``eta``) says when; without either, the task's ``default_retry_delay``.
        The job is run again with the same arguments: ``args=`` / ``kwargs=`` that change them
        are refused (enqueue a new job instead). ``throw=False`` is not honoured: the retry is
        raised, since that is how the worker learns of it.
        """
        request = self.request
        if args is not None or kwargs is not None:
            raise InvalidArgumentsError(
                f"{self.name}: self.retry(args=..., kwargs=...) would change the arguments; a jobguard "
                "retry runs the same job again. Enqueue a new job (self.apply_async(...)) and return instead."
            )
        limit = self.max_retries if max_retries is None else max_retries
        if request.called_directly:
            # Called directly (not from a worker): Celery raises the error in place.
            if exc is not None:
                raise exc
            raise Retry(f"{self.name}: retry requested outside a worker")
        if limit is not None and request.retries >= limit:
            message = f"{self.name}: no retries left ({request.retries} of {limit})"
            if exc is not None:
                raise MaxRetriesExceededError(f"{message}: {type(exc).__name__}: {exc}") from exc
            raise MaxRetriesExceededError(message)
        if countdown is None and eta is not None:
            if eta.tzinfo is None:
                eta = eta.replace(tzinfo=datetime.UTC)
            countdown = max(0.0, (eta - datetime.datetime.now(datetime.UTC)).total_seconds())
        if countdown is None:
            countdown = self.default_retry_delay
        reason = f"{type(exc).__name__}: {exc}" if exc is not None else "retry requested"
        error = Retry(f"Retry in {countdown:g}s: {reason}", retry_after=float(countdown))
        signals.task_retry.send(sender=self, request=request, reason=exc or reason, einfo=None)
        if exc is not None:
            raise error from exc
        raise error

    # -- Celery's API ----------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here and now, as Celery's ``task(...)`` does (no job, no signals)."""
        request = Request(id=None, retries=0, args=args, kwargs=kwargs, task=self.name, is_eager=True)
        return self._call(request, args, kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Enqueue a job for this call: ``apply_async(args, kwargs)``."""
        return self.apply_async(args, kwargs)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """Celery 5.4's enqueue after commit. jobguard's enqueue joins the caller's transaction, so
        the job commits (or rolls back) with it: the same effect, at once."""
        self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: datetime.datetime | None = None,
        expires: Any = None,
        queue: str | None = None,
        priority: int | None = None,
        task_id: str | None = None,
        link: Any = None,
        link_error: Any = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a job; the :class:`~.result.AsyncResult` of its id.

        ``countdown`` / ``eta`` become ``run_after``; ``queue`` and ``priority`` (Celery's
        direction, see :func:`priority_direction`) become the job's. ``expires`` is not honoured
        and is refused (a job runs whenever it is claimed). Broker options (``retry``,
        ``serializer``, ``routing_key``, ...) mean nothing without a broker and are accepted.
        With ``CELERY_TASK_ALWAYS_EAGER`` the function runs here and now (:meth:`apply`).
        """
        from .result import AsyncResult

        args, kwargs = _call_arguments(self.name, args, kwargs)
        for name, value, instead in (
            ("task_id", task_id, "jobguard gives each job its id; use an idempotency key for your own"),
            ("link", link, "use chain(this.s(...), next.s())"),
            ("link_error", link_error, "handle failures with a Batch's on_dead callback or a signal"),
            ("expires", expires, "a job runs whenever it is claimed; revoke() late jobs yourself"),
            (
                "time_limit",
                options.pop("time_limit", None),
                "give the task time_limit= (jobguard's timeout=)",
            ),
            ("soft_time_limit", options.pop("soft_time_limit", None), "jobguard has no soft limit"),
        ):
            if value is not None:
                raise InvalidArgumentsError(
                    f"{self.name}: apply_async({name}=...) is not supported: {instead}."
                )
        unknown = sorted(set(options) - _BROKER_OPTIONS)
        if unknown:
            raise InvalidArgumentsError(f"{self.name}: apply_async() has no option {unknown[0]!r}.")
        if celery_setting("TASK_ALWAYS_EAGER", False):
            return self.apply(args, kwargs)  # type: ignore[return-value]
        job = self._using(
            countdown=countdown, eta=eta, queue=queue, priority=priority, call=(args, kwargs)
        ).enqueue(*args, **kwargs)
        return AsyncResult(str(job.pk), task_name=self.name)

    def _using(
        self,
        *,
        countdown: float | None = None,
        eta: datetime.datetime | None = None,
        queue: str | None = None,
        priority: int | None = None,
        call: tuple[Sequence[Any], Mapping[str, Any]] = ((), {}),
    ) -> Task[Any, Any]:
        run_after: datetime.datetime | datetime.timedelta | None = None
        if countdown is not None and eta is not None:
            raise InvalidArgumentsError(f"{self.name}: give countdown or eta, not both.")
        if countdown is not None:
            if isinstance(countdown, bool) or not isinstance(countdown, int | float):
                raise InvalidArgumentsError(f"countdown must be a number of seconds, not {countdown!r}.")
            run_after = datetime.timedelta(seconds=max(float(countdown), 0.0))
        elif eta is not None:
            if not isinstance(eta, datetime.datetime):
                raise InvalidArgumentsError(f"eta must be a datetime, not {eta!r}.")
            # Celery reads a naive eta in UTC (enable_utc, its default).
            run_after = eta if eta.tzinfo is not None else eta.replace(tzinfo=datetime.UTC)
        from .options import celery_priority

        return self.task.using(
            run_after=run_after,
            queue_name=queue or route_for(self.name, *call, task=self),
            priority=None if priority is None else celery_priority(priority, priority_direction()),
        )

    def apply(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> EagerResult:
        """Run the function here and now (no job), with the task's signals: an ``EagerResult``."""
        from .result import EagerResult

        args, kwargs = _call_arguments(self.name, args, kwargs)
        self.task.bind(args, kwargs)
        context = JobContext.detached(self.task)
        try:
            value = self._run(context, tuple(args), dict(kwargs))
        except Exception as exc:
            if celery_setting("TASK_EAGER_PROPAGATES", False):
                raise
            return EagerResult(None, exc, "FAILURE", task_name=self.name)
        return EagerResult(None, value, "SUCCESS", task_name=self.name)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature (Celery's partial): in a chain, receives the previous result first."""
        from .canvas import Signature

        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: in a chain, does not receive the previous result."""
        from .canvas import Signature

        return Signature(self, args, kwargs, immutable=True)

    def signature(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        immutable: bool = False,
        **options: Any,
    ) -> Signature:
        from .canvas import Signature

        return Signature(self, tuple(args or ()), dict(kwargs or {}), immutable=immutable, options=options)

    subtask = signature

    def AsyncResult(self, task_id: str | int) -> AsyncResult:  # noqa: N802 - Celery's name
        from .result import AsyncResult

        return AsyncResult(str(task_id), task_name=self.name)

    def __repr__(self) -> str:
        return f"<@task: {self.name} (django_jobguard.contrib.celery)>"


def _call_arguments(
    name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if args is not None and (isinstance(args, str | bytes | Mapping) or not isinstance(args, Iterable)):
        raise InvalidArgumentsError(f"{name}: args must be a list or tuple, not {type(args).__name__}.")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidArgumentsError(f"{name}: kwargs must be a dict, not {type(kwargs).__name__}.")
    return tuple(args or ()), dict(kwargs or {})


#: Every Celery() app made in this process (the system checks read what was set on its conf).
_apps: list[Celery] = []

#: Every task declared through this module, by name (the system checks read it).
_declared: dict[str, CeleryTask] = {}


def declared_tasks() -> list[CeleryTask]:
    """The Celery-style tasks this process declared, still registered with jobguard."""
    return [found for name, found in sorted(_declared.items()) if registry.find(name) is not None]


def apps() -> list[Celery]:
    """The ``Celery()`` apps this process made."""
    return list(_apps)


def shared_task(*args: Any, **options: Any) -> Any:
    """Celery's ``@shared_task``, with or without options: a :class:`CeleryTask`."""
    bind = bool(options.pop("bind", False))
    if len(args) == 1 and callable(args[0]) and not options:
        return CeleryTask(args[0], bind=bind, options={})
    if args:
        raise InvalidTaskError(
            "shared_task takes options as keywords: @shared_task(bind=True, max_retries=5)."
        )

    def decorate(func: Callable[..., Any]) -> CeleryTask:
        return CeleryTask(func, bind=bind, options=options)

    return decorate


class _Conf(dict[str, Any]):
    """``app.conf``: Celery's lower-case setting names, read from the Django settings (``CELERY_*``)."""

    def __init__(self, namespace: str | None) -> None:
        super().__init__()
        self.namespace = namespace

    def __missing__(self, key: str) -> Any:
        prefix = f"{self.namespace}_" if self.namespace else ""
        if settings.configured:
            return getattr(settings, prefix + key.upper(), None)
        return None

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "namespace":
            super().__setattr__(key, value)
        else:
            self[key] = value


class Celery:
    """A stand-in for ``celery.Celery``: ``app.task``, ``app.conf``, and the calls a ``celery.py`` makes.

    There is no broker or worker to configure: jobguard's workers run the jobs
    (``manage.py jobguard_worker``) and find the tasks in each app's ``tasks.py``.
    """

    def __init__(self, main: str | None = None, *args: Any, broker: str | None = None, **kwargs: Any) -> None:
        self.main = main
        if broker:
            broker_urls.append(str(broker))  # which way its priorities run
        self.conf = _Conf("CELERY")
        #: What config_from_object() was given, other than Django's settings (named by a check).
        self.config_source: Any = None
        _apps.append(self)

    def config_from_object(self, obj: Any, namespace: str | None = None, **kwargs: Any) -> None:
        """``app.config_from_object("django.conf:settings", namespace="CELERY")``: read CELERY_* settings.

        Only Django's settings are read (``CELERY_*``); another source is named by the check
        ``jobguard.celery.W002``.
        """
        self.conf.namespace = namespace
        if obj != "django.conf:settings" and obj is not settings:
            self.config_source = obj

    def autodiscover_tasks(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: jobguard imports every installed app's ``tasks`` module at startup."""

    def task(self, *args: Any, **options: Any) -> Any:
        """``@app.task``: the same as :func:`shared_task`."""
        return shared_task(*args, **options)

    def send_task(
        self,
        name: str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Enqueue a registered task by name."""
        found = _declared.get(name)
        if found is None:
            raise InvalidArgumentsError(
                f"send_task: no Celery-style task is declared as {name!r} in this process."
            )
        return found.apply_async(args, kwargs, **options)

    def AsyncResult(self, task_id: str | int) -> AsyncResult:  # noqa: N802 - Celery's name
        from .result import AsyncResult

        return AsyncResult(str(task_id))

    @property
    def tasks(self) -> dict[str, CeleryTask]:
        return {found.name: found for found in declared_tasks()}

    def __repr__(self) -> str:
        return f"<Celery {self.main} (django_jobguard.contrib.celery)>"
