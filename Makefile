# Two commands matter: `make demo` and `make test`. Both bootstrap what they need on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NODE_STAMP := node_modules/.installed

.PHONY: demo sandbox test test-any-date test-quick lint bench soak fault wheelhouse clean

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml ops/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt -c constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	# the operators' tools (se-policy): their own distribution, so the VMs' forwarder wheel stays as it is
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e ops
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	# the console's @azure/msal-browser into central/console/vendor/ (it ships with the Function app)
	$(PYTHON) -m tools.console_vendor
	touch $@

bootstrap: $(STAMP) $(NODE_STAMP)

# `make demo DEMO_ARGS=--capture` also keeps Capture Avro files in .demo/capture and analyses them.
DEMO_ARGS ?=

demo: bootstrap
	$(PY) -m sandbox.demo $(DEMO_ARGS)

# The practice fleet for operators on call: real time, events stay pending, up until Ctrl-C (docs/demo.md).
sandbox: bootstrap
	$(PY) -m sandbox.demo --serve --work .sandbox

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Most tests wait on real servers and processes, not the CPU: 3 workers (one file each at a time,
# so a file's servers and fixtures stay together) cut the wall time by more than half on 2 cores.
TEST_WORKERS ?= 3

test: bootstrap lint
	$(PY) -m pytest -m "not slow" -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

test-quick: bootstrap
	$(PY) -m pytest -m "not slow" -x -q -p no:cacheprovider

# The suite on any date: the in-process suites with the clock 400 days ahead and 30 days behind
# (Debian's faketime; tools/any_date.py says which suites). .ci/run runs it after `make test`.
test-any-date: bootstrap
	$(PY) -m tools.any_date

bench: bootstrap
	$(PY) -m bench

# The soaks (issue 50): the forwarder for 30 simulated days (~40 min), then central for 2 real hours; their
# samples, plots and summaries land in bench/results/. Shorter: make soak SOAK_DAYS=3 SOAK_HOURS=0.1
SOAK_DAYS ?= 30
SOAK_HOURS ?= 2
soak: bootstrap
	$(PY) -m bench.forwarder_soak --days $(SOAK_DAYS); forwarder=$$?; \
	$(PY) -m bench.central_soak --hours $(SOAK_HOURS) && exit $$forwarder

fault: bootstrap
	$(PY) -m pytest -m slow -p no:cacheprovider

clean:
	rm -rf $(VENV) node_modules .demo .sandbox .state .any-date build dist wheelhouse *.egg-info

# ---- infra (issue 6) ----
# checkov runs in its own venv: it pins its own dependency versions (pycep-parser, ...).
CHECKOV_VENV    := .venv-checkov
CHECKOV_VERSION := 3.3.30
CHECKOV_STAMP   := $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)

.PHONY: checkov-venv infra-check policy-reference

$(CHECKOV_STAMP): tools/checkov-requirements.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r tools/checkov-requirements.txt
	touch $@

checkov-venv: $(CHECKOV_STAMP)

# `make test` builds the checkov venv first, so tests/infra runs checkov (under make a missing venv fails).
test: $(CHECKOV_STAMP)
test-quick: $(CHECKOV_STAMP)

infra-check: $(STAMP) $(CHECKOV_STAMP)
	$(PY) -m pytest tests/infra -q -p no:cacheprovider

# The policy types and alias tables infra/coverage/ is checked against, outside the repository (docs/deploy.md,
# "Offline checks"): from git directories of Azure/bicep-types-az and maciejporebski/azure-policy-aliases.
policy-reference: $(STAMP)
	$(PY) -m tools.policy_reference fill --types-git "$(TYPES_GIT)" --aliases-git "$(ALIASES_GIT)"

# Offline install bundles of the forwarder for the VMs (docs/deploy.md); needs PyPI here, not on the VMs.
wheelhouse: $(STAMP)
	$(PY) -m tools.wheelhouse --out wheelhouse
