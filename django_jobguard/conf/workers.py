"""The worker process: its id, liveness file and acks; the databases it claims from and LISTENs
on (``POOLED_DATABASES``, ``LISTEN_DATABASE``), how enqueues wake it (``WAKEUP_CACHE``,
``NOTIFY``); and ``TUNING``, the figures timeouts are judged by."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ._values import fail, integer, number, string

#: Characters of a worker id (the ``worker_id`` column's length).
WORKER_ID_MAX_LENGTH = 128

#: The longest ACK_WINDOW: an ack held longer delays what operators see and nears leases' ends.
MAX_ACK_WINDOW_SECONDS = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class TuningSettings:
    """``JOBGUARD["TUNING"]``: the figures the checks and ``jobguard_tune`` judge timeouts by."""

    heartbeat_margin: float
    safety_factor: float
    queue_split_factor: float
    window: float
    min_runs: int


def parse_worker_id(worker_id: Any) -> str:
    if not isinstance(worker_id, str) or len(worker_id) > WORKER_ID_MAX_LENGTH:
        raise fail(("WORKER_ID",), f"must be a string of at most {WORKER_ID_MAX_LENGTH} characters.")
    if "\x00" in worker_id:
        raise fail(("WORKER_ID",), "holds a NUL character (\\x00), which the database cannot store.")
    return worker_id


def parse_liveness_file(liveness_file: Any) -> str:
    if not isinstance(liveness_file, str):
        raise fail(("LIVENESS_FILE",), f"must be a file path (a string), not {liveness_file!r}.")
    return liveness_file


def parse_ack_window(value: Any) -> float:
    window = number(value, ("ACK_WINDOW",))
    if window > MAX_ACK_WINDOW_SECONDS:
        raise fail(("ACK_WINDOW",), f"must be at most {MAX_ACK_WINDOW_SECONDS} seconds, not {value!r}.")
    return window


def _aliases(value: Any, path: tuple[str, ...]) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise fail(path, f"must be a list of database aliases, not {value!r}.")
    return frozenset(string(alias, path) for alias in value)


def _database_alias(value: Any, path: tuple[str, ...]) -> str:
    from django.db import connections

    if value not in connections.settings:
        raise fail(path, f"names {value!r}, which is not in DATABASES ({', '.join(connections.settings)}).")
    return str(value)


def parse_pooled_databases(value: Any) -> frozenset[str]:
    """``POOLED_DATABASES``: a list of aliases, each one in ``DATABASES``."""
    pooled = _aliases(value, ("POOLED_DATABASES",))
    for alias in sorted(pooled):
        _database_alias(alias, ("POOLED_DATABASES",))
    return pooled


def parse_listen_database(listen: Any, pooled: frozenset[str]) -> str:
    """``LISTEN_DATABASE``: empty, or a configured alias outside ``POOLED_DATABASES``."""
    if not isinstance(listen, str):
        raise fail(("LISTEN_DATABASE",), f"must be a database alias, not {listen!r}.")
    if listen:
        _database_alias(listen, ("LISTEN_DATABASE",))
        if listen in pooled:
            raise fail(
                ("LISTEN_DATABASE",),
                f"names {listen!r}, which is in JOBGUARD['POOLED_DATABASES']: LISTEN needs a "
                "connection that bypasses the pooler.",
            )
    return listen


def parse_wakeup_cache(value: Any) -> str:
    """``WAKEUP_CACHE``: "" or a cache alias (check jobguard.E006 tells whether it is django-redis)."""
    if not isinstance(value, str):
        raise fail(("WAKEUP_CACHE",), f"must be a cache alias (a string), or '' for none, not {value!r}.")
    return value


#: ``NOTIFY``'s choices: how an enqueue on PostgreSQL wakes idle workers.
NOTIFY_MODES = ("coalesced", "row", "none")
#: The longest NOTIFY_INTERVAL: an idle worker may wait this long for a job a NOTIFY left unsaid.
MAX_NOTIFY_INTERVAL_SECONDS = 10.0


#: The values of ``STORE``: the database's tables, or the in-memory store (tests only).
STORE_KINDS = ("database", "memory")


def parse_store(value: Any) -> str:
    """``STORE``: one of :data:`STORE_KINDS`."""
    if value not in STORE_KINDS:
        raise fail(("STORE",), f'must be "database" or "memory" (for tests), not {value!r}.')
    return str(value)


def parse_notify(value: Any) -> str:
    """``NOTIFY``: one of :data:`NOTIFY_MODES`."""
    if value not in NOTIFY_MODES:
        choices = ", ".join(repr(mode) for mode in NOTIFY_MODES)
        raise fail(("NOTIFY",), f"must be one of {choices}, not {value!r}.")
    return str(value)


def parse_notify_interval(value: Any) -> float:
    """``NOTIFY_INTERVAL``: seconds, above 0 and at most :data:`MAX_NOTIFY_INTERVAL_SECONDS`."""
    interval = number(value, ("NOTIFY_INTERVAL",), allow_zero=False)
    if interval > MAX_NOTIFY_INTERVAL_SECONDS:
        raise fail(
            ("NOTIFY_INTERVAL",), f"must be at most {MAX_NOTIFY_INTERVAL_SECONDS:g} seconds, not {value!r}."
        )
    return interval


def parse_tuning_settings(tuning: Mapping[str, Any]) -> TuningSettings:
    return TuningSettings(
        heartbeat_margin=number(tuning["HEARTBEAT_MARGIN"], ("TUNING", "HEARTBEAT_MARGIN")),
        safety_factor=number(tuning["SAFETY_FACTOR"], ("TUNING", "SAFETY_FACTOR"), minimum=1),
        queue_split_factor=number(tuning["QUEUE_SPLIT_FACTOR"], ("TUNING", "QUEUE_SPLIT_FACTOR"), minimum=1),
        window=number(tuning["WINDOW"], ("TUNING", "WINDOW"), allow_zero=False),
        min_runs=integer(tuning["MIN_RUNS"], ("TUNING", "MIN_RUNS"), minimum=1),
    )
