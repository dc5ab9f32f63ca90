"""The documentation builds with zero warnings, today and as other branches add pages.

Each test builds a copy of docs/ with ``sphinx -W`` in a subprocess (as ``make docs`` does).
They need the ``docs`` dependency group and skip without it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import posixpath
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(importlib.util.find_spec(name) for name in ("sphinx", "myst_parser", "furo")),
        reason="needs the docs dependency group: pip install --group docs",
    ),
]


def conf_list(name: str) -> list[str]:
    """A list setting of docs/conf.py, read without running it."""
    for node in ast.parse((DOCS / "conf.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"docs/conf.py has no {name}")


def copy_docs(tmp_path: Path) -> Path:
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("_build"))
    shutil.copy(ROOT / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    return tmp_path / "docs"


def build(docs: Path, out: Path, *, first_on_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``sphinx -W`` on ``docs``; ``first_on_path`` goes ahead of this checkout on the Python path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
    # A copy's conf.py finds django_jobguard and tests.settings in this checkout.
    path = [str(first_on_path)] if first_on_path else []
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*path, str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(docs), str(out)],
        cwd=out.parent,  # not this checkout: the working directory comes first on sys.path
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_docs_build_without_warnings(tmp_path: Path) -> None:
    result = build(DOCS, tmp_path / "html")
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr


def write_links_page(docs: Path, docnames: list[str]) -> None:
    """A how-to page (listed by the how-to glob) linking to each of ``docnames``."""
    links = "\n".join(f"- [link to {name}](../{name}.md)" for name in docnames)
    (docs / "how-to" / "zz-links.md").write_text(f"# Links\n\n{links}\n")


def test_sections_and_links_waiting_for_other_branches_do_not_warn(tmp_path: Path) -> None:
    docs = copy_docs(tmp_path)
    # As before those branches are merged: their pages and the optional sections' pages gone.
    missing = conf_list("jobguard_pending_pages")
    for pattern in conf_list("jobguard_optional_globs"):
        missing += [str(page.relative_to(docs).with_suffix("")) for page in docs.glob(f"{pattern}.md")]
    for docname in missing:
        (docs / f"{docname}.md").unlink(missing_ok=True)
    with (docs / "conf.py").open("a") as conf:
        conf.write(f"\njobguard_pending_pages = {sorted(set(missing))!r}\n")
    write_links_page(docs, missing)

    result = build(docs, tmp_path / "html")

    assert result.returncode == 0, result.stderr
    page = (tmp_path / "html" / "how-to" / "zz-links.html").read_text()
    for docname in missing:
        assert f"link to {docname}" in page
        assert f"{docname}.html" not in page  # plain text until the page exists


def test_a_page_added_to_a_section_is_listed_and_linked_without_editing_any_page(tmp_path: Path) -> None:
    docs = copy_docs(tmp_path)
    added = ["runbooks/zz-new-runbook", "how-to/zz-new-guide", *conf_list("jobguard_pending_pages")]
    for docname in added:
        (docs / f"{docname}.md").write_text(f"# {docname}\n\nA page from another branch.\n")
    write_links_page(docs, added)

    result = build(docs, tmp_path / "html")

    assert result.returncode == 0, result.stderr
    index = (tmp_path / "html" / "index.html").read_text()
    assert 'href="runbooks/zz-new-runbook.html"' in index
    assert 'href="how-to/zz-new-guide.html"' in index
    page = (tmp_path / "html" / "how-to" / "zz-links.html").read_text()
    for docname in added:
        assert f'href="{posixpath.relpath(docname, "how-to")}.html"' in page


def test_a_mistyped_glob_or_link_still_fails_the_build(tmp_path: Path) -> None:
    docs = copy_docs(tmp_path)
    with (docs / "index.md").open("a") as index:
        index.write("\n```{toctree}\n:glob:\n\nrunbook/*\n```\n\nSee [the guide](how-to/no-such-page.md).\n")

    result = build(docs, tmp_path / "html")

    assert result.returncode != 0
    assert "toctree glob pattern 'runbook/*' didn't match any documents" in result.stderr
    assert "no-such-page.md" in result.stderr


def test_a_setting_without_a_comment_fails_the_build(tmp_path: Path) -> None:
    docs = copy_docs(tmp_path)
    # A copy of the package whose DEFAULTS gained a key without a comment, imported instead.
    shadow = tmp_path / "shadow"
    shutil.copytree(
        ROOT / "django_jobguard", shadow / "django_jobguard", ignore=shutil.ignore_patterns("__pycache__")
    )
    conf = shadow / "django_jobguard" / "conf" / "defaults.py"
    source = conf.read_text()
    anchor = '    "DEFAULT_QUEUE": "default",\n'
    assert anchor in source
    conf.write_text(source.replace(anchor, anchor + '    "NEW_KEY": 1,\n'))

    result = build(docs, tmp_path / "html", first_on_path=shadow)

    assert result.returncode != 0
    assert "setting NEW_KEY has no comment above it" in result.stderr
