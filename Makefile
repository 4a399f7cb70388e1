# Two entry points a fresh machine needs: `make demo` and `make test`.
# Both build .venv on first use (and again when pyproject.toml changes).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test check lint infra unit venv compat39 bench bench-quick clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,azure,gcp]'
	touch $@

# The local end-to-end demo on the embedded defaults.
demo: venv
	$(BIN)/mbridge demo --report demo-report.html

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
	$(BIN)/mypy --python-version 3.11 functions mbridge tests scripts bench function_app.py main.py
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

infra: venv $(INFRA_VENV)/.installed
	$(BIN)/python scripts/check_infra.py --checkov $(INFRA_VENV)/bin/checkov --report infra-check.json

unit: venv
	$(BIN)/python -m pytest tests/unit

# The figures of docs/performance.md (about 13 minutes on 2 cores), or a quick pass (under 3 minutes).
# Azurite comes from npm, as in CI; without it its throughput figure is reported as missing.
bench: venv
	$(BIN)/python -m bench --out bench/results/full.json

bench-quick: venv
	$(BIN)/python -m bench --quick --out bench/results/quick.json

# The agent and functions/core on the oldest python3 they support (VM images), with the
# embedded transports. (The function apps, their package and bench/ run on 3.11 and are left out.) The cloud SDKs are left out: pip cannot settle their 3.9 releases in a
# reasonable time, and the transport modules are plain 3.9 syntax checked by ruff and mypy.
PYTHON39 ?= python3.9
compat39:
	$(PYTHON39) -m venv .venv39
	.venv39/bin/python -m pip install --quiet pytest pytest-timeout requests jsonschema pyyaml cryptography asn1crypto google-auth
	.venv39/bin/python -m pytest -p no:cacheprovider tests/unit tests/contract/simulator tests/contract/agent \
		tests/contract/test_commands_against_simulator.py --ignore=tests/unit/transports --ignore=tests/unit/azure \
		--ignore=tests/unit/gcp --ignore=tests/unit/test_build_function_package.py --ignore=tests/unit/bench -k "not pubsub"

clean:
	rm -rf $(VENV) .venv39 $(INFRA_VENV) .pytest_cache .mypy_cache .ruff_cache infra-check.json
