"""A key-level diff of two JSON values: the paths whose value changed, and nothing else."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from .. import dlq

__all__ = ["ABSENT", "Change", "changes"]

# The replay review's marker for "this payload has no such argument" stands for a missing
# key or item here too, so a review's values go in unchanged.
ABSENT = dlq.ABSENT


@dataclasses.dataclass(frozen=True)
class Change:
    """One leaf that differs: its path (``items[0].qty``) and both values (or :data:`ABSENT`)."""

    path: str
    original: Any
    corrected: Any


def changes(path: str, original: Any, corrected: Any) -> Iterator[Change]:
    """The changed leaves under ``path``, in order; objects by key, lists by index."""
    if original == corrected and type(original) is type(corrected):
        return
    if isinstance(original, dict) and isinstance(corrected, dict):
        for key in [*original, *(k for k in corrected if k not in original)]:
            yield from changes(
                f"{path}.{key}" if path else str(key),
                original.get(key, ABSENT),
                corrected.get(key, ABSENT),
            )
        return
    if isinstance(original, list) and isinstance(corrected, list):
        for index in range(max(len(original), len(corrected))):
            yield from changes(
                f"{path}[{index}]",
                original[index] if index < len(original) else ABSENT,
                corrected[index] if index < len(corrected) else ABSENT,
            )
        return
    yield Change(path, original, corrected)
