# Two entry points a fresh machine needs: `make demo` and `make test`.
# Each builds its virtualenv on first use (and again when pyproject.toml changes): .venv-demo holds
# only what the demo imports, .venv everything the tests and the tools need.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo demo-venv test check check-busy lint infra tfschema-venv unit venv compat39 bench bench-quick locks agent-locks agent-build-venv agent-artifact clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,functions-azure,functions-gcp,agent-otel]'
	touch $@

# The local end-to-end demo on the embedded defaults.
# The demo takes a virtualenv of its own with only what it imports (the demo extra): no cloud SDK,
# no test tools, so a first run is about half a minute.
DEMO_VENV ?= .venv-demo

$(DEMO_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install --quiet -e '.[demo]'
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/mbridge demo --report demo-report.html

# Only the demo's virtualenv: what the docs run from .venv-demo (the simulator, an agent on jsonl
# or the local bus, replay, audit) needs nothing more.
demo-venv: $(DEMO_VENV)/.installed

# Everything CI checks: lint, types, infra validation, and the whole test suite.
test: venv lint infra
	$(BIN)/python -m pytest

# The fast loop while working: lint and types, then the unit tests and the contract tests that need
# no emulator, on four workers, leaving out what is marked slow (each such test waits out real
# timings for seconds). `make test` runs everything, as CI does.
check: lint
	$(BIN)/python -m pytest -q -n 4 tests/unit tests/contract -m "not peer and not slow and not drill"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mypy --python-version 3.11 functions mbridge tests scripts bench function_app.py main.py agent/otel.py
	$(BIN)/lint-imports

# infra/ offline: terraform fmt -check, and checkov over the Terraform and the Bicep, failing on
# failed checks, skips without a reason and parsing errors (scripts/check_infra.py). checkov gets a
# virtualenv of its own: its pinned dependencies would fight the project's.
INFRA_VENV ?= .venv-infra
CHECKOV_VERSION := 3.3.30

$(INFRA_VENV)/.installed:
	$(PYTHON) -m venv $(INFRA_VENV)
	$(INFRA_VENV)/bin/python -m pip install --quiet 'checkov==$(CHECKOV_VERSION)'
	touch $@

# Terraform roots against the real provider schemas, offline (docs/infra-validation.md): one
# schema-only provider plugin per pinned provider, run from a virtualenv of its own (tf pins its
# own grpcio and protobuf, and needs Python 3.11 or newer). The Bicep against Azure's published
# type definitions (docs/bicep-type-check.md).
TFSCHEMA_PYTHON ?= $(PYTHON)
TFSCHEMA_VENV ?= .venv-tfschema

$(TFSCHEMA_VENV)/.installed:
	$(TFSCHEMA_PYTHON) -m venv $(TFSCHEMA_VENV)
	$(TFSCHEMA_VENV)/bin/python -m pip install --quiet 'tf==1.2.0' 'grpcio==1.85.3' 'protobuf==5.29.6' \
		'msgpack==1.2.4' 'cryptography==50.0.2' 'cffi==2.1.1' 'pycparser==3.12' 'typing_extensions==4.16.0'
	touch $@

tfschema-venv: $(TFSCHEMA_VENV)/.installed

infra: venv $(INFRA_VENV)/.installed $(TFSCHEMA_VENV)/.installed
	$(BIN)/python scripts/check_infra.py --checkov $(INFRA_VENV)/bin/checkov --report infra-check.json
	$(BIN)/python -m scripts.tfschema.validate --plugin-python $(TFSCHEMA_VENV)/bin/python \
		--root infra/terraform/azure --root infra/terraform/gcp
	$(BIN)/python -m scripts.bicep_types.check infra/azure

unit: venv
	$(BIN)/python -m pytest tests/unit

# The suite must not depend on the machine's speed: `make check` and the unit suite, BUSY_RUNS times
# each, beside BUSY_BURNERS processes that keep the cores busy (scripts/busy.py).
BUSY_RUNS ?= 5
BUSY_BURNERS ?= 2
check-busy: venv
	$(BIN)/python scripts/busy.py --burners $(BUSY_BURNERS) --runs $(BUSY_RUNS) -- $(MAKE) --no-print-directory check
	$(BIN)/python scripts/busy.py --burners $(BUSY_BURNERS) --runs $(BUSY_RUNS) -- $(BIN)/python -m pytest -q tests/unit

# The function apps' pinned, hashed locks: requirements/azure.in → requirements.txt (the Azure app root's),
# requirements/gcp.in → requirements/gcp.txt. Run after editing a .in file; `make locks LOCKS_ARGS=--upgrade`
# moves every pin to the newest release the .in files allow. Nothing else runs it: the locks are committed.
# pip-compile drives pip's internals, so both get a virtualenv of their own, pinned together. It runs on
# Python 3.11, the runtime of both function apps, and resolves against PyPI alone, whatever this machine's
# pip configuration adds (local wheels, other indexes, constraints), so every hash is one PyPI serves.
LOCKS_PYTHON ?= python3.11
LOCKS_VENV ?= .venv-locks
LOCKS_ARGS ?=
PIP_TOOLS_VERSION := 7.6.2
LOCKS_PIP_VERSION := 25.3
PIP_COMPILE = env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
	CUSTOM_COMPILE_COMMAND="make locks" $(LOCKS_VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
	--strip-extras --index-url=https://pypi.org/simple --no-emit-index-url --no-emit-find-links $(LOCKS_ARGS)

$(LOCKS_VENV)/.installed:
	$(LOCKS_PYTHON) -m venv $(LOCKS_VENV)
	$(LOCKS_VENV)/bin/python -m pip install --quiet 'pip==$(LOCKS_PIP_VERSION)' 'pip-tools==$(PIP_TOOLS_VERSION)'
	touch $@

locks: $(LOCKS_VENV)/.installed
	$(PIP_COMPILE) --output-file=requirements.txt requirements/azure.in
	$(PIP_COMPILE) --output-file=requirements/gcp.txt requirements/gcp.in

# The agent's locks, one per artifact: requirements/agent.in → requirements/agent.txt (jsonl and local transports),
# agent-servicebus.in → agent-servicebus.txt, agent-pubsub.in → agent-pubsub.txt. Resolved on Python 3.9, the oldest
# python3 the agent runs on, so that every pin has a release for it (markers such as tomli's are kept); the hashes
# are those of every file PyPI serves for each pin, so the same lock serves the newer Pythons and Windows.
AGENT_LOCKS_PYTHON ?= python3.9
AGENT_LOCKS_VENV ?= .venv-locks39
AGENT_PIP_COMPILE = $(subst $(LOCKS_VENV)/bin/pip-compile,$(AGENT_LOCKS_VENV)/bin/pip-compile,$(subst make locks,make agent-locks,$(PIP_COMPILE)))

$(AGENT_LOCKS_VENV)/.installed:
	$(AGENT_LOCKS_PYTHON) -m venv $(AGENT_LOCKS_VENV)
	$(AGENT_LOCKS_VENV)/bin/python -m pip install --quiet 'pip==$(LOCKS_PIP_VERSION)' 'pip-tools==$(PIP_TOOLS_VERSION)'
	touch $@

agent-locks: $(AGENT_LOCKS_VENV)/.installed
	$(AGENT_PIP_COMPILE) --output-file=requirements/agent.txt requirements/agent.in
	$(AGENT_PIP_COMPILE) --output-file=requirements/agent-servicebus.txt requirements/agent-servicebus.in
	$(AGENT_PIP_COMPILE) --output-file=requirements/agent-pubsub.txt requirements/agent-pubsub.in

# The agent's artifacts (infra/agent/README.md): dist/mbridge-agent-<bus>-<version>.pex and its .sha256, one per bus,
# from a commit (AGENT_REF, default HEAD: uncommitted changes are not in it), byte-identical from one build to the
# next. The tools are pinned in a virtualenv of their own; the wheels come from PyPI (cached by pex in ~/.cache/pex).
AGENT_BUILD_VENV ?= .venv-agent-build
PEX_VERSION := 2.105.2
AGENT_SETUPTOOLS_VERSION := 80.9.0
AGENT_REF ?= HEAD
AGENT_BUS ?= all

$(AGENT_BUILD_VENV)/.installed:
	$(PYTHON) -m venv $(AGENT_BUILD_VENV)
	env PIP_CONFIG_FILE=/dev/null $(AGENT_BUILD_VENV)/bin/python -m pip install --quiet \
		'pex==$(PEX_VERSION)' 'setuptools==$(AGENT_SETUPTOOLS_VERSION)'
	touch $@

agent-build-venv: $(AGENT_BUILD_VENV)/.installed

agent-artifact: $(AGENT_BUILD_VENV)/.installed
	$(AGENT_BUILD_VENV)/bin/python -m scripts.agent_artifact.build --bus $(AGENT_BUS) --ref $(AGENT_REF) --out dist

# The figures of docs/performance.md (about 25 minutes on 2 cores), or a quick pass (about 4 minutes).
# Azurite comes from npm, as in CI; without it its throughput figure is reported as missing.
bench: venv
	$(BIN)/python -m bench --out bench/results/full.json

bench-quick: venv
	$(BIN)/python -m bench --quick --out bench/results/quick.json

# The agent and functions/core on the oldest python3 they support (VM images), with the
# embedded transports. (The function apps, their package and locks, and bench/ run on 3.11 and are left out.) The cloud SDKs are left out: pip cannot settle their 3.9 releases in a
# reasonable time, and the transport modules are plain 3.9 syntax checked by ruff and mypy.
# The telemetry adapter's tests need the OpenTelemetry SDK, a function-app dependency (3.10+), and so do those of the
# agent's span export (the agent-otel extra; tests/unit/agent/test_otlp_endpoint.py, which needs none, runs here).
PYTHON39 ?= python3.9
compat39:
	$(PYTHON39) -m venv .venv39
	.venv39/bin/python -m pip install --quiet pytest pytest-timeout requests jsonschema pyyaml cryptography asn1crypto google-auth \
		prometheus-client
	# the project itself, without its dependencies, so that its version is read as on a VM
	.venv39/bin/python -m pip install --quiet --no-deps -e .
	.venv39/bin/python -m pytest -p no:cacheprovider tests/unit tests/contract/simulator tests/contract/agent \
		tests/contract/test_commands_against_simulator.py --ignore=tests/unit/transports --ignore=tests/unit/azure \
		--ignore=tests/unit/gcp --ignore=tests/unit/test_build_function_package.py \
		--ignore=tests/unit/test_function_requirements.py --ignore=tests/unit/test_extras.py \
		--ignore=tests/unit/bench --ignore=tests/unit/functions/test_telemetry.py \
		--ignore=tests/unit/functions/test_telemetry_entry_points.py --ignore=tests/unit/agent/test_otel.py -k "not pubsub"

clean:
	rm -rf $(VENV) $(DEMO_VENV) .venv39 $(INFRA_VENV) $(TFSCHEMA_VENV) .tfschema-cache $(LOCKS_VENV) $(AGENT_LOCKS_VENV) $(AGENT_BUILD_VENV) .pytest_cache .mypy_cache .ruff_cache infra-check.json
