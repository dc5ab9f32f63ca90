"""Purpose-built tasks for the suite. Discovered by the worker like any app's tasks.py."""

from __future__ import annotations

import os
import signal
import time

from django_jobguard import PermanentError, RecoverableError, TransientError, task

from .models import Execution, Interval, LedgerEntry


class ProviderTimeout(Exception):
    """A user-defined error mapped to transient with retry_on."""


class InvalidOrder(Exception):
    """A user-defined error mapped to permanent with fatal_on."""


@task()
def noop() -> None:
    return None


@task()
def add(a: int, b: int = 0) -> int:
    return a + b


@task(atomic=True, takes_context=True)
def record(context, marker: str, amount: int = 1) -> str:
    """Atomic: the raw execution, the ledger effect and the ack commit together."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    LedgerEntry.objects.create(effect_key=marker, amount=amount, job_id=context.job_id)
    return marker


@task(atomic=True, takes_context=True)
def record_atomic(context, marker: str) -> str:
    """Atomic, and no unique key: a second committed run of a job shows as a second row."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    return marker


@task(takes_context=True)
def record_plain(context, marker: str) -> str:
    """Not atomic: each write commits on its own."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    return marker


@task(atomic=True, takes_context=True, queue_name="slow")
def slow_record(context, marker: str, seconds: float) -> str:
    """Runs longer than a short lease; the heartbeat must keep it alive."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    LedgerEntry.objects.create(effect_key=marker, job_id=context.job_id)
    return marker


@task(takes_context=True, retry_on=(ProviderTimeout,), fatal_on=(InvalidOrder,), max_attempts=4)
def flaky(context, marker: str, failures: int, error: str = "transient") -> int:
    """Fails ``failures`` times with the named error, then succeeds."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if context.attempt <= failures:
        errors = {
            "transient": TransientError,
            "recoverable": RecoverableError,
            "permanent": PermanentError,
            "provider_timeout": ProviderTimeout,
            "invalid_order": InvalidOrder,
            "value": ValueError,
            "system_exit": SystemExit,
        }
        raise errors[error](f"{marker}: planned failure {context.attempt}/{failures}")
    return context.attempt


@task()
def returns_object() -> object:
    return object()


@task(max_attempts=2)
def returns_nul() -> dict:
    """A result PostgreSQL cannot store in jsonb (a NUL character), built in the handler."""
    return {"note": "a" + chr(0) + "b"}


@task(max_attempts=2)
def kills_worker() -> None:
    """Poison: takes its worker down every time."""
    os.kill(os.getpid(), signal.SIGKILL)


@task(timeout=1.0, max_attempts=2)
def hangs(seconds: float = 3600) -> None:
    """Poison: runs past its hard timeout."""
    time.sleep(seconds)


@task(lock="res:{resource}", takes_context=True)
def locked_interval(context, resource: str, hold: float = 0.01) -> None:
    started = time.time()
    time.sleep(hold)
    Interval.objects.create(
        resource=resource,
        started=started,
        ended=time.time(),
        pid=os.getpid(),
        fencing_token=context.fencing_token,
    )


@task(atomic=True, takes_context=True, visibility_timeout=2)
def short_lease(context, marker: str, seconds: float = 0.0, per_attempt: bool = False) -> int:
    """A 2 s lease so crash tests see it expire quickly. Sleeps on the first attempt only.

    Atomic: the execution row, the ledger effect and the ack commit together. With
    ``per_attempt`` the effect key names the attempt, so a stale attempt's effect would
    show up as its own row instead of colliding with the unique key.
    """
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if context.attempt == 1:
        time.sleep(seconds)
    key = f"{marker}:{context.attempt}" if per_attempt else marker
    LedgerEntry.objects.create(effect_key=key, job_id=context.job_id)
    return os.getpid()


@task(takes_context=True, visibility_timeout=2)
def short_lease_plain(context, marker: str, seconds: float = 0.0, path: str = "") -> int:
    """Not atomic: holds no transaction while it sleeps (SQLite-friendly). First attempt sleeps,
    or with ``path`` waits until that file exists (a test's release, whatever the host's load)."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if context.attempt == 1:
        if path:
            _block_until(path)
        else:
            time.sleep(seconds)
    return context.attempt


def _block_until(path: str) -> None:
    """Say the handler started (``path`` + ".started"), then wait until ``path`` exists."""
    with open(f"{path}.started", "w"):
        pass
    deadline = time.monotonic() + 600  # a test that never releases it fails on its own timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@task(atomic=True, takes_context=True)
def blocks_atomic(context, marker: str, path: str) -> int:
    """Atomic: writes, then waits inside its transaction (holding SQLite's write lock) for ``path``."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    _block_until(path)
    LedgerEntry.objects.create(effect_key=marker, job_id=context.job_id)
    return os.getpid()


@task(takes_context=True)
def blocks_plain(context, marker: str, path: str) -> int:
    """Not atomic: its write commits at once, then it waits for ``path`` holding no transaction."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    _block_until(path)
    LedgerEntry.objects.create(effect_key=marker, job_id=context.job_id)
    return os.getpid()


