"""Celery's canvas (``signature``, ``.s()``, ``.si()``, ``chain``, ``group``, ``chord``) on workflows.

Every workflow is stored in the caller's transaction, in one go, by
:mod:`django_jobguard.workflows`: a chain's steps wait for the one before and receive its
result as their first positional argument (``.s()``; ``.si()`` receives nothing); a group's
members run side by side; a chord's callback runs once after every member succeeded and
receives their results as a list, in member order. With ``CELERY_TASK_ALWAYS_EAGER`` each
runs here and now instead, as Celery's eager mode does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ... import workflows
from ...exceptions import InvalidArgumentsError
from ...models import Job
from ...task import Signature as Step
from .conf import celery_setting
from .result import AsyncResult, EagerResult, GroupResult, database_alias

__all__ = ["Signature", "chain", "chord", "group", "signature"]

#: Signature options that become the job's (the others are Celery's broker's).
_JOB_OPTIONS = ("countdown", "eta", "queue", "priority")


class Signature:
    """A task with some of its arguments (Celery's ``signature`` / ``.s()`` / ``.si()``)."""

    def __init__(
        self,
        task: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        immutable: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        # Duck-typed: the task module imports this one (task.s()), not the other way round.
        if not (callable(getattr(task, "apply_async", None)) and hasattr(task, "task")):
            raise InvalidArgumentsError(
                f"signature(): {task!r} is not a task declared with shared_task or app.task."
            )
        self.task = task
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.immutable = immutable
        self.options = dict(options or {})

    @property
    def name(self) -> str:
        return str(self.task.name)

    def clone(
        self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Signature:
        """A copy with ``args`` before its own (unless immutable) and ``kwargs`` over its own."""
        new_args = self.args if self.immutable else (*args, *self.args)
        return Signature(
            self.task,
            new_args,
            {**self.kwargs, **(kwargs or {})},
            immutable=self.immutable,
            options={**self.options, **options},
        )

    def set(self, immutable: bool | None = None, **options: Any) -> Signature:
        if immutable is not None:
            self.immutable = immutable
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        self.immutable = immutable

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def apply_async(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Any:
        """Enqueue this task with these arguments (``args`` before the signature's own)."""
        call = self.clone(tuple(args or ()), kwargs, **options)
        return self.task.apply_async(call.args, call.kwargs, **call.options)

    def apply(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
    ) -> EagerResult:
        call = self.clone(tuple(args or ()), kwargs)
        result: EagerResult = self.task.apply(call.args, call.kwargs)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.clone(args, kwargs)
        return self.task(*call.args, **call.kwargs)

    def __or__(self, other: Any) -> Any:
        if isinstance(other, group):
            raise InvalidArgumentsError(
                "a signature piped into a group is not supported: use chord(group, callback)."
            )
        return chain(self, other)

    def step(self, *, receives: bool = False, results: bool = False) -> Step:
        """This signature as a jobguard workflow step (options: queue, priority, countdown, eta)."""
        unknown = sorted(set(self.options) - set(_JOB_OPTIONS))
        options = {key: self.options[key] for key in _JOB_OPTIONS if key in self.options}
        task = self.task._using(**options, call=(self.args, self.kwargs))  # noqa: SLF001
        if unknown:
            raise InvalidArgumentsError(f"{self.name}: a workflow step takes no option {unknown[0]!r}.")
        made: Step = task.s(*self.args, **self.kwargs)
        if results:
            return made.receives_results()
        if receives and not self.immutable:
            return made.receives()
        return made

    def __repr__(self) -> str:
        arguments = [*map(repr, self.args), *(f"{key}={value!r}" for key, value in self.kwargs.items())]
        return f"{'%' if self.immutable else ''}{self.name}({', '.join(arguments)})"


def signature(
    varies: Any, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, **options: Any
) -> Signature:
    """``signature(task, args, kwargs, **options)``, or a copy of a signature."""
    if isinstance(varies, Signature):
        return varies.clone()
    immutable = bool(options.pop("immutable", False))
    return Signature(varies, args, kwargs, immutable=immutable, options=options)


def _eager() -> bool:
    return bool(celery_setting("TASK_ALWAYS_EAGER", False))


class chain:  # noqa: N801 - Celery's name
    """Steps run one after another; each (made with ``.s()``) receives the previous result first."""

    def __init__(self, *tasks: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], Signature | chain) and isinstance(tasks[0], Iterable):
            tasks = tuple(tasks[0])
        steps: list[Signature] = []
        for item in tasks:
            if isinstance(item, chain):
                steps.extend(item.tasks)
            elif isinstance(item, Signature):
                steps.append(item)
            elif isinstance(item, group | chord):
                raise InvalidArgumentsError(
                    "a group inside a chain is not supported: write chord(group, callback) for a group "
                    "followed by a step."
                )
            else:
                raise InvalidArgumentsError(f"chain: {item!r} is not a signature; make one with task.s(...).")
        if not steps:
            raise InvalidArgumentsError("chain() needs at least one signature (task.s(...)).")
        self.tasks: tuple[Signature, ...] = tuple(steps)

    def __or__(self, other: Any) -> chain:
        return chain(self, other)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def apply_async(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> Any:
        """Store the chain; the last step's :class:`AsyncResult` (``.parent`` walks back)."""
        first = self.tasks[0].clone(tuple(args or ()), kwargs, **options)
        steps = [first, *self.tasks[1:]]
        if _eager():
            return _run_chain_eagerly(steps)
        made = [steps[0].step(), *(sig.step(receives=True) for sig in steps[1:])]
        stored = workflows.chain(*made).enqueue()
        result: AsyncResult | None = None
        for sig, job in zip(steps, stored.jobs, strict=True):  # type: ignore[attr-defined]
            result = AsyncResult(str(job.pk), task_name=sig.name, parent=result)
        return result

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.tasks))


def _run_chain_eagerly(steps: Sequence[Signature]) -> EagerResult:
    result = steps[0].apply()
    for sig in steps[1:]:
        if result.failed():
            break
        previous = result
        result = sig.apply(() if sig.immutable else (previous.result,))
        result.parent = previous
    return result


class group:  # noqa: N801 - Celery's name
    """Members that run side by side; ``.get()`` on the result gives their results in order."""

    def __init__(self, *tasks: Any) -> None:
        if len(tasks) == 1 and not isinstance(tasks[0], Signature) and isinstance(tasks[0], Iterable):
            tasks = tuple(tasks[0])
        for item in tasks:
            if not isinstance(item, Signature):
                raise InvalidArgumentsError(
                    f"group: {item!r} is not a signature (task.s(...)); nested chains and groups are "
                    "not supported."
                )
        self.tasks: tuple[Signature, ...] = tuple(tasks)

    def __or__(self, other: Any) -> chord:
        return chord(self, other)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def apply_async(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> GroupResult:
        """Store the members (one batch); a :class:`GroupResult` over their jobs, in member order."""
        members = [sig.clone(tuple(args or ()), kwargs, **options) for sig in self.tasks]
        if not members:
            raise InvalidArgumentsError("group() needs at least one signature (task.s(...)).")
        if _eager():
            return GroupResult(None, [member.apply() for member in members])
        steps = [member.step() for member in members]
        batch = workflows.group(steps).enqueue(steps)
        return _group_result(batch.id, members)

    def __repr__(self) -> str:
        return f"group({list(self.tasks)!r})"


def _group_result(workflow_id: int | None, members: Sequence[Signature]) -> GroupResult:
    # Members are inserted in order, so their ids are too.
    ids = list(
        Job.objects.using(database_alias())
        .filter(workflow_id=workflow_id)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    return GroupResult(
        workflow_id, [AsyncResult(str(pk), task_name=sig.name) for pk, sig in zip(ids, members, strict=False)]
    )


class chord:  # noqa: N801 - Celery's name
    """A group, then a callback that receives the list of the members' results (in member order).

    ``chord(header)(callback)`` or ``chord(header, callback).apply_async()``. The callback
    runs once, after every member succeeded; if one fails it does not run (as in Celery).
    """

    def __init__(self, header: Any, body: Signature | None = None, **options: Any) -> None:
        self.header = header if isinstance(header, group) else group(header)
        self.body = body
        self.options = options

    def __call__(self, body: Signature | None = None, **options: Any) -> Any:
        return self.apply_async(body=body, **options)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        body: Signature | None = None,
        **options: Any,
    ) -> Any:
        """Store the members and the callback; a :class:`ChordResult` (the callback's, once it runs)."""
        callback = body or self.body
        if not isinstance(callback, Signature):
            raise InvalidArgumentsError("chord: give the callback, chord(header)(callback.s()).")
        members = [sig.clone(tuple(args or ()), kwargs, **options) for sig in self.header.tasks]
        if not members:
            raise InvalidArgumentsError("chord() needs at least one member (task.s(...)).")
        if _eager():
            results = [member.apply() for member in members]
            failed = next((r for r in results if r.failed()), None)
            if failed is not None:
                return failed
            return callback.apply(() if callback.immutable else ([r.result for r in results],))
        then = callback.step() if callback.immutable else callback.step(results=True)
        steps = [member.step() for member in members]
        batch = workflows.group(steps, then=then).enqueue(steps)
        return ChordResult(batch.id, _group_result(batch.id, members), callback.name)


class ChordResult:
    """The callback's outcome: its job exists once the last member settled (jobguard enqueues it then).

    ``get()`` waits for the members, then for the callback; ``.children`` is the header's
    :class:`GroupResult`.
    """

    def __init__(self, workflow_id: int | None, children: GroupResult, task_name: str) -> None:
        self.workflow_id = workflow_id
        self.children = children
        self.task_name = task_name

    def _callback(self) -> AsyncResult | None:
        from ...models import WorkflowCallback

        if self.workflow_id is None:
            return None
        job_id = (
            WorkflowCallback.objects.using(database_alias())
            .filter(workflow_id=self.workflow_id, when="success")
            .values_list("job_id", flat=True)
            .first()
        )
        return None if job_id is None else AsyncResult(str(job_id), task_name=self.task_name)

    @property
    def id(self) -> str | None:
        found = self._callback()
        return None if found is None else found.id

    @property
    def state(self) -> str:
        found = self._callback()
        if found is not None:
            return found.state
        return "FAILURE" if self.children.failed() else "PENDING"

    def ready(self) -> bool:
        return self.state in ("SUCCESS", "FAILURE", "REVOKED")

    def successful(self) -> bool:
        return self.state == "SUCCESS"

    def get(self, timeout: float | None = None, propagate: bool = True, **kwargs: Any) -> Any:
        """The callback's result: waits for every member (raising the first failure), then the callback."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        self.children.get(timeout=timeout, propagate=propagate)
        found = self._callback()
        if found is None:
            raise InvalidArgumentsError(
                f"workflow #{self.workflow_id}: every member settled but no callback was enqueued "
                "(a member failed, so the callback does not run)."
            )
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        return found.get(timeout=left, propagate=propagate)

    def __repr__(self) -> str:
        return f"<ChordResult: workflow {self.workflow_id}>"
