"""Fixtures of the store contract: the two stores every shared test runs against, and flow tasks.

A test here asks for ``rows`` and runs twice in the same run: ``[database]`` against the dialect
that serves the ``default`` alias (SQLite, PostgreSQL or MariaDB, whichever the run is
configured for), ``[memory]`` with a :class:`~django_jobguard.store.memory.MemoryStore`
substituted for that alias. It drives ``store.*`` either way and reads and writes the job
and key rows (and lock rows and dead letters) through ``rows``, never through the ORM. Every
test here does (checked at collection): what only a database does (SQL text and plans, column
widths, a closed connection, breakers, the retention pass) is tested in tests/integration/store/
and tests/integration/flow/, and listed in docs/reference/memory-store.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from django_jobguard import store
from django_jobguard.models import DeadLetter, FlowRate, IdempotencyKey, Job, Lock
from django_jobguard.operations import queues as queues_service
from django_jobguard.store.memory import MemoryStore, StoredJob, StoredLock
from tests.support.flow_tasks import claims_start_from_the_head, flow_tasks, unguarded_tasks

__all__ = ["claims_start_from_the_head", "flow_tasks", "unguarded_tasks"]

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents and "rows" not in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(
                f"{item.nodeid}: a store-contract test takes `rows` (it runs on the database and on "
                "the in-memory store); a test of one database goes in tests/integration/store/"
            )


@pytest.fixture(autouse=True)
def _claims_start_from_the_head(claims_start_from_the_head: None) -> None:
    """Every contract test starts its claims from the head (see tests/support/flow_tasks.py)."""


class DatabaseRows:
    """The job and key rows of the database under test, through the ORM."""

    name = "database"

    def job(self, job_id: int) -> Job:
        return Job.objects.get(pk=job_id)

    def jobs(self) -> list[Job]:
        return list(Job.objects.order_by("pk"))

    def statuses(self) -> dict[int, str]:
        return dict(Job.objects.values_list("pk", "status"))

    def update(self, job_id: int | None = None, **values: Any) -> None:
        """Set columns of one job (every job if ``job_id`` is None), as an operator's write would."""
        jobs = Job.objects.all() if job_id is None else Job.objects.filter(pk=job_id)
        jobs.update(**values)

    def keys(self) -> list[IdempotencyKey]:
        return list(IdempotencyKey.objects.order_by("pk"))

    def rate_keys(self) -> list[str]:
        """The flow-control rate keys the limited claims have spent from."""
        return list(FlowRate.objects.values_list("key", flat=True))

    def dead_letters(self) -> list[DeadLetter]:
        return list(DeadLetter.objects.order_by("pk"))

    def lock(self, key: str) -> Lock:
        return Lock.objects.get(key=key)

    def lock_keys(self) -> set[str]:
        return set(Lock.objects.values_list("key", flat=True))

    def update_lock(self, key: str, **values: Any) -> None:
        Lock.objects.filter(key=key).update(**values)

    def add_lock_row(self, key: str) -> None:
        """A row never taken (the redrive throttle's, which only carries a row lock)."""
        Lock.objects.create(key=key)

    def pause(self, queue: str) -> None:
        queues_service.pause(queue, actor="test", reason="contract")

    def resume(self, queue: str) -> None:
        queues_service.resume(queue, actor="test")


#: Columns a MemoryStore keeps in a job's ``fields`` (those the enqueue inserts).
_FIELD_COLUMNS = {"priority", "max_attempts", "visibility_timeout", "queue_name", "task_name", "flow_keys"}


class MemoryRows:
    """The same rows, read from a :class:`MemoryStore`'s records (shaped like the models)."""

    name = "memory"

    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory

    @staticmethod
    def _view(job: StoredJob) -> SimpleNamespace:
        columns = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name != "fields"}
        return SimpleNamespace(**job.fields, **columns, pk=job.id)

    def job(self, job_id: int) -> SimpleNamespace:
        return self._view(self.memory.jobs[job_id])

    def jobs(self) -> list[SimpleNamespace]:
        return [self._view(job) for _, job in sorted(self.memory.jobs.items())]

    def statuses(self) -> dict[int, str]:
        return {job_id: job.status for job_id, job in self.memory.jobs.items()}

    def update(self, job_id: int | None = None, **values: Any) -> None:
        jobs = self.memory.jobs.values() if job_id is None else [self.memory.jobs[job_id]]
        for job in jobs:
            for name, value in values.items():
                if name in _FIELD_COLUMNS:
                    job.fields[name] = value
                else:
                    getattr(job, name)  # no such column: fail as the ORM would
                    setattr(job, name, value)

    def keys(self) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(**dataclasses.asdict(row), scope=scope, key=key, pk=row.id)
            for (scope, key), row in sorted(self.memory.keys.items(), key=lambda item: item[1].id)
        ]

    def rate_keys(self) -> list[str]:
        return list(self.memory.arrivals)

    def dead_letters(self) -> list[Any]:
        return list(self.memory.dead_letters)

    def lock(self, key: str) -> StoredLock:
        return self.memory.locks[key]

    def lock_keys(self) -> set[str]:
        return set(self.memory.locks)

    def update_lock(self, key: str, **values: Any) -> None:
        row = self.memory.locks[key]
        for name, value in values.items():
            getattr(row, name)  # no such column: fail as the ORM would
            setattr(row, name, value)

    def add_lock_row(self, key: str) -> None:
        self.memory.locks[key] = StoredLock(fencing_token=0)

    def pause(self, queue: str) -> None:
        self.memory.paused.add(queue)

    def resume(self, queue: str) -> None:
        self.memory.paused.discard(queue)


@pytest.fixture(params=["database", "memory"])
def rows(request: pytest.FixtureRequest):
    """The store under test and a view of its rows: the configured database's, or a MemoryStore."""
    if request.param == "database":
        yield DatabaseRows()
        return
    with store.substitute("default", MemoryStore()) as memory:
        assert isinstance(memory, MemoryStore)
        yield MemoryRows(memory)
    # The memory store served the whole test: nothing of it reached the database.
    assert not (
        Job.objects.exists()
        or IdempotencyKey.objects.exists()
        or FlowRate.objects.exists()
        or Lock.objects.exists()
        or DeadLetter.objects.exists()
    )
