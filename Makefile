# popmq developer commands. `make run` starts the service, `make test` runs every test.
# Both install what they need from nothing: a venv in .venv for popmq, and a separate venv in
# .venv-client for the official rocketmq-python-client (its generated protos clash with ours
# inside one Python process, so the tests run it in subprocesses).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLIENT_VENV := .venv-client
PYTEST_ARGS ?=

.PHONY: run test install client-venv lint protos clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $@

install: $(VENV)/.installed

$(CLIENT_VENV)/.installed:
	$(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/python -m pip install -q --upgrade pip
	$(CLIENT_VENV)/bin/python -m pip install -q 'rocketmq-python-client==5.1.2'
	touch $@

client-venv: $(CLIENT_VENV)/.installed

run: install
	$(VENV)/bin/popmq serve --host 127.0.0.1 --port 8081 --brokers 3 --data-dir ./data

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: install client-venv lint
	$(PY) -m pytest $(PYTEST_ARGS)

protos: install
	$(PY) scripts/gen_protos.py

clean:
	rm -rf $(VENV) $(CLIENT_VENV) .pytest_cache .ruff_cache