@task(atomic=True, takes_context=True)
def works_for(context, marker: str, path: str, seconds: float) -> int:
    """Atomic: says it started (``path`` + ".started"), works ``seconds``, then writes its effect."""
    with open(f"{path}.started", "w"):
        pass
    time.sleep(seconds)  # the handler's work
    LedgerEntry.objects.create(effect_key=marker, job_id=context.job_id)
    return os.getpid()


@task(takes_context=True)
def writes_until(context, marker: str, path: str) -> int:
    """Not atomic: one short write after another, each committed at once, until ``path`` exists."""
    with open(f"{path}.started", "w"):
        pass
    while not os.path.exists(path):
        Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt)
    return os.getpid()


from . import tasks_cache, tasks_dlq, tasks_encrypted, tasks_faults, tasks_idem, tasks_locks, tasks_otel  # noqa: E402, F401

if os.environ.get("JOBGUARD_TEST_FLOW"):
    from . import tasks_flow  # noqa: F401 - worker processes of the flow-control tests

if os.environ.get("JOBGUARD_TEST_DUAL_RUN"):
    from . import dualrun_jobguard  # noqa: F401 - worker processes of the Celery dual-run test


@task(takes_context=True, queue_name="context")
def describe_context(context) -> dict:
    """Returns what the worker told the handler about its run."""
    return {
        "job_id": context.job_id,
        "attempt": context.attempt,
        "queue_name": context.queue_name,
        "worker_id": context.worker_id,
        "using": context.using,
    }


@task(takes_context=True, visibility_timeout=2)
def until_cancelled(context, seconds_max: float = 120) -> str:
    """Works in small steps until an operator asks it to stop (or the time runs out)."""
    deadline = time.monotonic() + seconds_max
    while time.monotonic() < deadline:
        if context.cancel_requested:
            return "stopped on request"
        time.sleep(0.05)
    return "ran out of time"


@task(api={"queue_name": True, "max_priority": 100})
def api_add(a: int, b: int = 0) -> int:
    """Exposed to the REST API; callers may choose its queue and any priority (tests/api)."""
    return a + b


@task(api={"max_priority": 10}, priority=2)
def api_report(month: str) -> str:
    """Exposed to the REST API; callers may raise its priority up to 10, not change its queue."""
    return month


@task(api=True, lock="document:{document_id}")
def api_render(document_id: str) -> str:
    """Exposed to the REST API, locked per document: the lock key comes from the caller."""
    return document_id


@task(api=True, queue_name="slow")
def api_notify(user_id: int, *, channel: str = "email", items: list | None = None) -> str:
    """Exposed to the REST API, with keyword-only parameters."""
    return f"{user_id}:{channel}"


@task(max_attempts=2, retry={"base": 0.0, "max": 0.0, "jitter": 0.0})
def echoes_payload(blob: str) -> None:
    """Fails with an error that echoes its whole argument, as many real errors do."""
    raise ValueError(f"could not parse {blob}")


@task(api=True, idempotency_key="charge:order:{order_id}")
def api_charge(order_id: int) -> int:
    """Exposed to the REST API, keyed by its own template."""
    return order_id


@task(api=True, idempotency_key="charge-amount:order:{order_id}")
def api_charge_amount(order_id: int, amount: int) -> int:
    """Exposed and keyed by a template that leaves an argument out: callers share the key."""
    return amount


@task(api=True, name="tests.api_anything")
def api_anything(*args: object, **kwargs: object) -> None:
    """Takes any arguments, so the API fuzzing reaches the insert with whatever JSON it makes up."""


@task()
async def add_async(a: int, b: int = 0) -> int:
    """jobguard's own @task on a coroutine function: the worker runs it to completion."""
    import asyncio

    await asyncio.sleep(0.01)
    return a + b


@task(timeout=1.0, max_attempts=1)
async def hangs_async(seconds: float = 3600) -> None:
    """A coroutine past its hard timeout: the watchdog fails it like a blocking handler."""
    import asyncio

    await asyncio.sleep(seconds)


from . import tasks_checklist  # noqa: E402, F401


@task(takes_context=True)
def wf_step(context, marker: str, previous: object = None) -> str:
    """A workflow step: records its run and what the previous step returned."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if previous is not None:
        LedgerEntry.objects.create(effect_key=f"{marker}<-{previous}", job_id=context.job_id)
    return f"{marker}-done"


@task(takes_context=True, max_attempts=1)
def wf_fails(context, marker: str) -> None:
    """A workflow step that is dead-lettered at once."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    raise PermanentError(f"{marker}: planned failure")


