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
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .exceptions import InvalidArgumentsError, PayloadTooLargeError

__all__ = ["MAX_INTEGER_DIGITS", "normalize_json", "payload_size", "validate_payload"]

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

_END: Any = object()


def _settings_limits() -> tuple[int, int]:
    from .conf import get_settings

    conf = get_settings()
    return conf.max_payload_depth, conf.max_payload_bytes


def _path(where: str, frames: list[list[Any]], upto: int | None = None) -> str:
    """``where`` followed by the key or index of each open container (``kwargs['note'][2]``)."""
    parts = [where]
    for frame in frames[:upto]:
        parts.append(f"[{frame[3]!r}]" if frame[2] else f"[{frame[3]}]")
    return "".join(parts)


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
    hint = " (pass value.isoformat())" if isinstance(value, datetime.date | datetime.time) else ""
    raise InvalidArgumentsError(
        f"{what}: {type(value).__module__}.{type(value).__qualname__} is not JSON-serialisable{hint}."
    )


def _int_str_allowed(value: int) -> bool:
    try:
        str(value)
    except ValueError:  # over this interpreter's int-to-str limit
        return False
    return True


def _walk(value: Any, where: str, max_depth: int, uncounted: int) -> tuple[Any, int]:
    """Normalize ``value``; return it with an upper bound of its compact UTF-8 JSON size.

    ``uncounted`` outer container levels do not count toward ``max_depth`` (1 for the
    ``args`` list and the ``kwargs`` dict, whose items are the arguments).
    """
    if not isinstance(value, list | tuple | dict):
        return _scalar(value, where)
    # A frame: [iterator, output container, is a dict, current key or index, id of the source].
    root_out: Any = {} if isinstance(value, dict) else []
    frames: list[list[Any]] = [_frame(value, root_out)]
    open_ids = {id(value)}
    size = 2 + max(0, len(value) - 1)
    limit = max_depth + uncounted
    while frames:
        frame = frames[-1]
        entry: Any = next(frame[0], _END)
        if entry is _END:
            frames.pop()
            open_ids.discard(frame[4])
            continue
        if frame[2]:
            key, item = entry
            if not isinstance(key, str):
                raise InvalidArgumentsError(
                    f"{_path(where, frames)}: key {key!r} is not a string; JSON objects need string keys."
                )
            frame[3] = key
            _check_string(key, f"{_path(where, frames)}: the key")
            size += 3 + _MAX_BYTES_PER_CHAR * len(key)  # quotes and the colon
        else:
            frame[3] += 1
            item = entry
        if isinstance(item, list | tuple | dict):
            if id(item) in open_ids:
                raise InvalidArgumentsError(
                    f"{_path(where, frames)} contains itself (a reference cycle); JSON cannot represent it."
                )
            if len(frames) >= limit:
                raise InvalidArgumentsError(
                    f"{_path(where, frames, uncounted)} is nested more than {max_depth} levels deep; "
                    "the limit is JOBGUARD['MAX_PAYLOAD_DEPTH']. Flatten the structure, or store it "
                    "elsewhere and pass its id."
                )
            child: Any = {} if isinstance(item, dict) else []
            size += 2 + max(0, len(item) - 1)
            _store(frame, child)
            frames.append(_frame(item, child))
            open_ids.add(id(item))
        else:
            clean, item_size = _scalar(item, _path(where, frames))
            size += item_size
            _store(frame, clean)
    return root_out, size


def _frame(source: Any, out: Any) -> list[Any]:
    if isinstance(source, dict):
        return [iter(source.items()), out, True, None, id(source)]
    return [iter(source), out, False, -1, id(source)]


def _store(frame: list[Any], value: Any) -> None:
    if frame[2]:
        frame[1][frame[3]] = value
    else:
        frame[1].append(value)


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
    clean_args, args_bound = _walk(list(args), "args", max_depth, 1)
    clean_kwargs, kwargs_bound = _walk(dict(kwargs), "kwargs", max_depth, 1)
    if args_bound + kwargs_bound > max_bytes:
        size = payload_size(clean_args, clean_kwargs)
        if size > max_bytes:
            raise PayloadTooLargeError(size, max_bytes, setting)
    return clean_args, clean_kwargs
