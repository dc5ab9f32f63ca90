"""A destination for the outbox tests where no broker is the point: each message a line of a file.

Real I/O, readable from the test's process whatever process relayed: a line is appended
(``O_APPEND``, one ``write``) per delivered message. The payload steers failures:

- ``{"fail_while": "/path/flag"}``: ``PermanentDeliveryError`` while that file exists;
- ``{"transient_while": "/path/flag"}``: ``TransientDeliveryError`` while that file exists;
- ``{"fail_attempts": n}``: ``TransientDeliveryError`` for the first ``n`` attempts;
- ``{"raise": "ValueError"}``: an error nobody classified;
- ``{"trace": "/path/file", "hold": seconds}``: each attempt (failing ones too) appends a
  ``start`` line to that file as it begins and an ``end`` line as it ends, ``hold`` seconds
  later (the destination's own work): the receiver's view of how many sends overlapped, how
  often they came, and when;
- ``{"sleep_after": seconds}``: the destination's own work after the line is written, before the
  relay records the delivery (it waits on no other process): a worker killed then sends the
  message again (a duplicate, same id). The test waits on the delivered lines, not on time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from django_jobguard.outbox.destinations.base import (
    Envelope,
    PermanentDeliveryError,
    TransientDeliveryError,
)


class FileDestination:
    backend: ClassVar[str] = "tests-file"

    def __init__(self, name: str, path: str) -> None:
        self.name = name
        self.path = path
        self.closed = False

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> FileDestination:
        unknown = set(options) - {"PATH"}
        if unknown:
            raise ValueError(
                f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}]: unknown option {sorted(unknown)}"
            )
        path = options.get("PATH")
        if not isinstance(path, str) or not path:
            raise ValueError(f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}]['PATH'] is required")
        return cls(name, path)

    def send(self, envelope: Envelope) -> None:
        payload = envelope.payload if isinstance(envelope.payload, dict) else {}
        trace = payload.get("trace")
        if not trace:
            self._send(envelope, payload)
            return
        _append(trace, self._trace_line(envelope, "start"))
        try:
            if payload.get("hold"):
                # The send's own duration (a slow endpoint), so overlapping sends show in the
                # trace: the work under test, not a wait on another process.
                time.sleep(float(payload["hold"]))
            self._send(envelope, payload)
        finally:
            _append(trace, self._trace_line(envelope, "end"))

    @staticmethod
    def _trace_line(envelope: Envelope, phase: str) -> str:
        return json.dumps(
            {
                "phase": phase,
                "t": time.time(),
                "destination": envelope.destination,
                "key": envelope.key,
                "seq": envelope.seq,
                "attempt": envelope.attempt,
                "pid": os.getpid(),
            }
        )

    def _send(self, envelope: Envelope, payload: dict[str, Any]) -> None:
        if "fail_while" in payload and Path(payload["fail_while"]).exists():
            raise PermanentDeliveryError("refused: the flag file exists")
        if "transient_while" in payload and Path(payload["transient_while"]).exists():
            raise TransientDeliveryError("not now: the flag file exists")
        if envelope.attempt <= payload.get("fail_attempts", 0):
            raise TransientDeliveryError(f"attempt {envelope.attempt} fails on purpose")
        if payload.get("raise") == "ValueError":
            raise ValueError("an error nobody classified")
        line = json.dumps(
            {
                "id": envelope.id,
                "destination": envelope.destination,
                "key": envelope.key,
                "seq": envelope.seq,
                "attempt": envelope.attempt,
                "payload": envelope.payload,
                "headers": dict(envelope.headers),
                "pid": os.getpid(),
            }
        )
        _append(self.path, line)
        if payload.get("sleep_after"):
            time.sleep(float(payload["sleep_after"]))

    def close(self) -> None:
        self.closed = True


def _append(path: str, line: str) -> None:
    # One write of a whole line with O_APPEND: lines of several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def most_at_once(trace: list[dict[str, Any]]) -> int:
    """The most sends under way at once in a ``trace`` file's lines (in the order written)."""
    running = most = 0
    for line in trace:
        running += 1 if line["phase"] == "start" else -1
        most = max(most, running)
    return most


def read(path: Path) -> list[dict[str, Any]]:
    """The messages delivered to ``path``, in delivery order."""
    if not path.exists():
        return []
    # Complete lines only: a worker may be appending one as the test reads.
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def check_order(records: list[dict[str, Any]]) -> tuple[int, int]:
    """What a deduplicating consumer sees: (distinct messages, duplicates); asserts order per key.

    A duplicate must carry the id its (destination, key, seq) had the first time, and the
    first sight of each message must come in seq order 1, 2, 3, ... per key.
    """
    ids: dict[tuple[str, str, int], str] = {}
    last: dict[tuple[str, str], int] = {}
    duplicates = 0
    for record in records:
        place = (record["destination"], record["key"], record["seq"])
        if place in ids:
            assert ids[place] == record["id"], f"a duplicate of {place} carries another id"
            duplicates += 1
            continue
        ids[place] = record["id"]
        stream = (record["destination"], record["key"])
        assert record["seq"] == last.get(stream, 0) + 1, (
            f"key {stream} went from seq {last.get(stream, 0)} to {record['seq']}"
        )
        last[stream] = record["seq"]
    return len(ids), duplicates
