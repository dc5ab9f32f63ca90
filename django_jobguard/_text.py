"""Bounded text: error messages and tracebacks stored on every attempt are capped (a leaf module)."""

from __future__ import annotations

__all__ = ["clip"]


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, keeping its head and its tail.

    The head says what failed and the tail where (a traceback's last lines), so the middle
    goes, with a marker saying how much. Text within the limit is returned unchanged, and a
    clipped text clipped again is unchanged too.
    """
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    # The marker's own length is taken out of the kept parts, so the result fits the limit.
    keep = max(limit - len(marker) - 8, 0)
    if keep == 0:
        return text[:limit]
    head = keep // 2
    tail = keep - head
    marker = f"\n[... {len(text) - head - tail} characters cut ...]\n"
    return text[:head] + marker + text[len(text) - tail :]
