"""Reading a destination's options, each error naming the option's full settings key.

``from_options`` runs at startup (the system check calls it), so every mistake found here is
reported before a message is sent: an unknown option (a typo would otherwise fall back to a
default unnoticed), a missing one, a value of the wrong type.
"""

from __future__ import annotations

import math
import os
import re
import string
from collections.abc import Mapping
from typing import Any

__all__ = ["Options"]

# The one option every destination's settings hold that is not its backend's: the relay reads it.
_SHARED = frozenset({"BACKEND"})


class Options:
    """A destination's options; errors name ``JOBGUARD["OUTBOX"]["DESTINATIONS"][name][option]``."""

    def __init__(self, name: str, options: Mapping[str, Any], known: frozenset[str]) -> None:
        if not isinstance(options, Mapping):
            raise ValueError(f"{self._path(name)} must be a dict of options, not {type(options).__name__}")
        self.name = name
        self._options = options
        unknown = sorted(str(key) for key in options if key not in known and key not in _SHARED)
        if unknown:
            raise ValueError(
                f"{self._path(name)}: unknown option {', '.join(map(repr, unknown))} "
                f"(this backend takes {', '.join(sorted(known))})"
            )

    @staticmethod
    def _path(name: str, option: str | None = None) -> str:
        path = f"JOBGUARD['OUTBOX']['DESTINATIONS'][{name!r}]"
        return f"{path}[{option!r}]" if option else path

    def key(self, option: str) -> str:
        """The option's full settings key, for error messages."""
        return self._path(self.name, option)

    def error(self, option: str, problem: str) -> ValueError:
        return ValueError(f"{self.key(option)} {problem}")

    def given(self, option: str) -> bool:
        return option in self._options and self._options[option] is not None

    def text(self, option: str, default: str | None = None, *, allow_empty: bool = False) -> str:
        """A string option; required when ``default`` is None."""
        if not self.given(option):
            if default is None:
                raise self.error(option, "is required")
            return default
        value = self._options[option]
        if not isinstance(value, str):
            raise self.error(option, f"must be a string, not {type(value).__name__}")
        if not value and not allow_empty:
            raise self.error(option, "must not be empty")
        return value

    def seconds(self, option: str, default: float) -> float:
        """A positive, finite number of seconds."""
        if not self.given(option):
            return default
        value = self._options[option]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(option, f"must be a number of seconds, not {type(value).__name__}")
        if not (math.isfinite(value) and value > 0):
            raise self.error(option, f"must be a number of seconds above zero, not {value!r}")
        return float(value)

    def flag(self, option: str, default: bool = False) -> bool:
        if not self.given(option):
            return default
        value = self._options[option]
        if not isinstance(value, bool):
            raise self.error(option, f"must be True or False, not {value!r}")
        return value

    def strings(self, option: str, *, env_option: str | None = None) -> tuple[str, ...]:
        """A non-empty list of strings; else, when ``env_option`` names an environment variable, its words.

        The variable holds the strings separated by commas or whitespace (``"a b"``, ``"a,b"``).
        """
        if self.given(option):
            value = self._options[option]
            if isinstance(value, str) or not isinstance(value, list | tuple):
                raise self.error(option, f"must be a list of strings, not {type(value).__name__}")
            if not value:
                raise self.error(option, "must not be empty")
            for index, item in enumerate(value):
                if not isinstance(item, str) or not item:
                    raise self.error(option, f"item {index} must be a non-empty string, not {item!r}")
            return tuple(value)
        if env_option is not None and self.given(env_option):
            variable = self.text(env_option)
            raw = os.environ.get(variable, "")
            words = tuple(word for word in re.split(r"[\s,]+", raw) if word)
            if not words:
                raise self.error(
                    env_option, f"names the environment variable {variable!r}, which is unset or empty"
                )
            return words
        either = f" (or {self.key(env_option)}, an environment variable holding them)" if env_option else ""
        raise self.error(option, f"is required{either}")

    def str_mapping(self, option: str) -> dict[str, str]:
        """A dict of strings to strings (empty when not given)."""
        if not self.given(option):
            return {}
        value = self._options[option]
        if not isinstance(value, Mapping):
            raise self.error(option, f"must be a dict of strings, not {type(value).__name__}")
        for item_key, item in value.items():
            if not isinstance(item_key, str) or not isinstance(item, str):
                raise self.error(option, f"must map strings to strings: {item_key!r}: {item!r}")
        return dict(value)

    def template(self, option: str, default: str | None = None, *, fields: frozenset[str]) -> str:
        """A ``str.format`` template using only ``fields`` (``{key}``, ``{destination}``)."""
        value = self.text(option, default)
        allowed = ", ".join("{" + name + "}" for name in sorted(fields))
        try:
            used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as exc:
            raise self.error(
                option, f"is not a valid template ({exc}); it may use {allowed}, and {{{{ }}}} for braces"
            ) from None
        wrong = used - fields
        if wrong:
            raise self.error(option, f"uses unknown field {sorted(wrong)}; it may use {allowed}")
        try:
            value.format(**dict.fromkeys(fields, "x"))
        except (ValueError, KeyError, IndexError, AttributeError) as exc:
            raise self.error(option, f"is not a valid template ({exc})") from None
        return value
