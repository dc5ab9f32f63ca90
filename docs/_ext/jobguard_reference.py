"""Facts about django_jobguard read from its source: the material of the generated reference.

No Sphinx here, so the test suite can check the same facts the docs build renders (every
setting has a comment, every check a hint, every signal its arguments).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "Check",
    "Setting",
    "SignalDoc",
    "collect_checks",
    "collect_settings",
    "collect_signals",
    "command_names",
    "read_elsewhere",
    "runtime_paths",
]


def source_of(module: Any) -> tuple[Path, str]:
    path = Path(module.__file__)
    return path, path.read_text(encoding="utf-8")


def _comment_above(lines: list[str], lineno: int, marker: str = "#") -> str:
    """The block of comment lines directly above 1-based line ``lineno``, joined."""
    found: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith(marker):
        found.append(lines[index].strip()[len(marker) :].strip())
        index -= 1
    return " ".join(reversed(found))


def package_sources() -> Iterator[tuple[str, str]]:
    """(dotted module name, source) of every module of django_jobguard but its migrations."""
    import django_jobguard

    root = Path(django_jobguard.__file__).parent
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).with_suffix("")
        if "migrations" in relative.parts:
            continue
        name = ".".join(relative.parts).removesuffix(".__init__")
        yield name, path.read_text(encoding="utf-8")


@dataclasses.dataclass
class Setting:
    path: tuple[str, ...]
    default: Any
    comment: str
    expression: str

    @property
    def name(self) -> str:
        return ".".join(self.path)


def _is_group(node: ast.expr) -> bool:
    """Groups (LOCKS, ...) are dicts of upper-case keys; values such as RETRY have lower-case ones."""
    return (
        isinstance(node, ast.Dict)
        and bool(node.keys)
        and all(isinstance(k, ast.Constant) and str(k.value).isupper() for k in node.keys)
    )


def collect_settings() -> list[Setting]:
    """Every leaf of ``DEFAULTS``, in source order, with the comment above it in conf/defaults.py."""
    from django_jobguard.conf import defaults

    _, source = source_of(defaults)
    lines = source.splitlines()
    tree = ast.parse(source)
    value: ast.expr | None = None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "DEFAULTS":
            value = node.value  # type: ignore[attr-defined]
    if not isinstance(value, ast.Dict):
        raise RuntimeError("django_jobguard/conf/defaults.py: DEFAULTS is no longer a dict literal")

    found: list[Setting] = []

    def walk(node: ast.Dict, prefix: tuple[str, ...]) -> None:
        for key_node, value_node in zip(node.keys, node.values, strict=True):
            if not isinstance(key_node, ast.Constant):
                raise RuntimeError("django_jobguard/conf/defaults.py: DEFAULTS keys must be string literals")
            path = (*prefix, str(key_node.value))
            if _is_group(value_node):
                walk(value_node, path)  # type: ignore[arg-type]
                continue
            default: Any = defaults.DEFAULTS
            for part in path:
                default = default[part]
            found.append(
                Setting(
                    path=path,
                    default=default,
                    comment=_comment_above(lines, key_node.lineno),
                    expression=ast.get_source_segment(source, value_node) or "",
                )
            )

    walk(value, ())
    return found


def runtime_paths(value: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    paths: set[tuple[str, ...]] = set()
    for key, item in value.items():
        if isinstance(item, dict) and item and all(str(k).isupper() for k in item):
            paths |= runtime_paths(item, (*prefix, key))
        else:
            paths.add((*prefix, key))
    return paths


def read_elsewhere(attribute: str) -> bool:
    """Whether a module outside the ``conf`` package mentions the parsed setting's attribute name."""
    pattern = re.compile(rf"\b{re.escape(attribute)}\b")
    return any(
        pattern.search(source)
        for name, source in package_sources()
        if name != "django_jobguard.conf" and not name.startswith("django_jobguard.conf.")
    )


def command_names() -> list[str]:
    commands = importlib.import_module("django_jobguard.management.commands")
    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))


@dataclasses.dataclass
class Check:
    id: str
    level: str
    message: str | None
    message_code: str
    hint: str | None


def _template(node: ast.expr | None) -> str | None:
    """A string literal or f-string as text, with f-string fields kept as ``{...}``."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue):
                conversion = "" if value.conversion == -1 else "!" + chr(value.conversion)
                parts.append("{" + ast.unparse(value.value) + conversion + "}")
        return "".join(parts)
    return None


def check_modules() -> list[Any]:
    """The modules that register system checks: the ``checks`` package's, then contrib's."""
    from django_jobguard import checks
    from django_jobguard.contrib.celery import checks as celery_checks

    return [checks, *(getattr(checks, name) for name in checks.__all__), celery_checks]


def collect_checks() -> list[Check]:
    found = []
    nodes = [node for module in check_modules() for node in ast.walk(ast.parse(source_of(module)[1]))]
    for node in nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)):
            continue
        level = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if level not in ("Debug", "Info", "Warning", "Error", "Critical"):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        check_id = keywords.get("id")
        if not (isinstance(check_id, ast.Constant) and isinstance(check_id.value, str)):
            continue
        message = node.args[0] if node.args else keywords.get("msg")
        found.append(
            Check(
                id=check_id.value,
                level=level.lower(),
                message=_template(message),
                message_code=ast.unparse(message) if message is not None else "",
                hint=_template(keywords.get("hint")),
            )
        )
    return sorted(found, key=lambda c: c.id)


@dataclasses.dataclass
class SignalDoc:
    name: str
    comment: str
    senders: list[str]


def _public_module(module: str, sources: dict[str, str]) -> str:
    """The module users import a sender from: its package, when the package re-exports it.

    ``django_jobguard.dlq.transitions`` is named ``django_jobguard.dlq``: its ``__init__`` imports
    from it, and callers import the sending functions from there.
    """
    package, _, name = module.rpartition(".")
    if re.search(rf"^from \.{re.escape(name)} import\b", sources.get(package, ""), re.MULTILINE):
        return package
    return module


def collect_signals() -> list[SignalDoc]:
    from django_jobguard import signals

    sources = dict(package_sources())
    _, source = source_of(signals)
    lines = source.splitlines()
    found: list[SignalDoc] = []
    previous_line = -1
    for node in ast.parse(source).body:
        if not (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "Signal"
        ):
            continue
        name = node.targets[0].id  # type: ignore[attr-defined]
        comment = _comment_above(lines, node.lineno, marker="#:")
        if not comment and found and previous_line == node.lineno - 1:
            comment = found[-1].comment  # one comment above a run of related signals
        # Sent directly (``signals.job_started.send(...)``) or picked from a table of signals
        # (``{"approved": signals.replay_approved}``): a module that names it sends it.
        pattern = re.compile(rf"\bsignals\.{name}\b|\b{name}\.send(?:_robust)?\(")
        modules = [
            module
            for module, text in sources.items()
            if module != "django_jobguard.signals" and pattern.search(text)
        ]
        senders = list(dict.fromkeys(_public_module(module, sources) for module in modules))
        found.append(SignalDoc(name=name, comment=comment, senders=senders))
        previous_line = node.end_lineno or node.lineno
    return found
