# The two commands of the README, plus the checks CI runs.
#   make example   install into .venv and run the example shop's demo on SQLite (no servers;
#                  DATABASE_URL=postgres://... and REDIS_URL=redis://... switch to servers)
#   make console   then: the admin console with the demo's users, and a worker beside it
#                  (on http://127.0.0.1:8000/admin/; PORT=8001 or ADDR=0.0.0.0 to change)
#   make test      install into .venv and run the test suite (SQLite unless
#                  JOBGUARD_TEST_DATABASE_URL / JOBGUARD_TEST_REDIS_URL point at servers)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=
# Where make console's runserver listens.
ADDR ?= 127.0.0.1
PORT ?= 8000

.PHONY: example console test test-stress lint docs bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=25.1"

example: $(PY)
	$(PIP) install -e ".[all]" python-json-logger rich
	cd example_project && ../$(PY) manage.py migrate --verbosity 0
	cd example_project && ../$(PY) manage.py shop_demo

# runserver in the foreground; a worker beside it redrives the replay you approve. Ctrl-C
# stops both (the worker finishes its jobs first).
console: $(PY)
	cd example_project && ../$(PY) manage.py migrate --verbosity 0
	cd example_project && { ../$(PY) manage.py jobguard_worker --worker-id console-worker & \
		trap 'kill -TERM $$! 2>/dev/null; wait' EXIT INT TERM; \
		../$(PY) manage.py runserver $(ADDR):$(PORT); }

test: $(PY)
	$(PIP) install -e ".[all]" --group test
	$(PY) -m pytest $(PYTEST_ARGS)

# The process, reliability and browser tiers 5 times in a row while busy processes hog every
# core; prints failures per test (STRESS_ARGS="--runs 1 --tiers processes" narrows it).
test-stress: $(PY)
	$(PIP) install -e ".[all]" --group test --group browser
	$(PY) tests/stress.py $(STRESS_ARGS)

lint: $(PY)
	$(PIP) install -e ".[all]" --group lint
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

docs: $(PY)
	$(PIP) install -e ".[all]" --group docs
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

bench: $(PY)
	$(PIP) install -e ".[all]" --group test
	$(PY) benchmarks/bench_peers.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-* .pytest_cache .mypy_cache .ruff_cache docs/_build tests/.db example_project/db.sqlite3* example_project/.cache
