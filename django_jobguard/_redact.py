"""``JOBGUARD["REDACT"]``: payload values kept out of logs and stored error text (a leaf module).

Error messages and tracebacks often echo a handler's input (``ValueError: bad card
4111...``), and keys are made from it (``lock="card:{card_number}"``). A payload value under
a redacted name is replaced by ``[redacted]`` wherever its text appears in such strings.
This is best effort: a value the handler transformed (reformatted, hashed, sliced) is not
recognised. The payload itself is stored as sent, since the job needs it to run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .conf import get_settings
from .registry import registry

__all__ = ["REDACTED", "payload_secrets", "redact"]

REDACTED = "[redacted]"


class _Payload(Protocol):
    task_name: str
    args: Any
    kwargs: Any


def payload_secrets(job: _Payload) -> tuple[str, ...]:
    """The text of every value under a redacted name in ``job``'s payload, longest first.

    Names match keyword arguments (and positional arguments, by the parameter they bind to
    when the task is registered here) and the keys of dicts at any depth, in any case. Empty
    when ``JOBGUARD["REDACT"]`` is.
    """
    names = get_settings().redact
    if not names:
        return ()
    found: set[str] = set()
    args = job.args if isinstance(job.args, list | tuple) else []
    kwargs = job.kwargs if isinstance(job.kwargs, Mapping) else {}
    _search(kwargs, names, found)
    _search(_bound_positionals(job.task_name, args, kwargs), names, found)
    _search(args, names, found)
    # Longest first, so a value that contains another is replaced whole.
    return tuple(sorted(found, key=lambda text: (len(text), text), reverse=True))


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``[redacted]``."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def _bound_positionals(task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Positional arguments under the names of the parameters they bind to (when bindable)."""
    task = registry.find(task_name)
    if task is None or not args:
        return {}
    try:
        bound = task.signature.bind_partial(*args, **kwargs)
    except TypeError:
        return {}
    return {name: value for name, value in bound.arguments.items() if name not in kwargs}


def _search(value: Any, names: frozenset[str], found: set[str]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and key.lower() in names:
                _collect(item, found)
            else:
                _search(item, names, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _search(item, names, found)


def _collect(value: Any, found: set[str]) -> None:
    """Every scalar under a redacted name: a dict or list there is secret as a whole."""
    if isinstance(value, Mapping):
        for item in value.values():
            _collect(item, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, found)
    elif value is not None and not isinstance(value, bool):
        # None and booleans read as words ("None", "True") found all over a traceback.
        text = str(value)
        if text:
            found.add(text)
