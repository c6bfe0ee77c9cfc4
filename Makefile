# The two commands of the README: `make demo` and `make test`. Both set up first (idempotent).
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp

.PHONY: setup demo test test-fast lint synth clean

setup: $(STAMP)

$(STAMP): pyproject.toml package.json package-lock.json scripts/setup_env.sh
	bash scripts/setup_env.sh
	touch $(STAMP)

demo: setup
	$(BIN)/nvrx-eks demo

test: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup

# Unit tests only (skips multi-process distributed runs).
test-fast: setup
	$(BIN)/python -m pytest -m "not slow" -n 2 --dist loadgroup

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The CDK CLI's own synth, offline; a missing context value fails instead of using dummies.
synth: setup
	CDK_DISABLE_VERSION_CHECK=1 CDK_DISABLE_CLI_TELEMETRY=true JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 \
	  PATH=$(abspath $(BIN)):$$PATH ./node_modules/.bin/cdk synth --no-lookups --no-notices --quiet $(if $(PROFILE),-c profile=$(PROFILE))

clean:
	rm -rf cdk.out .pytest_cache
