"""The full test matrix. CI (.ci/run) runs the subset that fits its time budget.

nox -s tests            every Python x Django x database combination
nox -s "tests-3.12(django='6.0', db='postgres')"
nox -s lint typecheck docs
"""

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

PG_URL = os.environ.get("JOBGUARD_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobguard_nox")
REDIS_URL = os.environ.get("JOBGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
DJANGO = {
    "5.2": ["Django>=5.2,<5.3"],
    "6.0": ["Django>=6.0,<6.1"],
    # django-prometheus 2.5.0 declares Django<6.1; 2.4.0 declares no upper bound.
    "6.1": ["Django>=6.1,<6.2", "django-prometheus==2.4.0"],
}


def _install(session: nox.Session, *groups: str) -> None:
    session.install("-e", ".[all]", *(arg for group in groups for arg in ("--group", group)))


@nox.session(python=["3.11", "3.12", "3.13"])
@nox.parametrize("db", ["sqlite", "postgres"])
@nox.parametrize("django", ["5.2", "6.0", "6.1"])
def tests(session: nox.Session, django: str, db: str) -> None:
    if django != "5.2" and session.python == "3.11":
        session.skip("Django 6 needs Python 3.12 or newer")
    _install(session, "test")
    session.install(*DJANGO[django])
    env = {}
    if db == "postgres":
        env = {"JOBGUARD_TEST_DATABASE_URL": PG_URL, "JOBGUARD_TEST_REDIS_URL": REDIS_URL}
    session.run("python", "-m", "pytest", *session.posargs, env=env)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    _install(session, "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    _install(session, "lint")
    session.run("mypy")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    _install(session, "docs")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")
