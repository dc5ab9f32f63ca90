"""On PostgreSQL, how enqueues wake idle workers under each ``JOBGUARD["NOTIFY"]`` mode.

"row": a trigger notifies inside each enqueuing transaction (once per queue: PostgreSQL folds
equal payloads). "coalesced": the enqueuing transaction does not notify; a thread of the process
does after its commit, at most once per queue per NOTIFY_INTERVAL, and announces every job within
an interval. "none": nothing does. Read by a real
LISTENing connection, as a worker's listener reads them; the mode is installed in the test
database as ``migrate`` installs it.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_jobguard import store
from django_jobguard.models import Job
from tests.testapp import tasks

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CHANNEL = "jobguard_jobs"


def _listener() -> psycopg.Connection:
    db = connection.settings_dict
    conn = psycopg.connect(
        dbname=db["NAME"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        host=db["HOST"],
        port=db["PORT"] or None,
        autocommit=True,
    )
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


def _received(conn: psycopg.Connection, settle: float = 0.5) -> list[str]:
    """The payloads delivered to ``conn`` until none has come for ``settle`` seconds."""
    payloads = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = [n.payload for n in conn.notifies(timeout=settle) if n.channel == CHANNEL]
        if not batch:
            break
        payloads += batch
    return payloads


@pytest.fixture
def notify_mode() -> Iterator[Callable[..., None]]:
    """``notify_mode(mode, **settings)``: JOBGUARD["NOTIFY"] set, and installed in the database."""
    stack = contextlib.ExitStack()

    def use(mode: str, **extra: object) -> None:
        stack.enter_context(override_settings(JOBGUARD={**settings.JOBGUARD, "NOTIFY": mode, **extra}))
        assert store.install_notify_mode(connection.alias) == mode

    yield use
    stack.close()
    store.install_notify_mode(connection.alias)  # the suite's own setting again


def _queue(name: str) -> str:
    # A queue of its own per test: the coalesced NOTIFYs of this process are spaced per queue.
    return f"{name}-{time.monotonic_ns()}"


@pytest.mark.parametrize("mode", ["row", "coalesced"])
def test_a_bulk_enqueue_of_many_rows_sends_one_notify(notify_mode, mode):
    notify_mode(mode)
    queue = _queue("bulk")
    with _listener() as listener:
        jobs = tasks.noop.using(queue_name=queue).bulk_enqueue(((), {}) for _ in range(200))
        assert len(jobs) == 200
        assert _received(listener) == [queue]


@pytest.mark.parametrize("mode", ["row", "coalesced"])
def test_many_single_enqueues_in_one_transaction_send_one_notify_per_queue(notify_mode, mode):
    notify_mode(mode)
    first, second = _queue("first"), _queue("second")
    with _listener() as listener:
        with transaction.atomic():
            for i in range(50):
                tasks.add.using(queue_name=first).enqueue(i)
            for _ in range(20):
                tasks.add.using(queue_name=second).enqueue(1)
        assert sorted(_received(listener)) == sorted([first, second])


def test_row_mode_notifies_each_autocommitted_enqueue(notify_mode):
    # The other side of the two tests above: the listener does see one per transaction.
    notify_mode("row")
    queue = _queue("row")
    with _listener() as listener:
        for i in range(3):
            tasks.add.using(queue_name=queue).enqueue(i)
        assert _received(listener) == [queue] * 3


def test_coalesced_mode_notifies_each_queue_once_per_interval_and_announces_the_last_job(notify_mode):
    interval = 0.5
    notify_mode("coalesced", NOTIFY_INTERVAL=interval)
    queue, other = _queue("coalesced"), _queue("other")
    heard: dict[str, list[float]] = {queue: [], other: []}
    enqueued = 0
    with _listener() as listener:
        until = time.monotonic() + 3 * interval
        while time.monotonic() < until:
            tasks.add.using(queue_name=queue).enqueue(enqueued)
            enqueued += 1
            # Taken as the enqueue returns: its own NOTIFY (the first of a new interval) may be
            # read in this same round, and then it is the last job's announcement.
            last_enqueued = time.monotonic()
            for note in listener.notifies(timeout=0.01):
                heard.setdefault(note.payload, []).append(time.monotonic())
        tasks.add.using(queue_name=other).enqueue(1)
        deadline = time.monotonic() + 30
        # The last job of each queue is announced, within an interval (the trailing NOTIFY).
        while time.monotonic() < deadline and not (heard[other] and heard[queue][-1] >= last_enqueued):
            for note in listener.notifies(timeout=0.1):
                heard.setdefault(note.payload, []).append(time.monotonic())
    assert heard[other], "the other queue was announced"
    assert heard[queue][-1] >= last_enqueued, "the last job was announced"
    assert 2 <= len(heard[queue]) < enqueued, (len(heard[queue]), enqueued)
    # No closer together than the interval (a lower bound: a slow machine only spaces them more).
    gaps = [later - earlier for earlier, later in itertools.pairwise(heard[queue])]
    assert min(gaps) >= interval * 0.9, gaps


@pytest.mark.parametrize(("mode", "notified"), [("row", True), ("coalesced", False), ("none", False)])
def test_only_the_row_mode_has_the_enqueuing_transaction_notify(notify_mode, mode, notified):
    # A row inserted without the enqueue path (which announces after the commit) shows what the
    # trigger does inside the inserting transaction.
    notify_mode(mode)
    queue = _queue("trigger")
    with _listener() as listener:
        Job.objects.create(task_name="tests.testapp.tasks.noop", queue_name=queue)
        assert _received(listener) == ([queue] if notified else [])


@pytest.mark.parametrize(("mode", "notified"), [("row", True), ("coalesced", True), ("none", False)])
def test_a_job_put_back_in_the_queue_notifies_unless_the_mode_is_none(notify_mode, mode, notified):
    notify_mode(mode)
    queue = _queue("requeued")
    job = Job.objects.create(task_name="tests.testapp.tasks.noop", queue_name=queue, status="cancelled")
    with _listener() as listener:
        Job.objects.filter(pk=job.pk).update(status="queued")
        assert _received(listener) == ([queue] if notified else [])


def test_none_mode_sends_nothing(notify_mode):
    notify_mode("none")
    queue = _queue("none")
    with _listener() as listener:
        tasks.add.using(queue_name=queue).enqueue(1)
        with transaction.atomic():
            tasks.add.using(queue_name=queue).enqueue(2)
        tasks.noop.using(queue_name=queue).bulk_enqueue(((), {}) for _ in range(10))
        assert _received(listener) == []


def test_a_delayed_job_is_not_notified_in_any_mode(notify_mode):
    for mode in ("row", "coalesced"):
        notify_mode(mode)
        queue = _queue(f"delayed-{mode}")
        with _listener() as listener:
            tasks.add.using(queue_name=queue, run_after=datetime.timedelta(minutes=1)).enqueue(1)
            assert _received(listener) == [], mode


def test_a_rolled_back_enqueue_notifies_nothing(notify_mode):
    notify_mode("coalesced")
    queue = _queue("rolled-back")
    with _listener() as listener:
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.using(queue_name=queue).enqueue(1)
            raise RuntimeError("roll back")
        assert _received(listener) == []


def test_a_transaction_run_by_hand_carries_its_own_notify(notify_mode):
    # Autocommit off and no atomic block: no commit hook to wait for, so the NOTIFY joins the
    # transaction and is delivered at its commit.
    notify_mode("coalesced")
    queue = _queue("by-hand")
    with _listener() as listener:
        transaction.set_autocommit(False)
        try:
            tasks.add.using(queue_name=queue).enqueue(1)
            assert _received(listener, settle=0.2) == [], "nothing before the commit"
            transaction.commit()
        finally:
            transaction.set_autocommit(True)
        assert _received(listener) == [queue]


def test_migrate_installs_the_setting(notify_mode):
    from django.core.management import call_command

    notify_mode("row")
    with override_settings(JOBGUARD={**settings.JOBGUARD, "NOTIFY": "none"}):
        call_command("migrate", "jobguard", verbosity=0)
        assert store.installed_notify_mode(connection.alias) == "none"


def test_a_database_running_another_mode_than_the_setting_warns(notify_mode):
    from django_jobguard import checks

    notify_mode("row")
    assert checks.database.check_notify_mode(databases=[connection.alias]) == [], "the same mode"
    with override_settings(JOBGUARD={**settings.JOBGUARD, "NOTIFY": "coalesced"}):
        (warning,) = checks.database.check_notify_mode(databases=[connection.alias])
    assert warning.id == "jobguard.W067"
    assert warning.msg == (
        f"The database of {connection.alias!r} runs the NOTIFY mode 'row', but JOBGUARD['NOTIFY'] is "
        "'coalesced': every enqueuing commit still notifies, and waits its turn on PostgreSQL's notify lock."
    )
