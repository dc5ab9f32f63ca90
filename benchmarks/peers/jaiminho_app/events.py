"""The event function: ``send`` is saved to jaiminho's outbox and called by its relay.

It writes to the Redis stream the other relays of ``bench_outbox.py`` write to, with the fields
jobguard's Redis destination writes (``id``, ``jobguard-key``, ``-seq``, ``payload``), so that
the same consumer reads all three. The stream comes from ``BENCH_JAIMINHO_REDIS`` (the
destination's options, JSON), set for the relay processes: it changes every run.
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any

from jaiminho.send import save_to_outbox


@cache
def _stream() -> tuple[Any, str]:
    import redis

    options = json.loads(os.environ["BENCH_JAIMINHO_REDIS"])
    return redis.Redis.from_url(options["URL"]), options["STREAM"]


@save_to_outbox
def send(message_id: str, key: str, seq: int, payload: dict[str, Any]) -> None:
    client, stream = _stream()
    client.xadd(
        stream,
        {"jobguard-key": key, "jobguard-seq": str(seq), "id": message_id, "payload": json.dumps(payload)},
    )
