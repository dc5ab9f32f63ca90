"""Inline mode: a job runs when the transaction that enqueued it commits, in the enqueuing thread.

Every enqueue is an event (:class:`~django_jobguard.events.JobEnqueued`); in inline mode the
kit's sink answers it with an ``on_commit`` callback that runs the due jobs
(:func:`~.runner.run_jobs`). So a job runs once its row is committed and never before, and a
transaction that rolls back takes the callback with it: its jobs never run.

In a ``TestCase`` the test's own transaction never commits, so Django never runs ``on_commit``
callbacks; the kit runs them where the code under test would have committed:

- an enqueue outside any ``atomic`` block of the code under test (its statement commits at
  once in production) runs its job right away;
- inside one, the callbacks wait until the outermost block of the code under test ends: if it
  commits, they run then (as ``captureOnCommitCallbacks(execute=True)`` would run them); if it
  rolls back, Django has dropped them with its savepoint.

A job run inline that enqueues another leaves it to the run under way, which takes it next.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connections, transaction

from .. import events, store
from ..conf import get_settings
from . import _state
from ._stores import memory_store_of
from .errors import InlineThreadError
from .runner import _testcase_only, run_jobs

__all__ = ["clock_advanced", "install"]

logger = logging.getLogger("django_jobguard.testing")

_installed = False
_install_lock = threading.Lock()
_original_exit: Any = None
#: Callbacks of ours registered and not run or dropped yet (a cheap test on every block's exit).
_pending = 0


def _marked(alias: str) -> Any:
    def run_inline() -> None:
        global _pending
        _pending = max(0, _pending - 1)
        _run(alias)

    run_inline.jobguard_inline = True  # type: ignore[attr-defined]
    return run_inline


def _run(alias: str) -> None:
    if _state.is_draining():
        return
    run_jobs(using=alias, maintenance=False)


def _sink(event: object) -> None:
    if type(event) is not events.JobEnqueued or _state.is_draining():
        return
    if _state.effective_mode() != "inline":
        return
    owner = _state.owner()
    current = threading.current_thread()
    if owner is not None and current is not owner:
        problem = InlineThreadError(
            f"a job of {event.task} was enqueued in inline mode on thread {current.name!r}, which the "
            f"test does not own (the test runs on {owner.name!r}); inline mode runs jobs on the test's "
            "thread only, so it was left queued. Join the thread, then call run_jobs() (manual mode)."
        )
        logger.error("inline_wrong_thread thread=%r task=%r", current.name, event.task)
        _state.problems.append(problem)
        return
    alias = get_settings().database_alias
    _schedule(alias)


def _schedule(alias: str) -> None:
    global _pending
    if memory_store_of(alias) is not None:
        getattr(store, "on_commit")(alias, lambda: _run(alias))  # noqa: B009 - the memory store's
        return
    connection = connections[alias]
    if not connection.in_atomic_block or _testcase_only(alias):
        # Committed already (autocommit), or would have been outside the test's transaction.
        _run(alias)
        return
    _pending += 1
    transaction.on_commit(_marked(alias), using=alias)


def _user_blocks_open(connection: Any) -> bool:
    return any(not vars(block).get("_from_testcase", False) for block in connection.atomic_blocks)


def _atomic_exit(self: Any, exc_type: Any, exc_value: Any, traceback: Any) -> None:
    """``Atomic.__exit__``, then, in a test's transaction, the inline callbacks of the block that ended."""
    global _pending
    _original_exit(self, exc_type, exc_value, traceback)
    if not _pending:
        return
    connection = transaction.get_connection(self.using)
    if not connection.in_atomic_block or _user_blocks_open(connection):
        return  # a real commit ran the callbacks itself; or an outer block of the code is open
    ours = [entry for entry in connection.run_on_commit if getattr(entry[1], "jobguard_inline", False)]
    if not ours:
        return
    connection.run_on_commit = [entry for entry in connection.run_on_commit if entry not in ours]
    _pending = max(0, _pending - len(ours))
    ours[0][1]()  # one run takes every job due; the others would find nothing


def install() -> None:
    """Answer enqueues in inline mode (idempotent). Importing :mod:`django_jobguard.testing` calls it."""
    global _installed, _original_exit
    with _install_lock:
        if _installed:
            return
        events.add_sink(_sink)
        # Django runs no on_commit callback inside a TestCase; this sees the block that would commit.
        _original_exit = transaction.Atomic.__exit__
        setattr(transaction.Atomic, "__exit__", _atomic_exit)  # noqa: B010
        _installed = True


def clock_advanced(alias: str) -> None:
    """A frozen clock moved: in inline mode, what became due runs now."""
    if _state.effective_mode() == "inline" and not _state.is_draining():
        run_jobs(using=alias)
