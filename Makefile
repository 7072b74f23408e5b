# Two commands matter: `make demo` and `make test`. Both bootstrap what they need on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NODE_STAMP := node_modules/.installed

.PHONY: demo test test-quick lint bench fault wheelhouse clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

bootstrap: $(STAMP) $(NODE_STAMP)

demo: bootstrap
	$(PY) -m sandbox.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: bootstrap lint
	$(PY) -m pytest -m "not slow" -p no:cacheprovider

test-quick: bootstrap
	$(PY) -m pytest -m "not slow" -x -q -p no:cacheprovider

bench: bootstrap
	$(PY) -m bench

fault: bootstrap
	$(PY) -m pytest -m slow -p no:cacheprovider

clean:
	rm -rf $(VENV) node_modules .demo .state build dist wheelhouse *.egg-info
