"""User docs read as a book, not a lab notebook: current figures, no tracker references."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The longest the performance page may grow: method, reproduction, one table, costs, where the
# time goes. Past runs go to benchmarks/HISTORY.md.
PERFORMANCE_MAX_LINES = 250


def user_pages() -> list[Path]:
    return [page for page in sorted(DOCS.rglob("*.md")) if "_build" not in page.parts]


def test_the_performance_page_stays_short() -> None:
    lines = (DOCS / "explanation" / "performance.md").read_text().splitlines()
    assert len(lines) <= PERFORMANCE_MAX_LINES, (
        f"performance.md has {len(lines)} lines (at most {PERFORMANCE_MAX_LINES}); "
        "move past runs to benchmarks/HISTORY.md"
    )


def test_user_docs_name_no_tracker_issues() -> None:
    pattern = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in user_pages()
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "user docs name tracker issues:\n" + "\n".join(found)
