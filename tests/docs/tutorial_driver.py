"""Follow docs/tutorial/index.md step by step in an empty directory, as a reader would.

Run by tests/docs/test_tutorial.py as ``python tutorial_driver.py PAGE WORKDIR``; exits non-zero
at the first step whose outcome differs from the page. Blocks are taken in page order:

- a ``{code-block}`` with ``:caption: PATH`` is written to PATH. In a settings module, each
  top-level assignment of the block replaces the assignment of that name, or is appended;
- in a ``console`` block each ``$ command`` is run (the ones in SKIPPED are done otherwise),
  and every log line the page shows (``INFO ...``, ``ERROR ...``) must be in its output, worker
  ids and durations aside;
- a ``pycon`` block runs as a doctest in this process, whose names persist from block to
  block like the reader's open shell.

Last, no jobguard system check may warn (SQLite settings, unclassified tasks), and every admin
page the tutorial links to must render for a superuser, the dead letter's page with its error
and traceback.
"""

from __future__ import annotations

import ast
import doctest
import os
import re
import subprocess
import sys
from pathlib import Path

#: Commands the driver does not run, and why.
SKIPPED = {
    "mkdir jobguard-tutorial": "the driver works in its own empty directory",
    "cd jobguard-tutorial": "the driver works in its own empty directory",
    "python -m venv .venv": "the test's interpreter already has the project installed",
    "source .venv/bin/activate": "the test's interpreter already has the project installed",
    "python -m pip install /path/to/django-jobguard": "the test's interpreter has the project installed",
    "python manage.py shell": "pycon blocks run in the driver's own process",
    "python manage.py createsuperuser": "interactive; the driver creates a superuser itself",
    "python manage.py runserver": "the driver requests the admin pages with Django's test client",
}
LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
FENCE = re.compile(r"^(`{3,})(.*)$")


def fail(message: str) -> None:
    print(f"TUTORIAL MISMATCH: {message}", flush=True)
    raise SystemExit(1)


def blocks(page: str) -> list[tuple[int, str, dict[str, str], str]]:
    """(line, language, options, content) of every fenced block of ``page``."""
    found = []
    lines = page.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        fence, info = opening.groups()
        start = index + 1
        index += 1
        body = []
        while index < len(lines) and lines[index] != fence:
            body.append(lines[index])
            index += 1
        index += 1
        options: dict[str, str] = {}
        language = info.strip()
        if language.startswith("{code-block}"):
            language = language.removeprefix("{code-block}").strip()
            while body and body[0].startswith(":"):
                name, _, value = body.pop(0)[1:].partition(":")
                options[name.strip()] = value.strip()
            while body and not body[0].strip():
                body.pop(0)
        found.append((start, language, options, "\n".join(body) + "\n"))
    return found


def write_file(workdir: Path, path: str, content: str) -> None:
    target = workdir / path
    if not (target.name == "settings.py" and target.exists()):
        target.write_text(content)
        return
    # Settings: replace each assignment the block makes, append the rest.
    source = target.read_text()
    for node in ast.parse(content).body:
        snippet = ast.get_source_segment(content, node) or ""
        name = node.targets[0].id if isinstance(node, ast.Assign) else None  # type: ignore[attr-defined]
        existing = [
            old
            for old in ast.parse(source).body
            if isinstance(old, ast.Assign) and getattr(old.targets[0], "id", None) == name
        ]
        if name and existing:
            old_lines = source.splitlines(keepends=True)
            first, last = existing[0].lineno - 1, existing[0].end_lineno or existing[0].lineno
            source = "".join([*old_lines[:first], snippet + "\n", *old_lines[last:]])
        else:
            source = source.rstrip("\n") + "\n\n" + snippet + "\n"
    target.write_text(source)


def normalize(line: str) -> str:
    line = re.sub(r"worker_id=\S+", "worker_id=<id>", line)
    return re.sub(r"duration=[0-9.]+", "duration=<s>", line.rstrip())


def run_console(workdir: Path, lineno: int, content: str) -> None:
    commands: list[tuple[str, list[str]]] = []
    for line in content.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:].strip(), []))
        elif commands:
            commands[-1][1].append(line)
    for command, shown in commands:
        if command in SKIPPED:
            continue
        words = command.split()
        if words[:2] == ["python", "manage.py"]:
            argv = [sys.executable, "manage.py", *words[2:]]
        elif words[0] == "django-admin":
            argv = [sys.executable, "-m", "django", *words[1:]]
        else:
            fail(f"line {lineno}: the driver does not know how to run {command!r}")
        print(f"$ {command}", flush=True)
        result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=300, check=False)
        output = result.stdout + result.stderr
        print(output, flush=True)
        if result.returncode != 0:
            fail(f"line {lineno}: {command!r} exited with {result.returncode}")
        actual = {normalize(line) for line in output.splitlines()}
        for expected in shown:
            if LOG_LINE.match(expected) and normalize(expected) not in actual:
                fail(f"line {lineno}: {command!r} did not print {expected!r}")


def run_pycon(globs: dict[str, object], page: Path, lineno: int, content: str) -> None:
    if "django" not in sys.modules:
        import django

        django.setup()
    test = doctest.DocTestParser().get_doctest(content, globs, f"{page.name}:{lineno}", str(page), lineno)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, clear_globs=False)
    globs.update(test.globs)  # DocTest works on a copy; keep its names for the next block
    if runner.failures:
        fail(f"line {lineno}: the shell session gave other results (see above)")


def check_project(workdir: Path, page: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--database", "default"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    # The tutorial's project follows the docs, so no jobguard check has anything to say.
    if result.returncode != 0 or "(jobguard." in result.stdout + result.stderr:
        fail(f"manage.py check is not clean:\n{result.stdout}{result.stderr}")

    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_jobguard.models import DeadLetter

    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", "not-a-secret")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(admin)
    for path in sorted(set(re.findall(r"http://127\.0\.0\.1:8000(/[^\s>)]*)", page))):
        response = client.get(path)
        if response.status_code != 200:
            fail(f"the admin page {path} answered {response.status_code}")
        print(f"GET {path}: 200", flush=True)
    letters = list(DeadLetter.objects.all())
    if not letters:
        fail("the tutorial left no dead letter")
    for letter in letters:
        text = client.get(f"/admin/jobguard/deadletter/{letter.pk}/change/").content.decode()
        for part in (letter.error_message, "Traceback (most recent call last)", letter.task_name):
            if part not in text:
                fail(f"the dead letter's admin page does not show {part!r}")


def main() -> None:
    page_path, workdir = Path(sys.argv[1]), Path(sys.argv[2])
    page = page_path.read_text()
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    os.environ["DJANGO_SETTINGS_MODULE"] = "mysite.settings"
    globs: dict[str, object] = {}
    for lineno, language, options, content in blocks(page):
        if "caption" in options:
            write_file(workdir, options["caption"], content)
        elif language == "console":
            run_console(workdir, lineno, content)
        elif language == "pycon":
            run_pycon(globs, page_path, lineno, content)
    check_project(workdir, page)
    print("TUTORIAL OK", flush=True)


if __name__ == "__main__":
    main()
