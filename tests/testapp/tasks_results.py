"""Tasks for the tests of results handed on: callbacks that take their members' results, and
steps that take the previous result positionally.

Imported by the tests that use them (tests/integration/workflows/test_results.py), so they are
registered in that process only; the in-process worker finds them there.
"""

from __future__ import annotations

from django_jobguard import PermanentError, task


@task()
def square(n: int) -> int:
    """A member with a result that says which member it was."""
    return n * n


@task(max_attempts=1)
def fails(n: int) -> int:
    """A member dead-lettered at once."""
    raise PermanentError(f"member {n}: planned failure")


@task()
def collect(label: str, results: list | None = None, progress: dict | None = None) -> dict:
    """A callback that returns what it was given, so a test reads it from its result."""
    return {"label": label, "results": results, "progress": progress}


@task()
def collect_first(results: list, label: str = "") -> dict:
    """A callback that takes the results as its first positional argument."""
    return {"label": label, "results": results}
