# The two commands of the README, plus the checks CI runs.
#   make example   install into .venv and run the example project on SQLite (no servers)
#   make test      install into .venv and run the test suite (SQLite unless
#                  JOBGUARD_TEST_DATABASE_URL / JOBGUARD_TEST_REDIS_URL point at servers)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=

.PHONY: example test lint docs bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=25.1"

example: $(PY)
	$(PIP) install -e ".[all]" python-json-logger
	cd example_project && ../$(PY) manage.py migrate --verbosity 0
	cd example_project && ../$(PY) manage.py shop_demo

test: $(PY)
	$(PIP) install -e ".[all]" --group test
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(PY)
	$(PIP) install -e ".[all]" --group lint
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

docs: $(PY)
	$(PIP) install -e ".[all]" --group docs
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

bench: $(PY)
	$(PIP) install -e ".[all]" --group test
	$(PY) benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .mypy_cache .ruff_cache docs/_build tests/.db example_project/db.sqlite3*