@task(takes_context=True)
def wf_callback(context, marker: str, progress: dict | None = None) -> None:
    """A workflow callback: one Execution per run, the progress it was given in the ledger."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if progress is not None:
        LedgerEntry.objects.create(
            effect_key=f"{marker}:{progress['succeeded']}/{progress['failed']}", job_id=context.job_id
        )


@task(takes_context=True, max_attempts=1)
def wf_fails_until_allowed(context, marker: str) -> str:
    """Dead-lettered until a ledger entry ``allow:<marker>`` exists (a fix deployed)."""
    Execution.objects.create(marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid())
    if not LedgerEntry.objects.filter(effect_key=f"allow:{marker}").exists():
        raise PermanentError(f"{marker}: not allowed yet")
    return f"{marker}-done"


# -- the async executor (--async-slots) ------------------------------------------------------


@task(takes_context=True, visibility_timeout=2)
async def sleep_async(context, marker: str, seconds: float = 0.0, first_only: bool = False) -> int:
    """A slow call: waits on the loop, then records its run (through Django's sync_to_async).

    A 2 s lease, so a crash test sees it expire quickly; with ``first_only`` a rerun does not wait.
    """
    import asyncio

    from asgiref.sync import sync_to_async

    if context.attempt == 1 or not first_only:
        await asyncio.sleep(seconds)
    await sync_to_async(Execution.objects.create)(
        marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid()
    )
    return os.getpid()


@task(atomic=True, takes_context=True, visibility_timeout=2)
async def record_async(context, marker: str, seconds: float = 0.0) -> str:
    """Atomic coroutine: its writes and its ack commit together, or none of them (waits on attempt 1)."""
    import asyncio

    from asgiref.sync import sync_to_async

    def write() -> None:
        Execution.objects.create(
            marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid()
        )
        LedgerEntry.objects.create(effect_key=marker, job_id=context.job_id)

    await sync_to_async(write)()
    if context.attempt == 1:
        await asyncio.sleep(seconds)
    return marker


@task(timeout=0.5, max_attempts=1)
async def times_out_async(seconds: float = 30) -> None:
    """Past its 0.5 s timeout: only this coroutine is cancelled."""
    import asyncio

    await asyncio.sleep(seconds)


@task(max_attempts=1)
async def blocks_loop_async(seconds: float = 1.5) -> None:
    """Blocking code inside a coroutine: it stalls the event loop for ``seconds``."""
    time.sleep(seconds)


@task(timeout=2, max_attempts=1)
async def busy_loop_async(seconds: float = 25) -> str:
    """A coroutine that never awaits: it busy-loops on the event loop past its 2 s timeout."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "finished"


@task(takes_context=True, visibility_timeout=2)
async def marks_start_async(context, marker: str, seconds: float = 0.0) -> None:
    """Records that its coroutine began (an Execution row), then waits on the loop."""
    import asyncio

    from asgiref.sync import sync_to_async

    await sync_to_async(Execution.objects.create)(
        marker=marker, job_id=context.job_id, attempt=context.attempt, pid=os.getpid()
    )
    await asyncio.sleep(seconds)


@task()
def thread_name() -> str:
    """A sync task: the name of the thread it ran on."""
    import threading

    return threading.current_thread().name


@task(takes_context=True, idempotency_key="keyed-async:{n}", lock="keyed-async-lock:{n}")
async def keyed_async(context, n: int) -> dict:
    """A coroutine with a key and a lock: both are taken on a DB thread before it starts."""
    return {"n": n, "fencing": context.fencing_token is not None}


@task(takes_context=True)
def counts_with_progress(context, total: int = 1000, report: bool = True) -> int:
    """Reports progress at every step of a tight loop (tests/integration/worker/test_progress.py);
    with ``report=False``, the same loop reporting nothing."""
    for done in range(total + 1):
        if report:
            context.report_progress(done, total, f"step {done}")
    return total


@task(takes_context=True, atomic=True)
def counts_with_progress_atomic(context, total: int = 100, report: bool = True) -> int:
    """As counts_with_progress, in the job's transaction: the last report commits with the ack."""
    for done in range(total + 1):
        if report:
            context.report_progress(done, total, f"step {done}")
    return total


@task(takes_context=True)
async def counts_with_progress_async(context, total: int = 100) -> int:
    """As counts_with_progress, as a coroutine (the async executor writes the last report)."""
    for done in range(total + 1):
        context.report_progress(done, total, f"step {done}")
    return total


@task(takes_context=True, visibility_timeout=3)
def reports_until_released(context, flag_path: str, steps: int = 3) -> str:
    """Reports 1 of ``steps``, then waits (up to two minutes) for ``flag_path`` before the rest."""
    context.report_progress(1, steps, "waiting for the flag")
    deadline = time.monotonic() + 120
    while not os.path.exists(flag_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    context.report_progress(steps, steps, "done")
    return "released"
