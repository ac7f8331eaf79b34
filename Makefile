# popmq developer commands. `make run` starts the service, `make test` runs every test.
# Both install what they need from nothing: a venv in .venv for popmq, and a separate venv in
# .venv-client for the official rocketmq-python-client (the session-driven tests run it in
# subprocesses; .venv has it too, for the one-process coexistence test). Where node and npm exist, the
# official Node.js client goes into .node-client (`make node-client`) for its tests too.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLIENT_VENV := .venv-client
NODE_CLIENT := .node-client
NODE_CLIENT_PACKAGE := rocketmq-client-nodejs@1.0.8
# `make test` installs the Node.js client only where node and npm exist (its tests skip otherwise).
HAVE_NODE := $(and $(shell command -v node 2>/dev/null),$(shell command -v npm 2>/dev/null))
PYTEST_ARGS ?=
# Tests run in this many pytest-xdist workers, a test file per worker at a time (module-scoped
# processes stay on one worker). Most tests wait on other processes, so 2 workers fit 2 cores;
# `make test TEST_WORKERS=0` runs them in this process, one after another.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile
# Bytecode caches on for the suite: where the environment turns them off
# (PYTHONDONTWRITEBYTECODE, as some sandboxes do), every worker would compile popmq and rewrite
# and compile ~330 test modules again on every run (about 9 s of CPU per worker).
check check-tests test lint: export PYTHONDONTWRITEBYTECODE =

.PHONY: run test check check-tests install client-venv node-client chromium etcd lint lint-ruff lint-format \
	lint-imports lint-types protos clean FORCE

# `make run` needs popmq and its console; `make install` (tests, lint) adds the test and Spark
# extras.
$(VENV)/.runnable: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[console]'
	touch $@

$(VENV)/.installed: $(VENV)/.runnable
	$(PY) -m pip install -q -e '.[test,spark,console]'
	touch $@

install: $(VENV)/.installed

$(CLIENT_VENV)/.installed:
	$(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/python -m pip install -q --upgrade pip
	$(CLIENT_VENV)/bin/python -m pip install -q 'rocketmq-python-client==5.1.2'
	touch $@

client-venv: $(CLIENT_VENV)/.installed

$(NODE_CLIENT)/.installed:
	mkdir -p $(NODE_CLIENT)
	npm install --no-audit --no-fund --save-exact --prefix $(NODE_CLIENT) '$(NODE_CLIENT_PACKAGE)'
	touch $@

node-client: $(NODE_CLIENT)/.installed

# tests/console drive Debian's chromium through Playwright (never `playwright install`: no
# browser download). CI runs as root; elsewhere install it once with sudo.
chromium:
	@command -v chromium > /dev/null || (apt-get update -q && apt-get install -y -q chromium)

run: $(VENV)/.runnable
	$(VENV)/bin/popmq serve --host 127.0.0.1 --port 8081 --brokers 3 --data-dir ./data

# The layer check and mypy read the package as it installs (broker/ and proxy/ land inside
# popmq; mypy does not follow the editable install's folder mapping), so lint lays that tree out
# in build/layers first (scripts/layers_tree.py: hard links, setup.py's mapping). mypy's settings
# are in pyproject.toml ([tool.mypy]); its cache lives outside build/layers, so a second lint
# checks only what changed. The four checks are independent: `lint` runs them in parallel and
# fails when any fails (run one alone with `make lint-types`, say).
lint: install
	$(MAKE) --no-print-directory -j 4 lint-ruff lint-format lint-imports lint-types

lint-ruff:
	$(PY) -m ruff check .

lint-format:
	$(PY) -m ruff format --check .

build/layers: FORCE
	$(PY) scripts/layers_tree.py build/layers

lint-imports: build/layers
	cd build/layers && ../../$(VENV)/bin/lint-imports --config ../../pyproject.toml

lint-types: build/layers
	cd build/layers && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml --cache-dir ../../.mypy_cache -p popmq

FORCE:

# The HA tests start real etcd members (Debian 12's etcd-server, etcd 3.4); CI runs as root.
# Nothing to do where etcd is already on the PATH.
etcd:
	@command -v etcd > /dev/null || { apt-get update && apt-get install -y etcd-server; }

test: install client-venv chromium $(if $(HAVE_NODE),node-client) etcd lint
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The fast inner loop: lint, then every test that starts no other process and does not wait on
# real time. Tests that start popmq, a client, Spark's JVM or the CLI are marked `subprocess`
# (tests/conftest.py fails an unmarked test that starts one, so the selection stays honest); the
# few end-to-end timing tests are marked `wallclock` (a real 9 s broker outage, say). Both run in
# `make test`. Property tests try a quarter of their examples here (QUICK_PROPERTIES,
# tests/support/examples.py); `make test` tries them all.
#
# Speed: lint's four checks run beside the tests, not before them (their few lines may land
# between the tests' dots; make fails when any fails). The selected tests wait on real sockets
# and timers about half the time, so they run in 3 workers on 2 cores (`make check
# CHECK_WORKERS=2` for the old split); files with a test marked `slow` go first
# (tests/conftest.py; --no-loadscope-reorder keeps that order instead of xdist's largest-first),
# so that no long file starts last and runs alone.
CHECK_WORKERS ?= 3
check: install
	$(MAKE) --no-print-directory -j 5 lint-ruff lint-format lint-imports lint-types check-tests

check-tests:
	QUICK_PROPERTIES=1 $(PY) -m pytest -n $(CHECK_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not subprocess and not wallclock" -q $(PYTEST_ARGS)

protos: install
	$(PY) scripts/gen_protos.py

clean:
	rm -rf $(VENV) $(CLIENT_VENV) $(NODE_CLIENT) .pytest_cache .ruff_cache
