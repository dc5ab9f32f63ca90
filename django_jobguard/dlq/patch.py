"""One correction for many dead letters: a JSON Patch (RFC 6902: add, replace, remove) of kwargs.

Each operation's ``path`` is a JSON Pointer (RFC 6901) into the replay's payload, under
``/kwargs``: ``/kwargs/amount``, ``/kwargs/items/0/qty``, ``/kwargs/items/-`` (add at the
end). The patch applies to each dead letter's own kwargs, and the result is that letter's
correction, checked against the handler and reviewed as a correction made by hand is.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from ..exceptions import InvalidArgumentsError

__all__ = ["MAX_PATCH_OPERATIONS", "PatchError", "PatchOperation", "apply_patch", "parse_patch"]

#: Operations one patch may hold: a correction, not a rewrite.
MAX_PATCH_OPERATIONS = 50
_OPS = ("add", "replace", "remove")
_ROOT = "kwargs"


class PatchError(InvalidArgumentsError):
    """A patch that is not valid, or that does not apply to one dead letter's kwargs."""


@dataclasses.dataclass(frozen=True)
class PatchOperation:
    op: str
    path: str
    #: The pointer's tokens below ``/kwargs`` (``["items", "0", "qty"]``).
    tokens: tuple[str, ...]
    value: Any = None

    def as_json(self) -> dict[str, Any]:
        return {"op": self.op, "path": self.path, **({"value": self.value} if self.op != "remove" else {})}


def parse_patch(value: Any) -> list[PatchOperation]:
    """The operations of a JSON Patch (JSON text or decoded); :class:`PatchError` naming the fault."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise PatchError(f"The patch is not valid JSON: {exc}") from None
        except RecursionError:
            raise PatchError("The patch is nested too deeply to read.") from None
    if not isinstance(value, list) or not value:
        raise PatchError(
            "A patch is a JSON array of operations, e.g. "
            '[{"op": "replace", "path": "/kwargs/amount", "value": 500}].'
        )
    if len(value) > MAX_PATCH_OPERATIONS:
        raise PatchError(f"A patch holds at most {MAX_PATCH_OPERATIONS} operations, not {len(value)}.")
    operations = []
    for index, item in enumerate(value):
        where = f"Operation {index + 1}"
        if not isinstance(item, dict):
            raise PatchError(f"{where} must be a JSON object with op and path.")
        unknown = sorted(set(item) - {"op", "path", "value"})
        if unknown:
            raise PatchError(
                f"{where} has unsupported members: {', '.join(map(repr, unknown))} (only op, path, value)."
            )
        op = item.get("op")
        if op not in _OPS:
            raise PatchError(f"{where}: op must be one of {', '.join(_OPS)}, not {op!r}.")
        path = item.get("path")
        if not isinstance(path, str):
            raise PatchError(f"{where}: path must be a JSON Pointer string such as /kwargs/amount.")
        tokens = _tokens(path, where)
        if op == "remove":
            if "value" in item:
                raise PatchError(f"{where}: remove takes no value.")
        elif "value" not in item:
            raise PatchError(f"{where}: {op} needs a value.")
        operations.append(PatchOperation(op, path, tokens, item.get("value")))
    return operations


def _tokens(path: str, where: str) -> tuple[str, ...]:
    parts = path.split("/")
    if parts[0] != "" or len(parts) < 3 or parts[1] != _ROOT:
        raise PatchError(f"{where}: path {path!r} must point inside the kwargs, e.g. /kwargs/amount.")
    tokens = []
    for part in parts[2:]:
        if "~" in part.replace("~0", "").replace("~1", ""):
            raise PatchError(f"{where}: path {path!r} has a ~ not followed by 0 or 1.")
        tokens.append(part.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def apply_patch(operations: list[PatchOperation], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``kwargs`` with the operations applied in order; :class:`PatchError` if one fails."""
    document: dict[str, Any] = copy.deepcopy(kwargs)
    for operation in operations:
        parent: Any = document
        for token in operation.tokens[:-1]:
            parent = _child(parent, token, operation.path)
        _apply(parent, operation.tokens[-1], operation)
    return document


def _child(container: Any, token: str, path: str) -> Any:
    if isinstance(container, dict):
        if token not in container:
            raise PatchError(f"{path}: there is no {token!r} to go into.")
        return container[token]
    if isinstance(container, list):
        return container[_index(container, token, path, allow_end=False)]
    raise PatchError(f"{path}: {token!r} is inside a {type(container).__name__}, not an object or array.")


def _index(container: list[Any], token: str, path: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:  # noqa: S105 - RFC 6901's "past the end", not a secret
        return len(container)
    if not (token.isascii() and token.isdecimal()) or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"{path}: {token!r} is not an array index.")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise PatchError(f"{path}: index {index} is past the end of an array of {len(container)}.")
    return index


def _apply(parent: Any, token: str, operation: PatchOperation) -> None:
    path, op = operation.path, operation.op
    value = copy.deepcopy(operation.value)
    if isinstance(parent, dict):
        if op != "add" and token not in parent:
            raise PatchError(f"{path}: there is no {token!r} to {op} (use add to add it).")
        if op == "remove":
            del parent[token]
        else:
            parent[token] = value
        return
    if isinstance(parent, list):
        index = _index(parent, token, path, allow_end=op == "add")
        if op == "add":
            parent.insert(index, value)
        elif op == "replace":
            parent[index] = value
        else:
            del parent[index]
        return
    raise PatchError(f"{path}: the parent is a {type(parent).__name__}, not an object or array.")
