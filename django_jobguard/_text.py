"""Text helpers (a leaf module): bounded error text, and a model instance's fields for key templates.

Error messages and tracebacks stored on every attempt are capped (:func:`clip`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["InstanceFields", "clip"]


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


class InstanceFields(Mapping[str, Any]):
    """``{pk}``, ``{customer_id}``...: a key template's fields, read from a model instance.

    For ``template.format_map(InstanceFields(instance))`` in the declarations made on models
    (cache keys, outbox events): a missing attribute is the template's KeyError.
    """

    def __init__(self, instance: Any) -> None:
        self.instance = instance

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self.instance, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0
