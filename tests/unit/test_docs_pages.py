"""The hand-written reference pages name everything the code has, and the generated ones can be
generated: every setting has its comment, every check its hint, every signal its arguments.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest
from django.db import models

from django_jobguard import models as jobguard_models
from django_jobguard.conf import DEFAULTS
from django_jobguard.task import Task, task

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import jobguard_reference  # noqa: E402 - lives in docs/_ext, added to the path just above


def table_rows(page: str) -> dict[str, list[str]]:
    """First cell → cells, for every Markdown table row whose first cell is inline code."""
    rows = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("|") else None
        if match:
            rows[match.group(1)] = cells[1:]
    return rows


def keyword_defaults(function: object) -> dict[str, object]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()  # type: ignore[arg-type]
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


@pytest.mark.parametrize(
    ("function", "heading"),
    [(task, "## `@task` options"), (Task.using, "## `Task.using()` options")],
    ids=["task", "using"],
)
def test_task_options_page_lists_every_option_with_its_default(function: object, heading: str) -> None:
    page = (REFERENCE / "task-options.md").read_text()
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = table_rows(section)
    options = keyword_defaults(function)
    assert sorted(rows) == sorted(options), "task-options.md and the signature list different options"
    for name, default in options.items():
        assert rows[name][0] == f"`{default!r}`", (
            f"{name}: the page says {rows[name][0]}, the code {default!r}"
        )


def test_every_task_option_has_its_own_section() -> None:
    page = (REFERENCE / "task-options.md").read_text()
    headings = " ".join(re.findall(r"^### (.+)$", page, flags=re.MULTILINE))
    missing = [name for name in keyword_defaults(task) if f"`{name}`" not in headings]
    assert not missing, f"task-options.md has no section for {missing}"


@pytest.mark.parametrize(
    "choices",
    [
        jobguard_models.JobStatus,
        jobguard_models.DeadLetterReason,
        jobguard_models.ReplayState,
        jobguard_models.ErrorCategory,
        jobguard_models.IdempotencyStatus,
        jobguard_models.ReplayAction,
    ],
    ids=lambda choices: choices.__name__,
)
def test_models_page_names_every_status_and_reason(choices: type[models.TextChoices]) -> None:
    page = (REFERENCE / "models.md").read_text()
    missing = [value for value in choices.values if f"`{value}`" not in page]
    assert not missing, f"models.md does not name {choices.__name__} values {missing}"


def field_table(section: str) -> set[str]:
    """The names in the first column of the section's ``| Field | Meaning |`` table."""
    lines = section.splitlines()
    start = lines.index("| Field | Meaning |")
    names: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize(
    "model",
    [jobguard_models.Job, jobguard_models.DeadLetter, jobguard_models.IdempotencyKey],
    ids=lambda m: m.__name__,
)
def test_models_page_describes_every_field(model: type[models.Model]) -> None:
    page = (REFERENCE / "models.md").read_text()
    section = page.split(f"## `{model.__name__}`", 1)[1].split("\n## ", 1)[0]
    documented = field_table(section) - {"id"}
    fields = {field.name for field in model._meta.concrete_fields} - {"id"}
    assert not fields - documented, (
        f"models.md has no row for {model.__name__} fields {sorted(fields - documented)}"
    )
    assert not documented - fields, (
        f"models.md describes fields {model.__name__} lacks: {sorted(documented - fields)}"
    )


def test_models_page_names_every_check_constraint() -> None:
    page = (REFERENCE / "models.md").read_text()
    names = [
        constraint.name
        for model in (jobguard_models.Job, jobguard_models.IdempotencyKey, jobguard_models.DeadLetter)
        for constraint in model._meta.constraints
    ]
    missing = [name for name in names if f"`{name}`" not in page]
    assert not missing, f"models.md does not name the constraints {missing}"


def test_every_setting_has_a_comment_for_the_generated_reference() -> None:
    settings = jobguard_reference.collect_settings()
    assert {s.path for s in settings} == jobguard_reference.runtime_paths(DEFAULTS)
    missing = [s.name for s in settings if not s.comment]
    assert not missing, f"conf/defaults.py: no comment above {missing}"
    comments = {s.name: s.comment for s in settings}
    assert comments["VISIBILITY_TIMEOUT"].startswith("Seconds a claimed job stays invisible")
    assert comments["LOCKS.TTL"].startswith("Seconds a task lock lives")


def test_every_system_check_has_a_hint_for_the_generated_reference() -> None:
    checks = jobguard_reference.collect_checks()
    assert {"jobguard.E001", "jobguard.E002", "jobguard.E003", "jobguard.W001"} <= {c.id for c in checks}
    assert len({c.id for c in checks}) == len(checks), "a check ID is used twice"
    assert all(c.hint for c in checks), [c.id for c in checks if not c.hint]
    e002 = next(c for c in checks if c.id == "jobguard.E002")
    assert e002.message == "JOBGUARD['DATABASE_ALIAS'] is {alias!r}, which is not in DATABASES."


def test_every_signal_names_its_arguments_and_senders_are_found() -> None:
    signals = {s.name: s for s in jobguard_reference.collect_signals()}
    assert all(s.comment for s in signals.values()), [n for n, s in signals.items() if not s.comment]
    assert "django_jobguard.enqueue" in signals["job_enqueued"].senders
    assert "django_jobguard.dlq" in signals["job_dead_lettered"].senders
    assert "django_jobguard.dlq" in signals["replay_approved"].senders
    # The replay_* signals share the one comment written above the group.
    assert signals["replay_rejected"].comment == signals["replay_requested"].comment


def test_every_management_command_is_found_for_the_generated_reference() -> None:
    commands_dir = ROOT / "django_jobguard" / "management" / "commands"
    on_disk = sorted(p.stem for p in commands_dir.glob("*.py") if not p.stem.startswith("_"))
    assert jobguard_reference.command_names() == on_disk
    assert "jobguard_worker" in on_disk


def test_every_logger_the_package_uses_is_on_the_loggers_page():
    import importlib
    import logging
    import pkgutil
    import re

    import django_jobguard

    names = set()
    for info in pkgutil.walk_packages(django_jobguard.__path__, "django_jobguard."):
        if ".migrations" in info.name or info.name.endswith("._faults"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (the Tasks framework) is missing
            continue
        logger = getattr(module, "logger", None)
        if isinstance(logger, logging.Logger):
            names.add(logger.name)
    page = (REFERENCE / "loggers.md").read_text()
    listed = set(re.findall(r"^\| `([a-z_.]+)` \|", page, re.M))
    assert names, "no logger found: the scan is broken"
    assert names <= listed, sorted(names - listed)
    # One logger per area, whatever module in the area writes: django_jobguard.<area>.
    assert all(re.fullmatch(r"django_jobguard\.[a-z_]+", name) for name in names), sorted(names)
