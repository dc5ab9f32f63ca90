"""What may be stored as a job's arguments, a result or a checkpoint: plain JSON that both
databases keep as it was given.

:func:`normalize_json` turns a value into plain JSON types or raises
:class:`~django_jobguard.exceptions.InvalidArgumentsError` naming the part that cannot be
stored; :func:`validate_payload` does that for a job's ``args`` and ``kwargs`` and adds the
size limit. Both walk the value with an explicit stack, so no input can exhaust Python's
recursion limit, and both refuse on SQLite exactly what PostgreSQL's ``jsonb`` would refuse
at the INSERT (where the error would abort the caller's transaction).
"""

from __future__ import annotations

import datetime
import decimal
import enum
import fractions
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from .conf import get_settings
from .exceptions import InvalidArgumentsError, PayloadTooLargeError

__all__ = ["MAX_INTEGER_DIGITS", "conversion", "normalize_json", "payload_size", "validate_payload"]

#: Digits an integer may have: Python's default ``sys.get_int_max_str_digits()``. A longer
#: one cannot be written as JSON (or read back) by a process that keeps the default.
MAX_INTEGER_DIGITS = 4300
# An integer below this many bits has fewer than MAX_INTEGER_DIGITS digits: no str() needed.
_INTEGER_BITS_SURELY_SHORT = 14_000
# Upper bounds of the compact UTF-8 JSON of one value, for the size check's fast path: a
# character takes at most six bytes (an escaped control character, \u001f), a float's repr
# at most 24 characters.
_MAX_BYTES_PER_CHAR = 6
_MAX_FLOAT_CHARS = 24


def _settings_limits() -> tuple[int, int]:
    conf = get_settings()
    return conf.max_payload_depth, conf.max_payload_bytes


