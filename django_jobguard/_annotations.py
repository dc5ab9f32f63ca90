"""Whether JSON values fit a handler's annotations, as far as JSON can tell.

A corrected replay payload binds to the handler's signature and still fails at run time when
``{"n": "abc"}`` meets ``n: int``. Only what JSON carries is checked: ``int``, ``float``,
``str``, ``bool``, ``None``, ``list[...]``, ``dict[str, ...]``, their unions and ``Optional``.
Any other annotation (a model, a dataclass, ``Any``) is the handler's to check: it passes.
"""

from __future__ import annotations

import contextlib
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["mismatches"]

_UNKNOWN = object()


def mismatches(func: Callable[..., Any], arguments: Mapping[str, Any]) -> list[str]:
    """One line per argument whose JSON value cannot be what its annotation asks for."""
    hints = _hints(func)
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return []
    problems = []
    for name, value in arguments.items():
        hint = hints.get(name, _UNKNOWN)
        parameter = parameters.get(name)
        if hint is _UNKNOWN or parameter is None:
            continue
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            bad = [item for item in value if _fits(item, hint) is False]
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            bad = [item for item in value.values() if _fits(item, hint) is False]
        else:
            bad = [value] if _fits(value, hint) is False else []
        if bad:
            problems.append(f"{name}={_short(bad[0])} is not {_describe(hint)}")
    return problems


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations; one at a time when some do not resolve (TYPE_CHECKING names)."""
    with contextlib.suppress(Exception):
        return typing.get_type_hints(func)
    hints = {}
    for name, annotation in getattr(func, "__annotations__", {}).items():
        # A blank function with the handler's globals resolves one annotation on its own;
        # one that does not resolve here is left to the handler.
        probe = types.FunctionType(_probe.__code__, getattr(func, "__globals__", {}))
        probe.__annotations__ = {name: annotation}
        with contextlib.suppress(Exception):
            hints[name] = typing.get_type_hints(probe)[name]
    return hints


def _probe() -> None:
    pass


def _fits(value: Any, hint: Any) -> bool | None:
    """True or False where JSON can tell, None where the annotation is beyond JSON."""
    if hint is Any or hint is object:
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        verdicts = [_fits(value, member) for member in typing.get_args(hint)]
        if any(v is True for v in verdicts):
            return True
        return None if any(v is None for v in verdicts) else False
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint in (list, tuple) or origin in (list, tuple, Sequence):
        if not isinstance(value, list):
            return False
        inner = typing.get_args(hint)
        if origin is tuple or not inner or len(inner) != 1:
            return True
        verdicts = [_fits(item, inner[0]) for item in value]
        return False if any(v is False for v in verdicts) else True
    if hint is dict or origin in (dict, Mapping):
        if not isinstance(value, dict):
            return False
        inner = typing.get_args(hint)
        if len(inner) != 2:
            return True
        verdicts = [_fits(item, inner[1]) for item in value.values()]
        return False if any(v is False for v in verdicts) else True
    return None


def _describe(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
