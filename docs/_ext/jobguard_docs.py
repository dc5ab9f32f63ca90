"""Sphinx extension: reference pages generated from the code, so they cannot drift from it.

Directives (write them in MyST as ```` ```{jobguard-settings} ````):

- ``jobguard-settings``: every key of ``django_jobguard.conf.DEFAULTS``, its default, and the
  comment written above it in ``conf/defaults.py`` (a key without a comment fails the build).
- ``jobguard-queue-options``: the options a ``JOBGUARD["QUEUES"]`` entry takes.
- ``jobguard-commands``: every management command of the package, from its argparse parser.
- ``jobguard-checks``: every system check ID in the ``checks`` package, with its level, message and hint.
- ``jobguard-signals``: every signal in ``signals.py``, its comment, and the modules that send it.
- ``jobguard-celery-options``: the Celery task options and ``CELERY_*`` settings the Celery
  compatibility module does not honour or has no use for, from its own tables.

Two settings keep a docs tree that other branches add pages to buildable with ``-W``:

- ``jobguard_optional_globs``: toctree glob patterns that may match no page yet.
- ``jobguard_pending_pages``: pages being written elsewhere (docnames). A Markdown link to one
  renders as plain text until the page exists, and as a normal link from then on.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import posixpath
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from jobguard_reference import (
    check_modules,
    collect_checks,
    collect_settings,
    collect_signals,
    command_names,
    read_elsewhere,
    runtime_paths,
)
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging as sphinx_logging
from sphinx.util.docutils import SphinxDirective

logger = sphinx_logging.getLogger(__name__)

#: Width of the generated ``--help`` text, so it does not depend on the terminal of the build.
HELP_COLUMNS = 96


# -- helpers ---------------------------------------------------------------------------------


def _literal(value: Any, *, as_repr: bool = False) -> str:
    """``value`` (or its repr) as inline code, whatever backticks it holds."""
    text = repr(value) if as_repr or not isinstance(value, str) else value
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _escape(text: str) -> str:
    """A code comment made safe to parse as Markdown; its ``code`` spans stay code spans."""
    parts = re.split(r"(`+.*?`+)", text)
    return "".join(
        part if part.startswith("`") else re.sub(r"([\\*_\[\]<>{}|])", r"\\\1", part) for part in parts
    )


class _GeneratedDirective(SphinxDirective):
    """A directive that writes MyST Markdown and parses it in place."""

    has_content = False
    required_arguments = 0
    optional_arguments = 0

    def markdown(self) -> str:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        return self.parse_text_to_nodes(self.markdown(), allow_section_headings=True)

    def depends_on(self, module: Any) -> None:
        self.env.note_dependency(str(Path(module.__file__).resolve()))

    def depends_on_package(self) -> None:
        """Re-read the page when any module changes (it reports which modules use what)."""
        import django_jobguard

        for path in Path(django_jobguard.__file__).parent.rglob("*.py"):
            self.env.note_dependency(str(path.resolve()))


# -- settings ----------------------------------------------------------------------------------


class SettingsDirective(_GeneratedDirective):
    """Every ``JOBGUARD`` key: default and meaning, from ``conf.DEFAULTS`` and its comments."""

    def markdown(self) -> str:
        from django_jobguard import conf

        self.depends_on_package()
        settings = collect_settings()
        documented = {s.path for s in settings}
        for path in sorted(runtime_paths(conf.DEFAULTS) - documented):
            logger.warning("conf.DEFAULTS has %s, which the settings reference could not read", path)
        out: list[str] = []
        group: tuple[str, ...] | None = None
        for setting in settings:
            if setting.path[:-1] != group:
                group = setting.path[:-1]
                title = f'`JOBGUARD["{group[0]}"]`' if group else "Top-level keys"
                out.append(f"### {title}\n")
            if not setting.comment:
                logger.warning(
                    "django_jobguard/conf/defaults.py: setting %s has no comment above it; the settings "
                    "reference is generated from those comments",
                    setting.name,
                    location=(self.env.docname, self.lineno),
                )
            default = _literal(setting.default, as_repr=True)
            if any(op in setting.expression for op in "*+-/") and setting.expression != repr(setting.default):
                default += f" (`{setting.expression}`)"
            key = "".join(f'["{part}"]' for part in setting.path)
            body = [_escape(setting.comment), "", f"Set as `JOBGUARD{key}`."]
            if not read_elsewhere(setting.path[-1].lower()):
                body += ["", "*Reserved: no code of this version reads this setting yet.*"]
            out += [
                f"```{{confval}} {setting.name}",
                f":default: {default}",
                "",
                *body,
                "```",
                "",
            ]
        return "\n".join(out)


class QueueOptionsDirective(_GeneratedDirective):
    """The keys of a ``JOBGUARD["QUEUES"][name]`` entry, from ``conf.QueueConfig``."""

    def markdown(self) -> str:
        from django_jobguard import conf
        from django_jobguard.task import Task

        self.depends_on(conf.queue_settings)
        self.depends_on(conf.defaults)
        options = [f.name for f in dataclasses.fields(conf.QueueConfig) if f.name != "name"]
        if set(options) != set(conf.QUEUE_OPTIONS):
            logger.warning(
                "conf.QueueConfig fields %s differ from conf.QUEUE_OPTIONS %s",
                sorted(options),
                sorted(conf.QUEUE_OPTIONS),
            )
        task_options = {f.name for f in dataclasses.fields(Task)}
        out: list[str] = []
        for option in options:
            fallback = option.upper()
            if option in conf.QUEUE_ONLY_OPTIONS:
                out += [
                    f"```{{confval}} QUEUES.<queue>.{option}",
                    ":default: none",
                    "",
                    conf.QUEUE_ONLY_OPTIONS[option],
                    "```",
                    "",
                ]
                continue
            if fallback not in conf.DEFAULTS:
                logger.warning("queue option %s has no global setting %s", option, fallback)
            wins = (
                f" A task's own `{option}` option wins over it."
                if option in task_options
                else " No task option overrides it."
            )
            extra = ""
            target = f"{{confval}}`{fallback}`"
            if isinstance(conf.DEFAULTS[fallback], dict):
                keys = ", ".join(f"`{key}`" for key in conf.QUEUE_OPTION_KEYS[option])
                if all(key.isupper() for key in conf.DEFAULTS[fallback]):  # a group: one entry per key
                    target = ", ".join(
                        f"{{confval}}`{fallback}.{key.upper()}`" for key in conf.QUEUE_OPTION_KEYS[option]
                    )
                extra = f" Keys you leave out ({keys}) come from {target}."
            out += [
                f"```{{confval}} QUEUES.<queue>.{option}",
                f":default: the global `{fallback}`",
                "",
                f"Overrides {target} for jobs of this queue.{wins}{extra}",
                "```",
                "",
            ]
        return "\n".join(out)


# -- management commands ---------------------------------------------------------------------


class CommandsDirective(_GeneratedDirective):
    """Every ``jobguard_*`` command: its help, its own options, and its full ``--help``."""

    def markdown(self) -> str:
        from django.core.management import load_command_class
        from django.core.management.base import BaseCommand

        common = {a.dest for a in BaseCommand().create_parser("manage.py", "base")._actions}
        previous = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = str(HELP_COLUMNS)
        try:
            out: list[str] = []
            for name in command_names():
                command = load_command_class("django_jobguard", name)
                self.depends_on(importlib.import_module(type(command).__module__))
                parser = command.create_parser("manage.py", name)
                formatter = parser._get_formatter()
                out += [f"## `{name}`", "", str(command.help), "", f"```{{program}} {name}", "```", ""]
                for action in parser._actions:
                    if action.dest in common or not action.option_strings:
                        continue
                    signature = ", ".join(
                        f"{flag} {action.metavar or action.dest.upper()}" if action.nargs != 0 else flag
                        for flag in sorted(action.option_strings, key=lambda f: (not f.startswith("--"), f))
                    )
                    help_text = formatter._expand_help(action) if action.help else ""
                    out += [f"```{{option}} {signature}", help_text, "```", ""]
                out += [
                    f"Full `manage.py {name} --help`:",
                    "",
                    "```text",
                    parser.format_help().rstrip(),
                    "```",
                    "",
                ]
            return "\n".join(out)
        finally:
            if previous is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = previous


# -- system checks -----------------------------------------------------------------------------


class ChecksDirective(_GeneratedDirective):
    """Every check ID in the ``checks`` package: level, message template and hint."""

    def markdown(self) -> str:
        for module in check_modules():
            self.depends_on(module)
        out: list[str] = []
        seen: set[str] = set()
        for check in collect_checks():
            if check.id in seen:
                logger.warning("checks: check ID %s is used twice", check.id)
            seen.add(check.id)
            anchor = check.id.replace(".", "-").lower()
            message = (
                _literal(check.message)
                if check.message is not None
                else f"computed when the check runs (`{check.message_code}`)"
            )
            out += [
                f"({anchor})=",
                f"## `{check.id}` ({check.level})",
                "",
                f"Message: {message}",
                "",
                f"Hint: {_literal(check.hint) if check.hint else '(none)'}",
                "",
            ]
            if not check.hint:
                logger.warning("checks: %s has no hint; STYLE.md wants one on every check", check.id)
        return "\n".join(out)


# -- signals -----------------------------------------------------------------------------------


class SignalsDirective(_GeneratedDirective):
    """Every signal of ``django_jobguard.signals``, with its arguments and senders."""

    def markdown(self) -> str:
        self.depends_on_package()
        out: list[str] = []
        for signal in collect_signals():
            if not signal.comment:
                logger.warning("signals.py: %s has no #: comment naming its arguments", signal.name)
            sent = (
                "Sent by " + ", ".join(f"`{m}`" for m in signal.senders) + "."
                if signal.senders
                else "*Defined, but no code of this version sends it yet.*"
            )
            out += [
                f"```{{py:data}} django_jobguard.signals.{signal.name}",
                _escape(signal.comment),
                "",
                sent,
                "```",
                "",
            ]
        return "\n".join(out)


# -- the Celery compatibility module -----------------------------------------------------------


class CeleryOptionsDirective(_GeneratedDirective):
    """The tables of ``contrib.celery``: options not honoured, options without effect, settings."""

    def markdown(self) -> str:
        from django_jobguard.contrib.celery import checks, options

        self.depends_on(options)
        self.depends_on(checks)
        out = [
            "### Task options not honoured",
            "",
            "Each is named by `jobguard.celery.W001` for every task that sets it.",
            "",
            "| Option | Instead |",
            "| --- | --- |",
            f"| `acks_late=False` | {_escape(options.ACKS_EARLY)} |",
        ]
        out += [f"| `{name}` | {_escape(advice)} |" for name, advice in sorted(options.NOT_HONOURED.items())]
        out += ["", "### Task options without effect", "", "| Option | Why |", "| --- | --- |"]
        out += [f"| `{name}` | {_escape(why)} |" for name, why in sorted(options.NO_EFFECT.items())]
        out += [
            "",
            "### `CELERY_*` settings",
            "",
            "Read: " + ", ".join(f"`CELERY_{name}`" for name in sorted(checks.HONOURED_SETTINGS)) + ".",
            "",
            "Without effect (Celery's broker, result store or beat process): "
            + ", ".join(f"`CELERY_{name}`" for name in sorted(checks.NO_EFFECT_SETTINGS))
            + ".",
            "",
            "Any other `CELERY_*` setting is named by `jobguard.celery.W002` (a pickle serializer by "
            "`jobguard.celery.E001`); for these it says what to do instead:",
            "",
            "| Setting | Instead |",
            "| --- | --- |",
        ]
        out += [
            f"| `CELERY_{name}` | {_escape(advice)} |"
            for name, advice in sorted(checks.SETTING_ADVICE.items())
        ]
        return "\n".join(out)


# -- a docs tree that grows on other branches --------------------------------------------------


class _OptionalGlobFilter(logging.Filter):
    """Drops "toctree glob pattern ... didn't match any documents" for the configured patterns."""

    def __init__(self, app: Sphinx) -> None:
        super().__init__()
        self.app = app

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "subtype", None) != "empty_glob" or not record.args:
            return True
        pattern = record.args[0] if isinstance(record.args, tuple) else None
        return pattern not in set(self.app.config.jobguard_optional_globs)


class PendingPageLinks(SphinxPostTransform):
    """Turns links to pages not merged yet into plain text, before MyST warns about them."""

    default_priority = 8  # MyST resolves its references at 9

    def run(self, **kwargs: Any) -> None:
        pending = set(self.config.jobguard_pending_pages)
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("reftype") != "myst" or node.get("refdomain") == "doc":
                continue  # refdomain "doc": MyST found the page, so it is a link as usual
            target = node["reftarget"].split("#", 1)[0]
            if not target.endswith(".md"):
                continue
            refdoc = node.get("refdoc", self.env.docname)
            docname = posixpath.normpath(posixpath.join(posixpath.dirname(refdoc), target[: -len(".md")]))
            if docname in pending and docname not in self.env.all_docs:
                node.replace_self(nodes.inline("", "", *node[0].deepcopy().children))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("jobguard_optional_globs", [], "env", types=[list])
    app.add_config_value("jobguard_pending_pages", [], "env", types=[list])
    app.add_directive("jobguard-settings", SettingsDirective)
    app.add_directive("jobguard-queue-options", QueueOptionsDirective)
    app.add_directive("jobguard-commands", CommandsDirective)
    app.add_directive("jobguard-checks", ChecksDirective)
    app.add_directive("jobguard-signals", SignalsDirective)
    app.add_directive("jobguard-celery-options", CeleryOptionsDirective)
    app.add_post_transform(PendingPageLinks)
    # Sphinx logs through "sphinx.<module>"; a logger filter runs before the warning counter.
    toctree_logger = logging.getLogger("sphinx.sphinx.directives.other")
    for old in [f for f in toctree_logger.filters if isinstance(f, _OptionalGlobFilter)]:
        toctree_logger.removeFilter(old)  # a previous build in this process
    toctree_logger.addFilter(_OptionalGlobFilter(app))
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