def _check_string(text: str, what: str) -> None:
    """Refuse what PostgreSQL cannot store in ``jsonb``: NUL, and lone surrogates (not Unicode)."""
    position = text.find("\x00")
    if position >= 0:
        raise InvalidArgumentsError(
            f"{what} holds a NUL character (\\x00) at position {position}; PostgreSQL cannot store "
            "it in JSON, so it is refused on every database. Remove it, or encode binary data "
            "(for example as base64)."
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentsError(
                f"{what} holds a lone surrogate ({text[exc.start]!r}) at position {exc.start}, which is "
                "not valid Unicode and cannot be stored. Decode the text it came from with "
                "errors='replace', or pass the raw bytes encoded (for example as base64)."
            ) from None


def _scalar(value: Any, what: str) -> tuple[Any, int]:
    """``value`` as a plain JSON scalar and an upper bound of its JSON size in bytes."""
    if isinstance(value, str):
        _check_string(value, what)
        return value, 2 + _MAX_BYTES_PER_CHAR * len(value)
    if value is None:
        return None, 4
    if isinstance(value, bool):
        return value, 5
    if isinstance(value, int):
        value = int(value)
        bits = value.bit_length()
        if bits > _INTEGER_BITS_SURELY_SHORT:
            digits = len(str(abs(value))) if _int_str_allowed(value) else MAX_INTEGER_DIGITS + 1
            if digits > MAX_INTEGER_DIGITS:
                raise InvalidArgumentsError(
                    f"{what}: an integer of more than {MAX_INTEGER_DIGITS} digits cannot be stored "
                    "as JSON; pass it as a string."
                )
        return value, bits * 31 // 100 + 2
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgumentsError(f"{what}: {value!r} is not valid JSON (only finite numbers are).")
        return value, _MAX_FLOAT_CHARS
    raise InvalidArgumentsError(
        # "Unsupported type" is Django's own wording (django.tasks): code that matches on it keeps working.
        f"{what}: Unsupported type: {type(value).__module__}.{type(value).__qualname__} is not "
        f"JSON-serialisable; {conversion(value)}."
    )


#: The exact conversion for each type people most often pass, first match wins (datetime
#: before date, its base class): what to store instead, how to get the value back, and what
#: the round trip keeps.
_CONVERSIONS: tuple[tuple[type | tuple[type, ...], str, str, str], ...] = (
    (decimal.Decimal, "str(value)", "decimal.Decimal(value)", "exact, digits and exponent"),
    (
        datetime.datetime,
        "value.isoformat()",
        "datetime.datetime.fromisoformat(value)",
        "exact to the microsecond, with its UTC offset; a ZoneInfo comes back as that offset",
    ),
    (datetime.date, "value.isoformat()", "datetime.date.fromisoformat(value)", "exact"),
    (datetime.time, "value.isoformat()", "datetime.time.fromisoformat(value)", "exact to the microsecond"),
    (
        datetime.timedelta,
        "[value.days, value.seconds, value.microseconds]",
        "datetime.timedelta(*value)",
        "exact",
    ),
    (uuid.UUID, "str(value)", "uuid.UUID(value)", "exact"),
    (fractions.Fraction, "str(value)", "fractions.Fraction(value)", "exact"),
    (PurePath, "str(value)", "pathlib.Path(value)", "exact"),
    ((bytes, bytearray, memoryview), "base64.b64encode(value).decode()", "base64.b64decode(value)", "exact"),
    ((set, frozenset), "sorted(value)", "set(value)", "exact"),
    (enum.Enum, "value.value", "{cls}(value)", "exact"),
)


def conversion(value: Any) -> str:
    """How to pass ``value`` as JSON instead, and get it back: the refusal's advice."""
    cls = type(value)
    for types, store, load, kept in _CONVERSIONS:
        if isinstance(value, types):
            back = load.format(cls=f"{cls.__module__}.{cls.__qualname__}")
            return f"pass {store} instead, and turn it back with {back} where it is read ({kept})"
    if getattr(cls, "_meta", None) is not None and hasattr(value, "pk"):
        return (
            f"pass its primary key (value.pk) instead, and load the row where it is read "
            f"({cls.__qualname__}.objects.get(pk=value)), which then sees its current state"
        )
    return "pass str, int, float, bool, None, or lists and dicts (string keys) of them instead"


def _int_str_allowed(value: int) -> bool:
    try:
        str(value)
    except ValueError:  # over this interpreter's int-to-str limit
        return False
    return True


def _walk(
    value: Any,
    where: str,
    max_depth: int,
    uncounted: int,
    max_bytes: int | None = None,
    setting: str = "",
) -> tuple[Any, int]:
    """Normalize ``value``; return it with an upper bound of its compact UTF-8 JSON size.

    ``uncounted`` outer container levels do not count toward ``max_depth`` (1 for the
    ``args`` list and the ``kwargs`` dict, whose items are the arguments). Containers wait
    on a stack, each output container made in its place before it is filled, so order is
    kept without recursion. A cycle nests without end, so it is looked for only once the
    depth limit is reached: the common case pays nothing for it. Every element takes at
    least a byte, so more elements than ``max_bytes`` is too large without measuring.
    """
    if not isinstance(value, list | tuple | dict):
        return _scalar(value, where)
    root: Any = {} if isinstance(value, dict) else []
    # (source, its output container, its node); a node is (parent node, key in the parent,
    # id of the source, depth), enough to name a path or find a cycle when one is needed.
    stack: list[tuple[Any, Any, _Node]] = [(value, root, (None, None, id(value), 1))]
    limit = max_depth + uncounted
    size = elements = 0
    while stack:
        source, out, node = stack.pop()
        count = len(source)
        size += 2 + (count - 1 if count else 0)
        elements += count
        if max_bytes is not None and elements > max_bytes:
            raise PayloadTooLargeError(None, max_bytes, setting)
        is_dict = isinstance(source, dict)
        depth = node[3]
        for key, item in source.items() if is_dict else enumerate(source):
            if is_dict:
                if type(key) is not str and not isinstance(key, str):
                    raise InvalidArgumentsError(
                        f"{_path(where, node)}: Unsupported type: key {key!r} is not a string; JSON objects "
                        "need string keys."
                    )
                if "\x00" in key or not key.isascii():
                    _check_string(key, f"{_path(where, node, key)}: the key")
                size += 3 + _MAX_BYTES_PER_CHAR * len(key)  # quotes and the colon
            kind = type(item)
            if kind is str:
                if "\x00" in item or not item.isascii():
                    _check_string(item, _path(where, node, key))
                size += 2 + _MAX_BYTES_PER_CHAR * len(item)
                clean = item
            elif kind is int and -_SMALL_INT < item < _SMALL_INT:
                size += _SMALL_INT_CHARS
                clean = item
            elif item is None or kind is bool:
                size += 5
                clean = item
            elif kind is list or kind is dict or kind is tuple or isinstance(item, list | tuple | dict):
                if depth >= limit:
                    raise _too_deep(where, node, key, item, max_depth, uncounted)
                clean = {} if isinstance(item, dict) else []
                stack.append((item, clean, (node, key, id(item), depth + 1)))
            else:
                clean, item_size = _scalar(item, _path(where, node, key))
                size += item_size
            if is_dict:
                out[key] = clean
            else:
                out.append(clean)
    return root, size


_Node = tuple[Any, Any, int, int]
# Integers this small have at most 20 digits and a sign: no digit count needed.
_SMALL_INT = 2**64
_SMALL_INT_CHARS = 21


def _keys(node: _Node | None) -> list[Any]:
    """The keys from the root down to ``node``."""
    keys = []
    while node is not None and node[0] is not None:
        keys.append(node[1])
        node = node[0]
    keys.reverse()
    return keys


def _format(where: str, keys: list[Any]) -> str:
    return where + "".join(f"[{key!r}]" if isinstance(key, str) else f"[{key}]" for key in keys)


def _path(where: str, node: _Node, *key: Any) -> str:
    """``where`` and the keys down to ``node`` (and ``key`` in it): ``kwargs['note'][2]``."""
    return _format(where, [*_keys(node), *key])


def _too_deep(
    where: str, node: _Node, key: Any, item: Any, max_depth: int, uncounted: int
) -> InvalidArgumentsError:
    """The error for a container past the depth limit: a cycle if one is on the way down."""
    chain: list[_Node] = []
    current: _Node | None = node
    while current is not None:
        chain.append(current)
        current = current[0]
    chain.reverse()
    ids = [*(entry[2] for entry in chain), id(item)]
    keys = [*_keys(node), key]
    seen: set[int] = set()
    for level, ident in enumerate(ids):
        if ident in seen:
            return InvalidArgumentsError(
                f"{_format(where, keys[:level])} contains itself (a reference cycle); "
                "JSON cannot represent it."
            )
        seen.add(ident)
    return InvalidArgumentsError(
        f"{_format(where, keys[:uncounted])} is nested more than {max_depth} levels deep; "
        "the limit is JOBGUARD['MAX_PAYLOAD_DEPTH']. Flatten the structure, or store it "
        "elsewhere and pass its id."
    )


def normalize_json(value: Any, where: str, *, max_depth: int | None = None) -> Any:
    """Return ``value`` as plain JSON types, or raise naming the first part that is not.

    Tuples become lists. Refused, so that what the handler receives is exactly what was
    enqueued, on SQLite as on PostgreSQL: non-finite floats, non-string keys, strings (values
    or keys) with a NUL character or a lone surrogate, integers of more than
    :data:`MAX_INTEGER_DIGITS` digits, reference cycles, nesting deeper than ``max_depth``
    (default ``JOBGUARD["MAX_PAYLOAD_DEPTH"]``) and any other type.
    """
    if max_depth is None:
        max_depth = _settings_limits()[0]
    return _walk(value, where, max_depth, 0)[0]


def payload_size(args: Sequence[Any], kwargs: Mapping[str, Any]) -> int:
    """Bytes of ``args`` plus ``kwargs`` as compact UTF-8 JSON (plain JSON values only)."""
    return sum(
        len(json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode()) for part in (args, kwargs)
    )


def validate_payload(
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    max_bytes: int | None = None,
    max_depth: int | None = None,
    setting: str = "JOBGUARD['MAX_PAYLOAD_BYTES']",
) -> tuple[list[Any], dict[str, Any]]:
    """A job's ``args`` and ``kwargs`` as plain JSON, checked before anything is written.

    Raises :class:`~django_jobguard.exceptions.InvalidArgumentsError` naming the argument
    (and the path inside it) for anything :func:`normalize_json` refuses, and
    :class:`~django_jobguard.exceptions.PayloadTooLargeError` when the two together take
    more than ``max_bytes`` as compact UTF-8 JSON. The limits default to
    ``JOBGUARD["MAX_PAYLOAD_BYTES"]`` and ``JOBGUARD["MAX_PAYLOAD_DEPTH"]``; a surface with
    its own, smaller limit passes it, and ``setting`` names where that limit is configured.
    Each argument's value counts its own nesting: ``[]`` is one level deep.
    """
    if max_depth is None or max_bytes is None:
        default_depth, default_bytes = _settings_limits()
        max_depth = default_depth if max_depth is None else max_depth
        max_bytes = default_bytes if max_bytes is None else max_bytes
    if not isinstance(args, list | tuple):
        raise InvalidArgumentsError(f"args must be a list (a JSON array), not {type(args).__name__}.")
    if not isinstance(kwargs, Mapping):
        raise InvalidArgumentsError(f"kwargs must be a dict (a JSON object), not {type(kwargs).__name__}.")
    args = args if isinstance(args, list) else list(args)
    kwargs = kwargs if isinstance(kwargs, dict) else dict(kwargs)
    clean_args, args_bound = _walk(args, "args", max_depth, 1, max_bytes, setting)
    clean_kwargs, kwargs_bound = _walk(kwargs, "kwargs", max_depth, 1, max_bytes, setting)
    if args_bound + kwargs_bound > max_bytes:
        size = payload_size(clean_args, clean_kwargs)
        if size > max_bytes:
            raise PayloadTooLargeError(size, max_bytes, setting)
    return clean_args, clean_kwargs
