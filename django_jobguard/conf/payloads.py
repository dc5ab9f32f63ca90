"""What a job's data may hold: payload depth (``MAX_PAYLOAD_DEPTH``) and redacted names (``REDACT``)."""

from __future__ import annotations

from typing import Any

from ._values import fail, integer, string

# Deeper than this, PostgreSQL's JSON parser and json.loads come near their own stack limits.
MAX_PAYLOAD_DEPTH_CEILING = 500


def parse_depth(value: Any) -> int:
    depth = integer(value, ("MAX_PAYLOAD_DEPTH",), minimum=1)
    if depth > MAX_PAYLOAD_DEPTH_CEILING:
        raise fail(
            ("MAX_PAYLOAD_DEPTH",),
            f"must be at most {MAX_PAYLOAD_DEPTH_CEILING} (deeper JSON nears the stack limits of "
            f"PostgreSQL's parser and of json.loads), not {value!r}.",
        )
    return depth


def parse_redact(value: Any) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise fail(("REDACT",), f"must be a list of argument names such as ['card_number'], not {value!r}.")
    return frozenset(string(name, ("REDACT",)).lower() for name in value)
