"""What the kit reads and moves in whichever store serves the jobs: the database or the memory store."""

from __future__ import annotations

import dataclasses
import datetime
from typing import TYPE_CHECKING, Any

from .. import store

if TYPE_CHECKING:
    from ..models import Job

__all__ = ["all_jobs", "load_jobs", "memory_store_of", "move_memory_back"]


def memory_store_of(alias: str) -> Any:
    """The in-memory store serving ``alias`` (``JOBGUARD["STORE"] = "memory"`` or a substitute), or None."""
    find = getattr(store, "memory_store", None)  # the memory store's public accessor
    return find(alias) if find is not None else None


def all_jobs(alias: str) -> list[Job]:
    """Every job the store holds, oldest first, as ``Job`` instances."""
    memory = memory_store_of(alias)
    if memory is not None:
        return load_jobs(alias, sorted(memory.jobs))
    from ..models import Job

    return list(Job.objects.using(alias).order_by("id"))


def load_jobs(alias: str, ids: list[int]) -> list[Job]:
    """The jobs ``ids`` of the memory store, as ``Job`` instances (its ``load_job``)."""
    load = getattr(store, "load_job")  # noqa: B009 - the memory store's accessor, beside the dialects
    return [load(alias, job_id) for job_id in ids]


def _move_object(obj: Any, step: datetime.timedelta) -> None:
    names = (
        [field.name for field in dataclasses.fields(obj)]
        if dataclasses.is_dataclass(obj)
        else [field.attname for field in obj._meta.concrete_fields]
    )
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, datetime.datetime):
            setattr(obj, name, value - step)


def move_memory_back(memory: Any, seconds: float) -> None:
    """Move every stored time of an in-memory store back by ``seconds`` (see :mod:`.clock`)."""
    step = datetime.timedelta(seconds=seconds)
    for collection in ("jobs", "keys", "locks"):
        for row in getattr(memory, collection, {}).values():
            _move_object(row, step)
    for letter in getattr(memory, "dead_letters", []):
        _move_object(letter, step)
    arrivals = getattr(memory, "arrivals", {})
    for key, value in list(arrivals.items()):
        if value > 0:
            arrivals[key] = value - seconds
